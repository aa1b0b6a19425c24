"""The task queue in Postgres: submit, claim under a lease, extend, settle, reap.

What keeps a task to one runner per live lease:

- **Claim.** Ready tasks are taken with ``FOR UPDATE SKIP LOCKED``, so concurrent
  claimers never wait on, or take, the same row. A claim sets a fresh execution
  ``token`` and ``lease_expires_at`` by the database's clock, so leases do not depend on
  any worker's clock. It runs only while the claiming worker's row is ``active``, with
  that row share-locked, so a claim and the controller's drain mark serialize.
- **Settle.** Complete and fail match ``(id, token, status = 'running')``. Any other
  token is rejected (`TokenRejected`): a worker whose lease was reaped cannot settle a
  task that another worker now holds.
- **Lost replies.** The token stays on the row after a settle. A worker that could not
  tell whether its completion committed (the connection dropped mid-commit) asks again
  with the same token and is told `Settlement.already`. Until it does, the row stays
  ``running`` under its lease, and nothing but lease expiry takes a running task from
  its holder: there is no duplicate assignment inside a live lease.
- **Reap.** A running task whose lease has expired goes back to ``queued`` with its
  token cleared, or to ``failed`` once it has used its attempts.

Errors (all `roost.store.errors.StoreError`):

StoreError
 ├── PoolNotFound          submit to a pool that does not exist (from roost.store.errors)
 ├── TaskNotFound          no task with that id
 ├── IdempotencyConflict   an idempotency key reused with a different payload
 ├── TokenRejected         settle with a token that is not the task's current one
 └── WorkerNotActive       claim by a worker whose row is draining, gone or missing
"""

from __future__ import annotations

import contextlib
import enum
import json
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg

from roost.store.errors import PoolNotFound, StoreError
from roost.store.timeconv import from_ts

DEFAULT_MAX_ATTEMPTS = 3


class TaskNotFound(StoreError):
    def __init__(self, task_id: int | str) -> None:
        super().__init__(f"no task {task_id}")
        self.task_id = task_id


class IdempotencyConflict(StoreError):
    def __init__(self, pool_id: str, key: str, task_id: str) -> None:
        super().__init__(
            f"idempotency key {key!r} of pool {pool_id!r} belongs to task {task_id}, "
            "submitted with a different payload")
        self.task_id = task_id


class TokenRejected(StoreError):
    def __init__(self, task_id: int, why: str) -> None:
        super().__init__(f"task {task_id}: token rejected ({why})")
        self.task_id = task_id
        self.why = why


class WorkerNotActive(StoreError):
    def __init__(self, worker_id: str, status: str | None) -> None:
        super().__init__(f"worker {worker_id!r} is {status or 'not registered'}: it takes no task")
        self.worker_id = worker_id
        self.status = status


class TaskStatus(enum.StrEnum):
    QUEUED = "queued"  # waiting, possibly for its backoff (run_after)
    RUNNING = "running"  # held under a lease by one worker
    DONE = "done"  # completed with a result
    FAILED = "failed"  # out of attempts, or failed permanently


TRANSITIONS: Mapping[TaskStatus, frozenset[TaskStatus]] = {
    TaskStatus.QUEUED: frozenset({
        TaskStatus.RUNNING,  # claim: fresh token, lease, attempts + 1
    }),
    TaskStatus.RUNNING: frozenset({
        TaskStatus.DONE,  # complete with the current token
        TaskStatus.QUEUED,  # fail with retry and attempts left (after a backoff), or reap
        TaskStatus.FAILED,  # fail permanently, out of attempts, or reaped on the last one
    }),
    TaskStatus.DONE: frozenset(),  # final; the token stays to answer a repeated complete
    TaskStatus.FAILED: frozenset(),  # final; likewise for a repeated fail
}
"""The moves the statements below make, each guarded in SQL by the status it leaves."""


