"""The controller's writes, each fenced by the leader epoch.

Every function opens a transaction that first takes a share lock on the lease row *and*
checks its epoch, then writes. A new leader bumps the epoch with an UPDATE of that row,
which waits for any fenced write in flight, so a deposed leader's write either commits
before the new leadership begins or fails with `StaleEpoch`. There is no window in
between. The wait is bounded: the controller's sessions end any transaction after half a
lease (`roost.store.session`), and the new leader terminates whatever still holds the
row after a short lock wait (`roost.store.lease.bump_epoch`).

The worker runtime must claim tasks only while its row says ``status = 'active'`` and
with that row locked, so a claim and a drain mark serialize: once `mark_draining`
commits, the worker takes no new task.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from roost.store.errors import StaleEpoch
from roost.store.lease import LEASE_NAME
from roost.store.timeconv import to_ts


async def _check(conn: Any, epoch: int) -> None:
    current = await conn.fetchval(
        "SELECT epoch FROM leader_lease WHERE name = $1 FOR SHARE", LEASE_NAME
    )
    if current != epoch:
        raise StaleEpoch(epoch, None if current is None else int(current))


@dataclass(frozen=True, slots=True)
class DesiredRow:
    pool_id: str
    desired: int | None
    current: int | None
    raw_desired: int | None
    reason: str
    frozen_reason: str | None
    startup: float | None = None
    """The leader's estimate of the pool's replica start-up time, seconds (None: none
    yet): a new leader starts from it (docs/architecture.md)."""
    startup_revision: str | None = None
    """The pool's ``expected_revision`` when ``startup`` was published."""


async def publish_desired(
    db: Any, epoch: int, rows: Sequence[DesiredRow], *, now: float, valid_until: float
) -> None:
    """Publish every pool's desired capacity in one transaction, valid until
    ``valid_until``: a reader that finds it expired knows the leader has stopped."""
    async with db.acquire() as conn, conn.transaction():
        await _check(conn, epoch)
        await conn.executemany(
            "INSERT INTO desired_capacity AS d (pool_id, desired, current, raw_desired, "
            "reason, frozen_reason, valid_until, leader_epoch, published_at, "
            "startup_seconds, startup_revision) "
            "SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11 "
            "WHERE EXISTS (SELECT 1 FROM worker_pools WHERE id = $1) "
            "ON CONFLICT (pool_id) DO UPDATE SET desired = EXCLUDED.desired, "
            "current = EXCLUDED.current, raw_desired = EXCLUDED.raw_desired, "
            "reason = EXCLUDED.reason, frozen_reason = EXCLUDED.frozen_reason, "
            "valid_until = EXCLUDED.valid_until, leader_epoch = EXCLUDED.leader_epoch, "
            "published_at = EXCLUDED.published_at, "
            "startup_seconds = EXCLUDED.startup_seconds, "
            "startup_revision = EXCLUDED.startup_revision",
            [
                (r.pool_id, r.desired, r.current, r.raw_desired, r.reason, r.frozen_reason,
                 to_ts(valid_until), epoch, to_ts(now), r.startup, r.startup_revision)
                for r in rows
            ],
        )


async def mark_draining(db: Any, epoch: int, pool_id: str, worker_id: str, *,
                        now: float) -> bool:
    """Active -> draining. False if the worker is no longer active (gone, or already
    draining): the plan was made on an older read and this tick skips it.

    ``draining_since`` is compared with ``heartbeat_at``, which the worker writes from
    the *database's* clock: only a heartbeat at or after the mark may prove the worker
    empty. The controller's ``now`` alone is not enough: were its clock behind the
    database's, a heartbeat from before the mark (after which the worker could still
    claim a task) would look newer than the mark. So the mark is at least one
    microsecond after the row's last heartbeat, read under the row lock this UPDATE
    takes, which orders it against the worker's heartbeats and claims: every heartbeat
    before the mark is older than it, whatever either clock says. ``now`` still keeps it
    on the controller's clock for the drain timeout (``now - draining_since``); a
    controller clock *ahead* of the database's only delays the removal by the skew.
    """
    async with db.acquire() as conn, conn.transaction():
        await _check(conn, epoch)
        done = await conn.fetchval(
            "UPDATE workers SET status = 'draining', "
            "draining_since = greatest($3::timestamptz, "
            "                          heartbeat_at + interval '1 microsecond'), "
            "removal_target = NULL, status_epoch = $4 "
            "WHERE id = $1 AND pool_id = $2 AND status = 'active' RETURNING true",
            worker_id, pool_id, to_ts(now), epoch,
        )
    return bool(done)


async def reactivate(db: Any, epoch: int, pool_id: str, worker_id: str) -> bool:
    """Draining -> active, unless a removal was committed (its instance may be going)."""
    async with db.acquire() as conn, conn.transaction():
        await _check(conn, epoch)
        done = await conn.fetchval(
            "UPDATE workers SET status = 'active', draining_since = NULL, status_epoch = $3 "
            "WHERE id = $1 AND pool_id = $2 AND status = 'draining' "
            "AND removal_target IS NULL RETURNING true",
            worker_id, pool_id, epoch,
        )
    return bool(done)


async def commit_removal(db: Any, epoch: int, pool_id: str, worker_id: str,
                         target: int) -> bool:
    """Record that this worker's replica is being removed and the count asked for, so
    a leader that takes over mid-way finishes the same removal instead of starting
    another. Re-checks in SQL that the worker is still empty."""
    async with db.acquire() as conn, conn.transaction():
        await _check(conn, epoch)
        done = await conn.fetchval(
            "UPDATE workers SET removal_target = $3, status_epoch = $4 "
            "WHERE id = $1 AND pool_id = $2 AND status = 'draining' "
            "AND running_tasks = 0 AND active_leases = 0 "
            "AND (removal_target IS NULL OR removal_target = $3) RETURNING true",
            worker_id, pool_id, target, epoch,
        )
    return bool(done)


async def commit_removals(db: Any, epoch: int, pool_id: str, worker_ids: list[str],
                          target: int) -> bool:
    """`commit_removal` for a batch, all or none: one replica count for k drained
    workers. Were only some committed, a leader finishing the removal would ask for a
    count that takes a worker that was not drained."""
    try:
        async with db.acquire() as conn, conn.transaction():
            await _check(conn, epoch)
            done = await conn.fetch(
                "UPDATE workers SET removal_target = $3, status_epoch = $4 "
                "WHERE id = ANY($1::text[]) AND pool_id = $2 AND status = 'draining' "
                "AND running_tasks = 0 AND active_leases = 0 "
                "AND (removal_target IS NULL OR removal_target = $3) RETURNING id",
                worker_ids, pool_id, target, epoch,
            )
            if len(done) != len(set(worker_ids)):
                raise _Rollback
    except _Rollback:
        return False
    return True


class _Rollback(Exception):
    """Undo a batch commit that did not cover every worker."""


async def mark_gone(db: Any, epoch: int, pool_id: str, worker_id: str) -> bool:
    async with db.acquire() as conn, conn.transaction():
        await _check(conn, epoch)
        done = await conn.fetchval(
            "UPDATE workers SET status = 'gone', status_epoch = $3 "
            "WHERE id = $1 AND pool_id = $2 AND status = 'draining' RETURNING true",
            worker_id, pool_id, epoch,
        )
    return bool(done)
