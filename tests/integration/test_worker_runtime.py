"""The worker library on real Postgres: exactly-once execution across concurrent workers,
sync and async task functions, retries, and drain as the controller drives it (with the
controller's own fenced writes)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

from roost.store import fenced, lease
from roost.store import tasks as tq
from roost.store.runtime import read_workers
from roost.store.tasks import TaskStatus
from roost.worker import (
    ExitReason,
    PermanentTaskError,
    RetryTask,
    Worker,
    current_task,
    retry_delay,
)
from tests.integration.worker_helpers import (
    config,
    eventually,
    open_pool_db,
    running,
    worker_row,
)


@pytest.fixture
async def db(pg_dsn: str) -> AsyncIterator[Any]:
    pool = await open_pool_db(pg_dsn)
    try:
        yield pool
    finally:
        await pool.close()


async def done_count(db: Any, pool: str = "p") -> int:
    return (await tq.pool_summary(db, pool)).succeeded


async def test_every_task_runs_exactly_once_across_concurrent_workers(
    db: Any, pg_dsn: str
) -> None:
    runs: list[tuple[int, str]] = []
    lock = threading.Lock()

    async def async_fn(payload: Any) -> Any:
        t = current_task()
        runs.append((t.task_id, t.worker_id))
        await asyncio.sleep(0.002)
        return {"square": payload * payload}

    def sync_fn(payload: Any) -> Any:  # runs in the worker's threads
        t = current_task()
        with lock:
            runs.append((t.task_id, t.worker_id))
        time.sleep(0.002)
        return {"square": payload * payload}

    ids = [(await tq.submit(db, "p", n, idempotency_key=f"k{n}")).task_id for n in range(150)]
    workers = [Worker(async_fn, config(pg_dsn, concurrency=4, worker_id="async-1")),
               Worker(async_fn, config(pg_dsn, concurrency=4, worker_id="async-2")),
               Worker(sync_fn, config(pg_dsn, concurrency=4, worker_id="sync-1"))]
    async with running(workers[0]), running(workers[1]), running(workers[2]):
        async def all_done() -> bool:
            return await done_count(db) == 150
        await eventually(all_done, what="150 done", timeout=30)
    counts = Counter(tid for tid, _ in runs)
    assert sorted(counts) == sorted(ids) and set(counts.values()) == {1}
    assert len({w for _, w in runs}) == 3  # all three took part
    rows = await db.fetch("SELECT payload, result, attempts, status FROM tasks")
    assert all(r["status"] == "done" and r["attempts"] == 1 for r in rows)
    assert all(tq._decode(r["result"])["square"] == int(r["payload"]) ** 2 for r in rows)
    assert sum(w.stats.succeeded for w in workers) == 150
    assert sum(w.stats.claimed for w in workers) == 150


async def test_retries_permanent_failures_and_bad_results(db: Any, pg_dsn: str) -> None:
    async def fn(payload: Any) -> Any:
        attempt = current_task().attempt
        match payload:
            case "flaky" if attempt == 1:
                raise RetryTask("not yet", delay=0)
            case "crashy" if attempt < 3:
                raise RuntimeError(f"crash {attempt}")
            case "doomed":
                raise PermanentTaskError("bad input")
            case "unserializable":
                return {1, 2}
        return {"attempt": attempt}

    want = {"flaky": (TaskStatus.DONE, 2), "crashy": (TaskStatus.DONE, 3),
            "doomed": (TaskStatus.FAILED, 1), "unserializable": (TaskStatus.FAILED, 1),
            "fine": (TaskStatus.DONE, 1)}
    ids = {p: (await tq.submit(db, "p", p, max_attempts=3)).task_id for p in want}
    always = (await tq.submit(db, "p", "crashy", max_attempts=2)).task_id
    w = Worker(fn, config(pg_dsn, concurrency=3))
    async with running(w):
        async def settled() -> bool:
            s = await tq.pool_summary(db, "p")
            return s.succeeded + s.failed == 6
        await eventually(settled, what="all settled")
    for payload, (status, attempts) in want.items():
        task = await tq.get_task(db, ids[payload])
        assert (task.status, task.attempts) == (status, attempts), payload
    assert (await tq.get_task(db, ids["crashy"])).result == {"attempt": 3}
    assert "bad input" in ((await tq.get_task(db, ids["doomed"])).error or "")
    assert "not JSON" in ((await tq.get_task(db, ids["unserializable"])).error or "")
    last = await tq.get_task(db, always)
    assert (last.status, last.attempts, last.error) == (
        TaskStatus.FAILED, 2, "RuntimeError: crash 2")
    assert (w.stats.retried, w.stats.failed) == (4, 3)
    assert [retry_delay(n, base=1, cap=5) for n in (1, 2, 3, 4, 9)] == [1, 2, 4, 5, 5]


async def test_drain_stops_claims_finishes_work_reports_empty_and_exits_when_removed(
    db: Any, pg_dsn: str
) -> None:
    release = asyncio.Event()

    async def fn(payload: Any) -> Any:
        if payload == "block":
            await release.wait()
        return payload

    async with db.acquire() as conn:
        epoch = await lease.bump_epoch(conn, "test-controller")
    w = Worker(fn, config(pg_dsn, concurrency=2, worker_id="w1", instance_ref="i-1"))
    async with running(w) as run:
        row = await worker_row(db, "w1")
        assert (row["pool_id"], row["instance_ref"], row["revision"]) == ("p", "i-1", "r1")
        # its concurrency, as the controller's snapshot reads it for the plan
        assert [w.slots for w in (await read_workers(db))["p"]] == [2]
        blocked = (await tq.submit(db, "p", "block")).task_id
        await eventually(lambda: w.running == 1, what="claimed")

        assert await fenced.mark_draining(db, epoch, "p", "w1", now=time.time())
        await eventually(lambda: w.mode == "draining", what="sees the drain")
        later = (await tq.submit(db, "p", "later")).task_id
        await asyncio.sleep(0.3)  # several poll intervals: nothing new is claimed
        assert (await tq.get_task(db, later)).status is TaskStatus.QUEUED
        async def holding() -> bool:
            # The next heartbeat after the mark reports the task still in hand.
            r = await worker_row(db, "w1")
            return (r["running_tasks"], r["active_leases"]) == (1, 1) and (
                r["heartbeat_at"] >= r["draining_since"])
        await eventually(holding, what="1/1 reported while draining", timeout=5)

        release.set()  # in-flight work finishes, and 0/0 is reported at once
        async def empty() -> bool:
            r = await worker_row(db, "w1")
            return (r["running_tasks"], r["active_leases"]) == (0, 0) and (
                r["heartbeat_at"] >= r["draining_since"])
        await eventually(empty, what="0/0 after the mark", timeout=2)
        assert (await tq.get_task(db, blocked)).status is TaskStatus.DONE
        assert not run.done()  # drained, waiting for the controller's decision

        # The controller calls the drain off: the worker takes tasks again.
        assert await fenced.reactivate(db, epoch, "p", "w1")
        await eventually(lambda: _status(db, later, "done"), what="claims again")

        # Drain again, and this time the controller removes the replica.
        assert await fenced.mark_draining(db, epoch, "p", "w1", now=time.time())
        await eventually(empty, what="0/0 again", timeout=2)
        assert await fenced.commit_removal(db, epoch, "p", "w1", 0)
        assert await fenced.mark_gone(db, epoch, "p", "w1")
        assert await asyncio.wait_for(run, 5) is ExitReason.REMOVED


async def _status(db: Any, task_id: int, status: str) -> bool:
    return bool((await tq.get_task(db, task_id)).status == status)


async def test_stop_is_a_graceful_drain(db: Any, pg_dsn: str) -> None:
    started = asyncio.Event()

    async def fn(payload: Any) -> Any:
        started.set()
        await asyncio.sleep(0.3)
        return "finished"

    first = (await tq.submit(db, "p", 1)).task_id
    w = Worker(fn, config(pg_dsn, worker_id="w1"))
    async with running(w) as run:
        await started.wait()
        w.stop()
        second = (await tq.submit(db, "p", 2)).task_id
        assert await asyncio.wait_for(run, 5) is ExitReason.STOPPED
    assert (await tq.get_task(db, first)).result == "finished"
    assert (await tq.get_task(db, second)).status is TaskStatus.QUEUED
    row = await worker_row(db, "w1")
    assert (row["status"], row["running_tasks"], row["active_leases"]) == ("gone", 0, 0)