@dataclass(frozen=True, slots=True)
class Task:
    task_id: int
    public_id: str
    """What the task API shows: random, so ids cannot be enumerated."""
    pool_id: str
    status: TaskStatus
    payload: Any
    attempts: int
    max_attempts: int
    result: Any
    error: str | None
    idempotency_key: str | None
    created_at: float
    finished_at: float | None


@dataclass(frozen=True, slots=True)
class Submitted:
    task_id: int
    created: bool
    """False when the idempotency key named an existing task, which is returned."""
    public_id: str = ""


@dataclass(frozen=True, slots=True)
class Claim:
    task_id: int
    token: uuid.UUID
    payload: Any
    attempt: int
    """1 for the first run; counts lease expiries too."""
    max_attempts: int


@dataclass(frozen=True, slots=True)
class Settlement:
    status: TaskStatus
    """Where the task went: done, failed, or queued again for a retry."""
    already: bool = False
    """An earlier call with the same token had committed it (its reply was lost)."""


@contextlib.asynccontextmanager
async def transaction(db: Any) -> AsyncIterator[Any]:
    """A transaction on a connection, or on one taken from a pool."""
    if isinstance(db, asyncpg.Pool):
        async with db.acquire() as conn, conn.transaction():
            yield conn
    else:
        async with db.transaction():
            yield db


def encode(value: Any) -> str:
    """JSON text for a jsonb parameter. Strict: NaN and infinities are not JSON."""
    return json.dumps(value, allow_nan=False, separators=(",", ":"))


def _decode(text: str | None) -> Any:
    return None if text is None else json.loads(text)


# ---- producers ---------------------------------------------------------------------


