"""Listening for new tasks (``LISTEN roost_tasks``, fed by the v0005 trigger).

The listener holds its own connection, never a pooled one: a LISTEN belongs to a
session. Losing it costs only latency (the controller still ticks every interval), so
a failure to listen is reported to the caller, not raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import asyncpg

CHANNEL = "roost_tasks"
log = logging.getLogger("roost.store.notify")


class TaskListener:
    def __init__(self, conn: Any) -> None:
        self._conn = conn

    async def close(self) -> None:
        if not self._conn.is_closed():
            await self._conn.close()


async def listen_tasks(dsn: str, on_pool: Callable[[str], None], *,
                       timeout: float = 5.0) -> TaskListener | None:
    """Call ``on_pool(pool_id)`` whenever tasks are inserted for a pool; None if the
    listener could not be set up (logged)."""
    try:
        conn = await asyncpg.connect(dsn, timeout=timeout)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        log.warning("not listening for new tasks (idle pools wake on the next tick): %s",
                    exc or type(exc).__name__)
        return None

    def forward(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
        on_pool(payload)

    await conn.add_listener(CHANNEL, forward)
    return TaskListener(conn)
