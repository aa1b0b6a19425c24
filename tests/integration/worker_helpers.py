"""Helpers for worker runtime tests (no tests here): short leases, background workers
that are always stopped, and polling with a deadline."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from roost.store import pools as pools_q
from roost.worker import ExitReason, Worker, WorkerConfig
from tests.integration.test_controller_helpers import open_db, pool_spec
from tests.polling import until

FAST = dict(concurrency=1, lease=1.0, heartbeat_interval=0.2, poll_interval=0.05,
            retry_backoff=0.05, retry_backoff_max=0.2, revision="r1")


def config(dsn: str, **kw: Any) -> WorkerConfig:
    return WorkerConfig(dsn=dsn, pool=kw.pop("pool", "p"), **{**FAST, **kw})


async def open_pool_db(dsn: str, *pools: str) -> Any:
    db = await open_db(dsn)
    for pid in pools or ("p",):
        await pools_q.create_pool(db, pool_spec(pid))
    return db


async def eventually(check: Callable[[], Awaitable[bool]] | Callable[[], bool], *,
                     timeout: float = 10.0, every: float = 0.02, what: str = "") -> None:
    """``tests.polling.until``, by the keywords these tests call it with."""
    await until(what or repr(check), check, timeout, every)


@contextlib.asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[asyncio.Task[ExitReason]]:
    """Run ``worker`` in the background until the block ends; then drain it (abort if
    that takes more than a few seconds)."""
    task = asyncio.create_task(worker.run())
    registered = asyncio.create_task(worker.registered.wait())
    await asyncio.wait({task, registered}, return_when=asyncio.FIRST_COMPLETED)
    registered.cancel()
    if task.done():
        task.result()  # raise why it could not start
    try:
        yield task
    finally:
        if not task.done():
            worker.stop()
            done, _ = await asyncio.wait({task}, timeout=5)
            if not done:
                worker.stop()
        await asyncio.wait_for(asyncio.shield(task), 10)


async def task_row(db: Any, task_id: int) -> dict[str, Any]:
    row = await db.fetchrow("SELECT * FROM tasks WHERE id = $1", task_id)
    assert row is not None
    return dict(row)


async def worker_row(db: Any, worker_id: str) -> dict[str, Any]:
    row = await db.fetchrow("SELECT * FROM workers WHERE id = $1", worker_id)
    assert row is not None
    return dict(row)
