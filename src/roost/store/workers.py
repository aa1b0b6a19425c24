"""A worker's own row in ``workers``: register, heartbeat, leave.

The worker runtime writes its heartbeat, running tasks, active leases and revision; the
controller writes ``status``, ``draining_since`` and ``removal_target`` (fenced, in
`roost.store.fenced`). The one status a worker writes itself is ``gone``, when it exits
(see `leave`).

The heartbeat locks the row first, so it is ordered against the worker's own claims
(which share-lock it) and against the controller's drain mark: a heartbeat that
commits after the mark counts every task claimed before it. That is what lets the
controller trust "0 running, 0 leases, reported after the mark".
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg

from roost.decide.snapshot import WorkerStatus
from roost.store.errors import PoolNotFound, StoreError
from roost.store.tasks import extend_leases, transaction

MAX_SLOTS = 2**31 - 1
"""The most tasks a worker may run at once: ``workers.slots`` is a Postgres integer."""


class WorkerExists(StoreError):
    def __init__(self, worker_id: str) -> None:
        super().__init__(f"a worker {worker_id!r} is already registered")
        self.worker_id = worker_id


async def register(db: Any, worker_id: str, *, pool_id: str, revision: str,
                   instance_ref: str, slots: int | None = None) -> None:
    """Add the worker's row; ``slots`` is the tasks it runs at once (its concurrency),
    which the plan reads to count the queue its target allows (`roost.decide.demand`)."""
    try:
        await db.execute(
            "INSERT INTO workers (id, pool_id, revision, instance_ref, slots, heartbeat_at) "
            "VALUES ($1, $2, $3, $4, $5, clock_timestamp())",
            worker_id, pool_id, revision, instance_ref, slots,
        )
    except asyncpg.ForeignKeyViolationError:
        raise PoolNotFound(pool_id) from None
    except asyncpg.UniqueViolationError:
        raise WorkerExists(worker_id) from None


@dataclass(frozen=True, slots=True)
class Beat:
    status: WorkerStatus | None
    """What the controller says this worker should be; None if its row is gone."""
    removal_committed: bool
    """The controller has committed to removing this worker's replica."""
    renewed: frozenset[int]
    """Held tasks whose lease this beat renewed; the others were lost."""
    active_leases: int


async def heartbeat(db: Any, worker_id: str, *, held: Mapping[int, uuid.UUID],
                    running: int, lease: float) -> Beat:
    """Renew the leases of ``held`` and report ``running`` tasks in progress and the
    leases this worker holds (counted in the database, so a claim committed a moment
    ago is in it even if the worker has not seen its reply yet)."""
    async with transaction(db) as conn:
        row = await conn.fetchrow(
            "SELECT status, removal_target FROM workers WHERE id = $1 FOR UPDATE", worker_id
        )
        if row is None:
            return Beat(None, False, frozenset(), 0)
        renewed = await extend_leases(conn, held, lease=lease)
        leases = await conn.fetchval(
            "SELECT count(*) FROM tasks WHERE worker_id = $1 AND status = 'running'", worker_id
        )
        await conn.execute(
            "UPDATE workers SET heartbeat_at = clock_timestamp(), running_tasks = $2, "
            "active_leases = $3 WHERE id = $1",
            worker_id, running, leases,
        )
    return Beat(WorkerStatus(row["status"]), row["removal_target"] is not None,
                frozenset(renewed), int(leases))


async def leave(db: Any, worker_id: str) -> None:
    """A worker exiting: ``gone``, so the controller stops counting it at once instead
    of waiting out its heartbeat. Leases it still holds (an aborted drain) stay counted
    until they expire. A removal the controller has committed keeps its status: the
    controller closes that record itself."""
    await db.execute(
        "UPDATE workers SET running_tasks = 0, heartbeat_at = clock_timestamp(), "
        "active_leases = (SELECT count(*) FROM tasks "
        "                 WHERE worker_id = $1 AND status = 'running'), "
        "status = CASE WHEN removal_target IS NULL THEN 'gone' ELSE status END "
        "WHERE id = $1",
        worker_id,
    )