async def submit(db: Any, pool_id: str, payload: Any, *, idempotency_key: str | None = None,
                 max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> Submitted:
    """Queue a task. A key already used in this pool returns that task, if it was
    submitted with the same payload, and raises `IdempotencyConflict` otherwise."""
    body = encode(payload)
    for _ in range(2):  # once more if the key's task went in between (see below)
        try:
            new = await db.fetchrow(
                "INSERT INTO tasks (pool_id, payload, idempotency_key, max_attempts) "
                "VALUES ($1, $2::jsonb, $3, $4) "
                "ON CONFLICT (pool_id, idempotency_key) DO NOTHING RETURNING id, public_id",
                pool_id, body, idempotency_key, max_attempts,
            )
        except asyncpg.ForeignKeyViolationError:
            raise PoolNotFound(pool_id) from None
        if new is not None:
            return Submitted(int(new["id"]), created=True, public_id=str(new["public_id"]))
        # The key exists. ON CONFLICT waited for a concurrent insert of it to commit, and
        # this statement's snapshot is newer, so the row is visible here, unless it was
        # deleted in between: past its retention (the key is free again: insert it), or
        # with its pool (the insert then finds no pool).
        row = await db.fetchrow(
            "SELECT id, public_id, payload = $3::jsonb AS same FROM tasks "
            "WHERE pool_id = $1 AND idempotency_key = $2",
            pool_id, idempotency_key, body,
        )
        if row is not None:
            break
    if row is None:
        raise PoolNotFound(pool_id)
    if not row["same"]:
        assert idempotency_key is not None
        raise IdempotencyConflict(pool_id, idempotency_key, str(row["public_id"]))
    return Submitted(int(row["id"]), created=False, public_id=str(row["public_id"]))


_TASK_COLUMNS = (
    "SELECT id, public_id, pool_id, status, payload::text AS payload, attempts, "
    "max_attempts, result::text AS result, error, idempotency_key, created_at, finished_at "
    "FROM tasks "
)


async def get_task(db: Any, task_id: int | str) -> Task:
    """A task by its internal id (an int) or its public one (``t-…``)."""
    column = "public_id" if isinstance(task_id, str) else "id"
    row = await db.fetchrow(_TASK_COLUMNS + f"WHERE {column} = $1", task_id)
    if row is None:
        raise TaskNotFound(task_id)
    return Task(
        task_id=int(row["id"]),
        public_id=str(row["public_id"]),
        pool_id=str(row["pool_id"]),
        status=TaskStatus(row["status"]),
        payload=_decode(row["payload"]),
        attempts=int(row["attempts"]),
        max_attempts=int(row["max_attempts"]),
        result=_decode(row["result"]),
        error=row["error"],
        idempotency_key=row["idempotency_key"],
        created_at=float(row["created_at"].timestamp()),
        finished_at=from_ts(row["finished_at"]),
    )


# ---- workers -----------------------------------------------------------------------

_CLAIM = """
WITH ready AS (
    SELECT id FROM tasks
    WHERE pool_id = $1 AND status = 'queued' AND run_after <= now()
    ORDER BY id
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE tasks t
SET status = 'running', worker_id = $2, token = gen_random_uuid(),
    attempts = t.attempts + 1, lease_expires_at = now() + make_interval(secs => $4),
    started_at = now(), updated_at = now()
FROM ready WHERE t.id = ready.id
RETURNING t.id, t.token, t.payload::text AS payload, t.attempts, t.max_attempts
"""


async def claim(db: Any, pool_id: str, worker_id: str, *, limit: int,
                lease: float) -> list[Claim]:
    """Take up to ``limit`` ready tasks for ``lease`` seconds, oldest first."""
    async with transaction(db) as conn:
        status = await conn.fetchval(
            "SELECT status FROM workers WHERE id = $1 AND pool_id = $2 FOR SHARE",
            worker_id, pool_id,
        )
        if status != "active":
            raise WorkerNotActive(worker_id, status)
        rows = await conn.fetch(_CLAIM, pool_id, worker_id, limit, float(lease))
    return sorted(
        (Claim(int(r["id"]), uuid.UUID(str(r["token"])), _decode(r["payload"]),
               int(r["attempts"]), int(r["max_attempts"])) for r in rows),
        key=lambda c: c.task_id,
    )


async def extend_leases(db: Any, held: Mapping[int, uuid.UUID], *, lease: float) -> set[int]:
    """Renew the leases of the tasks held under these tokens; return the ids renewed.
    A task missing from the answer was reaped or re-claimed: its holder lost it."""
    if not held:
        return set()
    rows = await db.fetch(
        "UPDATE tasks t SET lease_expires_at = now() + make_interval(secs => $3), "
        "updated_at = now() "
        "FROM unnest($1::bigint[], $2::uuid[]) AS h(id, token) "
        "WHERE t.id = h.id AND t.token = h.token AND t.status = 'running' RETURNING t.id",
        list(held), list(held.values()), float(lease),
    )
    return {int(r["id"]) for r in rows}


async def _rejected(db: Any, task_id: int, token: uuid.UUID,
                    settled: tuple[str, ...]) -> Settlement:
    """Why a settle matched nothing: our own earlier commit, or a token that lost."""
    row = await db.fetchrow("SELECT status, token FROM tasks WHERE id = $1", task_id)
    if row is None:
        raise TaskNotFound(task_id)
    status = str(row["status"])
    if row["token"] is None:
        raise TokenRejected(task_id, f"its lease expired; the task is {status} now")
    if uuid.UUID(str(row["token"])) == token:
        if status in settled:
            return Settlement(TaskStatus(status), already=True)
        raise TokenRejected(task_id, f"this claim already settled it as {status}")
    if status == "running":
        raise TokenRejected(task_id, "another worker holds it now")
    raise TokenRejected(task_id, f"it is {status} after a later claim")


async def complete(db: Any, task_id: int, token: uuid.UUID, result: Any) -> Settlement:
    done = await db.fetchval(
        "UPDATE tasks SET status = 'done', result = $3::jsonb, error = NULL, "
        "lease_expires_at = NULL, finished_at = now(), updated_at = now() "
        "WHERE id = $1 AND token = $2 AND status = 'running' RETURNING true",
        task_id, token, encode(result),
    )
    if done:
        return Settlement(TaskStatus.DONE)
    return await _rejected(db, task_id, token, ("done",))


async def fail(db: Any, task_id: int, token: uuid.UUID, error: str, *, retry: bool,
               delay: float = 0.0) -> Settlement:
    """Record a failed attempt: queued again after ``delay`` seconds if ``retry`` and
    attempts are left, else failed for good."""
    status = await db.fetchval(
        "UPDATE tasks SET "
        "status = CASE WHEN $4 AND attempts < max_attempts THEN 'queued' ELSE 'failed' END, "
        "error = $3, run_after = now() + make_interval(secs => $5), lease_expires_at = NULL, "
        "finished_at = CASE WHEN $4 AND attempts < max_attempts THEN NULL ELSE now() END, "
        "updated_at = now() "
        "WHERE id = $1 AND token = $2 AND status = 'running' RETURNING status",
        task_id, token, error, retry, float(delay),
    )
    if status is not None:
        return Settlement(TaskStatus(status))
    return await _rejected(db, task_id, token, ("queued", "failed"))


async def reap_expired(db: Any, pool_id: str) -> int:
    """Return the pool's running tasks whose lease expired to the queue (or fail those
    out of attempts). Safe to run from any number of workers at once."""
    rows = await db.fetch(
        "WITH expired AS ("
        "  SELECT id FROM tasks WHERE pool_id = $1 AND status = 'running' "
        "  AND lease_expires_at < now() FOR UPDATE SKIP LOCKED) "
        "UPDATE tasks t SET "
        "status = CASE WHEN t.attempts >= t.max_attempts THEN 'failed' ELSE 'queued' END, "
        "error = 'lease expired on attempt ' || t.attempts || ' of ' || t.max_attempts, "
        "finished_at = CASE WHEN t.attempts >= t.max_attempts THEN now() END, "
        "token = NULL, lease_expires_at = NULL, run_after = now(), updated_at = now() "
        "FROM expired WHERE t.id = expired.id RETURNING t.id",
        pool_id,
    )
    return len(rows)


# ---- the pool as the task API shows it -----------------------------------------------


@dataclass(frozen=True, slots=True)
class PoolSummary:
    pool_id: str
    queued: int
    running: int
    succeeded: int
    failed: int
    active_workers: int
    draining_workers: int
    replicas: int | None
    """The orchestrator's replica count as of the leader's last tick (None before one)."""
    desired: int | None
    desired_valid_until: float | None


async def pool_summary(db: Any, pool_id: str) -> PoolSummary:
    row = await db.fetchrow(
        "SELECT p.id, "
        "  (SELECT count(*) FROM tasks t WHERE t.pool_id = p.id AND t.status = 'queued') "
        "    AS queued, "
        "  (SELECT count(*) FROM tasks t WHERE t.pool_id = p.id AND t.status = 'running') "
        "    AS running, "
        "  (SELECT count(*) FROM tasks t WHERE t.pool_id = p.id AND t.status = 'done') "
        "    AS succeeded, "
        "  (SELECT count(*) FROM tasks t WHERE t.pool_id = p.id AND t.status = 'failed') "
        "    AS failed, "
        "  (SELECT count(*) FROM workers w WHERE w.pool_id = p.id AND w.status = 'active') "
        "    AS active_workers, "
        "  (SELECT count(*) FROM workers w WHERE w.pool_id = p.id AND w.status = 'draining') "
        "    AS draining_workers, "
        "  d.current, d.desired, d.valid_until "
        "FROM worker_pools p LEFT JOIN desired_capacity d ON d.pool_id = p.id "
        "WHERE p.id = $1",
        pool_id,
    )
    if row is None:
        raise PoolNotFound(pool_id)
    return PoolSummary(
        pool_id=str(row["id"]),
        queued=int(row["queued"]),
        running=int(row["running"]),
        succeeded=int(row["succeeded"]),
        failed=int(row["failed"]),
        active_workers=int(row["active_workers"]),
        draining_workers=int(row["draining_workers"]),
        replicas=row["current"],
        desired=row["desired"],
        desired_valid_until=from_ts(row["valid_until"]),
    )
