"""The controller's leader lease: the advisory lock and the fencing epoch.

The advisory lock says who leads *now*; it lives and dies with one session. The epoch
in ``leader_lease`` says which leadership a write belongs to: every new leader bumps it,
and every controller write checks it (see `roost.store.fenced`), so a leader that lost
its session but not yet its illusions cannot write.

These queries run on the leader's dedicated connection. Advisory locks are
session-scoped: through a pool or a transaction-mode pooler the lock would stay with
whichever backend ran the call.
"""

from __future__ import annotations

from typing import Any

LEASE_NAME = "controller"
LOCK_KEY = (0x726F6F73, 4)
"""``pg_try_advisory_lock(int, int)`` key: 'roos' and the controller's number. Shows in
pg_locks as classid/objid with objsubid 2."""


async def try_lock(conn: Any) -> bool:
    """Take the leader lock if free. Call once per session: each success stacks another
    hold on the same lock, and one unlock would then not release it."""
    return bool(await conn.fetchval("SELECT pg_try_advisory_lock($1, $2)", *LOCK_KEY))


async def holds_lock(conn: Any, *, timeout: float | None = None) -> bool:
    """Whether this session still holds the lock: the leader's keep-alive."""
    held = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' "
        "AND pid = pg_backend_pid() AND classid = $1 AND objid = $2 AND objsubid = 2 "
        "AND granted)",
        *LOCK_KEY, timeout=timeout,
    )
    return bool(held)


async def bump_epoch(conn: Any, holder: str) -> int:
    """Start a new leadership: the epoch every write of this leader will carry."""
    epoch = await conn.fetchval(
        "INSERT INTO leader_lease (name, epoch, holder, acquired_at) "
        "VALUES ($1, 1, $2, now()) "
        "ON CONFLICT (name) DO UPDATE SET epoch = leader_lease.epoch + 1, "
        "holder = EXCLUDED.holder, acquired_at = now() "
        "RETURNING epoch",
        LEASE_NAME, holder,
    )
    return int(epoch)


async def current(conn: Any, *, timeout: float | None = None) -> tuple[int, str] | None:
    """(epoch, holder) of the latest leadership, or None before the first one."""
    row = await conn.fetchrow(
        "SELECT epoch, holder FROM leader_lease WHERE name = $1", LEASE_NAME, timeout=timeout
    )
    return None if row is None else (int(row["epoch"]), str(row["holder"]))
