"""The task queue on real Postgres: idempotent submits, exclusive claims, leases that
expire and re-queue, execution tokens, retries with backoff."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from roost.store import fenced, lease
from roost.store import pools as pools_q
from roost.store import tasks as tq
from roost.store import workers as wq
from roost.store.errors import PoolNotFound
from roost.store.tasks import (
    IdempotencyConflict,
    TaskNotFound,
    TaskStatus,
    TokenRejected,
    WorkerNotActive,
)
from tests.integration.test_controller_helpers import open_db, pool_spec
from tests.polling import until


@pytest.fixture
async def db(pg_dsn: str) -> AsyncIterator[Any]:
    pool = await open_db(pg_dsn)
    await pools_q.create_pool(pool, pool_spec("p"))
    try:
        yield pool
    finally:
        await pool.close()


async def worker(db: Any, wid: str) -> str:
    await wq.register(db, wid, pool_id="p", revision="r1", instance_ref=wid)
    return wid


async def test_idempotency_key_returns_the_existing_task(db: Any) -> None:
    first = await tq.submit(db, "p", {"n": 1}, idempotency_key="k1")
    again = await tq.submit(db, "p", {"n": 1}, idempotency_key="k1")
    assert first.created and not again.created and again.task_id == first.task_id
    with pytest.raises(IdempotencyConflict) as exc:
        await tq.submit(db, "p", {"n": 2}, idempotency_key="k1")
    assert exc.value.task_id == first.public_id  # the id callers know, never the internal one
    # Without a key every submit is a new task.
    a, b = await tq.submit(db, "p", [1]), await tq.submit(db, "p", [1])
    assert a.task_id != b.task_id
    # Racing submits of one key make one task.
    racing = await asyncio.gather(*(tq.submit(db, "p", "x", idempotency_key="race")
                                    for _ in range(8)))
    assert len({s.task_id for s in racing}) == 1
    assert sum(s.created for s in racing) == 1
    with pytest.raises(PoolNotFound):
        await tq.submit(db, "nope", {})
    task = await tq.get_task(db, first.task_id)
    assert (task.status, task.payload, task.attempts, task.idempotency_key) == (
        TaskStatus.QUEUED, {"n": 1}, 0, "k1")
    with pytest.raises(TaskNotFound):
        await tq.get_task(db, 10**9)


async def test_a_key_whose_task_is_deleted_meanwhile_queues_a_new_one(db: Any) -> None:
    """The key's task went past its retention between the insert that found the key
    and the read of its task (the leader deletes finished tasks): the key is free
    again, so the submit queues a new task rather than calling the pool unknown."""
    old = await tq.submit(db, "p", {"n": 1}, idempotency_key="k")

    class PrunedBetween:
        """The store's pool, with the old task deleted just before the read of it."""

        async def fetchrow(self, sql: str, *args: Any) -> Any:
            if sql.startswith("SELECT id, public_id, payload"):
                await db.execute("DELETE FROM tasks WHERE id = $1", old.task_id)
            return await db.fetchrow(sql, *args)

    again = await tq.submit(PrunedBetween(), "p", {"n": 1}, idempotency_key="k")
    assert again.created and again.task_id != old.task_id
    assert (await tq.get_task(db, again.task_id)).idempotency_key == "k"


async def test_concurrent_claims_never_share_a_task(db: Any) -> None:
    await db.execute("INSERT INTO tasks (pool_id, payload) "
                     "SELECT 'p', to_jsonb(i) FROM generate_series(1, 300) i")
    ids = [await worker(db, f"w{i}") for i in range(6)]
    got: dict[str, list[int]] = {w: [] for w in ids}

    async def drain(wid: str) -> None:
        while claims := await tq.claim(db, "p", wid, limit=7, lease=30):
            got[wid].extend(c.task_id for c in claims)
            assert all(c.attempt == 1 for c in claims)

    await asyncio.gather(*(drain(w) for w in ids))
    claimed = [t for ts in got.values() for t in ts]
    assert len(claimed) == len(set(claimed)) == 300
    assert sum(1 for ts in got.values() if ts) > 1  # they really raced
    counts = await tq.pool_summary(db, "p")
    assert (counts.queued, counts.running) == (0, 300)


async def test_an_expired_lease_requeues_and_the_old_token_is_refused(db: Any) -> None:
    w1, w2 = await worker(db, "w1"), await worker(db, "w2")
    tid = (await tq.submit(db, "p", {"job": 1})).task_id
    # Leases of a second: room for a loaded machine between the claim and the checks
    # that it is still live.
    [first] = await tq.claim(db, "p", w1, limit=5, lease=1.0)
    assert (first.task_id, first.attempt, first.payload) == (tid, 1, {"job": 1})
    assert await tq.claim(db, "p", w2, limit=5, lease=5) == []  # held under a live lease
    assert await tq.reap_expired(db, "p") == 0
    await asyncio.sleep(1.1)
    assert await tq.reap_expired(db, "p") == 1
    assert (await tq.get_task(db, tid)).status is TaskStatus.QUEUED
    [second] = await tq.claim(db, "p", w2, limit=5, lease=5)
    assert second.attempt == 2 and second.token != first.token
    with pytest.raises(TokenRejected, match="another worker holds it"):
        await tq.complete(db, tid, first.token, "late")
    with pytest.raises(TokenRejected):
        await tq.fail(db, tid, first.token, "late", retry=True)
    assert (await tq.complete(db, tid, second.token, {"ok": 1})).status is TaskStatus.DONE
    # Asking again with the same token (a lost reply) is told it went through.
    again = await tq.complete(db, tid, second.token, {"ok": 1})
    assert again.already and again.status is TaskStatus.DONE
    with pytest.raises(TokenRejected):
        await tq.complete(db, tid, uuid.uuid4(), None)
    task = await tq.get_task(db, tid)
    assert (task.status, task.result, task.attempts) == (TaskStatus.DONE, {"ok": 1}, 2)


