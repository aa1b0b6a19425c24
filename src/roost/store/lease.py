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

from dataclasses import dataclass
from typing import Any

import asyncpg

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


@dataclass(frozen=True, slots=True)
class Session:
    """Another server session, as ``pg_stat_activity`` shows it."""

    pid: int
    application_name: str
    state: str
    quiet: float
    """Seconds since its state last changed (how long it has been idle, say)."""
    xact_age: float | None

    def describe(self) -> str:
        name = self.application_name or "no application_name"
        xact = "" if self.xact_age is None else f", in a transaction for {self.xact_age:.1f}s"
        return f"pid {self.pid} ({name}, {self.state or 'state hidden'} for " \
               f"{self.quiet:.1f}s{xact})"


_SESSION_COLUMNS = (
    "a.pid, coalesce(a.application_name, '') AS app, coalesce(a.state, '') AS state, "
    "coalesce(extract(epoch FROM clock_timestamp() - a.state_change), 0)::float8 AS quiet, "
    "extract(epoch FROM clock_timestamp() - a.xact_start)::float8 AS xact_age"
)


def _session(row: Any) -> Session:
    age = row["xact_age"]
    return Session(int(row["pid"]), str(row["app"]), str(row["state"]), float(row["quiet"]),
                   None if age is None else float(age))


async def lock_holder(conn: Any, *, timeout: float | None = None) -> Session | None:
    """The session holding the leader lock, if another one does: what a follower reports
    while it follows, and how it notices a leader that has gone silent."""
    row = await conn.fetchrow(
        f"SELECT {_SESSION_COLUMNS} FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.classid = $1 AND l.objid = $2 "
        "AND l.objsubid = 2 AND l.granted AND l.pid <> pg_backend_pid()",
        *LOCK_KEY, timeout=timeout,
    )
    return None if row is None else _session(row)


async def lease_row_lockers(conn: Any, *, timeout: float | None = None) -> list[Session]:
    """Other sessions whose open transaction holds a lock on ``leader_lease`` that can
    block the epoch bump: a fenced write's ``FOR SHARE`` (RowShareLock), an UPDATE, a
    LOCK TABLE. A plain SELECT (AccessShareLock) blocks nothing and is left out."""
    rows = await conn.fetch(
        f"SELECT DISTINCT {_SESSION_COLUMNS} FROM pg_locks l "
        "JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'relation' AND l.relation = 'leader_lease'::regclass "
        "AND l.granted AND l.mode <> 'AccessShareLock' AND l.pid <> pg_backend_pid()",
        timeout=timeout,
    )
    return [_session(r) for r in rows]


class LeaseRowBlocked(Exception):
    """The epoch bump could not take the lease row: sessions this role may not end
    hold it."""

    def __init__(self, blockers: list[Session]) -> None:
        who = "; ".join(s.describe() for s in blockers) or "a session that is gone now"
        super().__init__(f"the lease row is locked by {who}, which this role may not "
                         "terminate (grant it pg_signal_backend, or end that session)")
        self.blockers = blockers


async def bump_epoch(conn: Any, holder: str, *, lock_wait: float = 1.0) -> int:
    """Start a new leadership: the epoch every write of this leader will carry.

    Call holding the leader lock. A fenced write of the previous leader may still hold
    the lease row (``FOR SHARE``); its leadership is over, so after ``lock_wait`` its
    session is terminated and its write aborts, which is what fencing promises anyway.
    Nothing can keep the lead from passing: either the blockers go, or `LeaseRowBlocked`
    says which sessions stand in the way.
    """
    for attempt in range(3):
        try:
            async with conn.transaction():
                await conn.execute(f"SET LOCAL lock_timeout = {max(1, int(lock_wait * 1000))}")
                epoch = await conn.fetchval(
                    "INSERT INTO leader_lease (name, epoch, holder, acquired_at) "
                    "VALUES ($1, 1, $2, now()) "
                    "ON CONFLICT (name) DO UPDATE SET epoch = leader_lease.epoch + 1, "
                    "holder = EXCLUDED.holder, acquired_at = now() "
                    "RETURNING epoch",
                    LEASE_NAME, holder,
                )
            return int(epoch)
        except asyncpg.LockNotAvailableError:
            blockers = await lease_row_lockers(conn)
            stuck = [s for s in blockers if not await _terminate(conn, s)]
            if stuck or attempt == 2:
                raise LeaseRowBlocked(stuck or blockers) from None
    raise AssertionError("unreachable")


async def _terminate(conn: Any, session: Session) -> bool:
    """End ``session`` (waiting up to a second for it to go); False if not allowed."""
    try:
        await conn.fetchval("SELECT pg_terminate_backend($1, 1000)", session.pid)
    except asyncpg.InsufficientPrivilegeError:
        return False
    return True


async def current(conn: Any, *, timeout: float | None = None) -> tuple[int, str] | None:
    """(epoch, holder) of the latest leadership, or None before the first one."""
    row = await conn.fetchrow(
        "SELECT epoch, holder FROM leader_lease WHERE name = $1", LEASE_NAME, timeout=timeout
    )
    return None if row is None else (int(row["epoch"]), str(row["holder"]))