async def test_heartbeat_renews_leases_and_counts_them(db: Any) -> None:
    w1, w2 = await worker(db, "w1"), await worker(db, "w2")
    await tq.submit(db, "p", 1)
    await tq.submit(db, "p", 2)
    claims = await tq.claim(db, "p", w1, limit=5, lease=1.0)
    held = {c.task_id: c.token for c in claims}
    for _ in range(6):  # 1.2 s of beats, past the 1 s lease: only renewals keep it
        await asyncio.sleep(0.2)
        beat = await wq.heartbeat(db, w1, held=held, running=2, lease=1.0)
        assert beat.renewed == set(held) and beat.active_leases == 2
        assert await tq.reap_expired(db, "p") == 0
    assert await tq.claim(db, "p", w2, limit=5, lease=5) == []
    row = await db.fetchrow("SELECT running_tasks, active_leases FROM workers WHERE id = 'w1'")
    assert tuple(row) == (2, 2)
    # Stop renewing one: it expires, is reaped, and the next beat reports it lost.
    keep = min(held)
    await asyncio.sleep(0.2)
    await wq.heartbeat(db, w1, held={keep: held[keep]}, running=1, lease=30)
    await asyncio.sleep(0.9)  # the other's 1 s lease runs out; the kept one has 30 s
    assert await tq.reap_expired(db, "p") == 1
    beat = await wq.heartbeat(db, w1, held=held, running=2, lease=30)
    assert beat.renewed == {keep} and beat.active_leases == 1


async def test_failures_retry_with_backoff_until_attempts_run_out(db: Any) -> None:
    w = await worker(db, "w1")
    tid = (await tq.submit(db, "p", "x", max_attempts=2)).task_id
    [c1] = await tq.claim(db, "p", w, limit=1, lease=5)
    s = await tq.fail(db, tid, c1.token, "boom", retry=True, delay=1.0)
    assert s.status is TaskStatus.QUEUED and not s.already
    assert (await tq.fail(db, tid, c1.token, "boom", retry=True, delay=1.0)).already
    assert await tq.claim(db, "p", w, limit=1, lease=5) == []  # backing off
    await asyncio.sleep(1.1)
    [c2] = await tq.claim(db, "p", w, limit=1, lease=5)
    assert c2.attempt == 2
    s = await tq.fail(db, tid, c2.token, "boom again", retry=True, delay=0)
    assert s.status is TaskStatus.FAILED
    task = await tq.get_task(db, tid)
    assert (task.status, task.error, task.attempts) == (TaskStatus.FAILED, "boom again", 2)
    assert task.finished_at is not None
    # A permanent failure ends at once, attempts left or not.
    tid = (await tq.submit(db, "p", "y", max_attempts=5)).task_id
    [c] = await tq.claim(db, "p", w, limit=1, lease=5)
    assert (await tq.fail(db, tid, c.token, "bad input", retry=False)).status is \
        TaskStatus.FAILED


async def test_a_lease_that_expires_on_the_last_attempt_fails_the_task(db: Any) -> None:
    w = await worker(db, "w1")
    tid = (await tq.submit(db, "p", "x", max_attempts=1)).task_id
    await tq.claim(db, "p", w, limit=1, lease=0.1)
    await asyncio.sleep(0.2)
    assert await tq.reap_expired(db, "p") == 1
    task = await tq.get_task(db, tid)
    assert task.status is TaskStatus.FAILED and task.error == "lease expired on attempt 1 of 1"


async def test_only_an_active_worker_claims(db: Any) -> None:
    w = await worker(db, "w1")
    await tq.submit(db, "p", "x")
    await db.execute("UPDATE workers SET status = 'draining' WHERE id = 'w1'")
    with pytest.raises(WorkerNotActive, match="draining"):
        await tq.claim(db, "p", w, limit=1, lease=5)
    with pytest.raises(WorkerNotActive, match="not registered"):
        await tq.claim(db, "p", "stranger", limit=1, lease=5)
    assert (await tq.pool_summary(db, "p")).queued == 1


async def test_a_claim_and_the_drain_mark_serialize(db: Any) -> None:
    """Once the controller's drain mark has committed, the worker claims nothing more,
    and its next heartbeat counts every task it claimed before the mark."""
    w = await worker(db, "w1")
    await db.execute("INSERT INTO tasks (pool_id, payload) "
                     "SELECT 'p', to_jsonb(i) FROM generate_series(1, 500) i")
    async with db.acquire() as conn:
        epoch = await lease.bump_epoch(conn, "test")
    refused = asyncio.Event()

    async def claim_hard() -> None:
        while True:
            try:
                await tq.claim(db, "p", w, limit=1, lease=30)
            except WorkerNotActive:
                refused.set()
                return

    claimer = asyncio.create_task(claim_hard())
    # the drain lands while it claims: wait for its first claim
    await until("the claimer's first claim",
                lambda: db.fetchval("SELECT count(*) FROM tasks WHERE status = 'running'"),
                timeout=5, interval=0.05)
    assert await fenced.mark_draining(db, epoch, "p", w, now=0)
    held = await db.fetchval("SELECT count(*) FROM tasks WHERE status = 'running'")
    await asyncio.wait_for(refused.wait(), 5)
    await claimer
    assert 0 < held < 500
    assert await db.fetchval("SELECT count(*) FROM tasks WHERE status = 'running'") == held
    beat = await wq.heartbeat(db, w, held={}, running=0, lease=30)
    assert beat.status == "draining" and beat.active_leases == held
