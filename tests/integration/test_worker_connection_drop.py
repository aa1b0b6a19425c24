"""Connection dropped during completion: the worker cannot know whether its completion
committed. Whatever the truth, nobody else is handed the task inside its live lease.

A proxy we control (`tests.pgproxy`) sits between one worker and Postgres and cuts its
connection exactly as the completion goes through: once before Postgres sees it, once
after Postgres committed it. A second worker, connected directly, claims from the same
pool the whole time and must never run the task early.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from roost.embedded import PostgresServer
from roost.store import tasks as tq
from roost.store.tasks import TaskStatus, TokenRejected
from roost.worker import Worker, current_task
from tests.integration.worker_helpers import (
    config,
    eventually,
    open_pool_db,
    running,
    task_row,
)
from tests.pgproxy import Cut, PgProxy


@pytest.fixture
async def db(pg_dsn: str) -> AsyncIterator[Any]:
    pool = await open_pool_db(pg_dsn)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
async def proxy(postgres_server: PostgresServer) -> AsyncIterator[PgProxy]:
    p = await PgProxy(postgres_server.port).start()
    try:
        yield p
    finally:
        await p.close()


class Recorder:
    """A task function that records who ran what, and can hold a task until told."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.runs: list[tuple[int, int]] = []
        self.release = asyncio.Event()
        self.release.set()

    async def __call__(self, payload: Any) -> Any:
        t = current_task()
        self.runs.append((t.task_id, t.attempt))
        await self.release.wait()
        return {"by": self.name, "marker": payload["marker"]}


async def _setup(db: Any, pg_dsn: str, proxy: PgProxy, cut: Cut, *,
                 go_dark: bool = False) -> tuple[
        Recorder, Worker, int, asyncio.Event]:
    """A worker through the proxy holding one task, its completion armed to be cut."""
    marker = f"cut-{uuid.uuid4().hex}"
    victim_fn = Recorder("victim")
    victim_fn.release.clear()
    database = pg_dsn.rsplit("/", 1)[1]
    victim = Worker(victim_fn, config(proxy.dsn(database), worker_id="victim"))
    tid = (await tq.submit(db, "p", {"marker": marker})).task_id
    fired = proxy.arm(marker.encode(), cut, go_dark=go_dark)
    return victim_fn, victim, tid, fired


@pytest.mark.parametrize("cut", ["before", "after"])
async def test_connection_dropped_during_completion(
    db: Any, pg_dsn: str, proxy: PgProxy, cut: Cut
) -> None:
    victim_fn, victim, tid, fired = await _setup(db, pg_dsn, proxy, cut)
    rival_fn = Recorder("rival")
    rival = Worker(rival_fn, config(pg_dsn, worker_id="rival"))
    async with running(victim):
        await eventually(lambda: victim_fn.runs, what="the victim claims the task")
        claimed = await task_row(db, tid)
        async with running(rival):
            victim_fn.release.set()  # the victim completes; the proxy cuts it
            await asyncio.wait_for(fired.wait(), 5)
            if cut == "after":  # Postgres committed; the victim never heard
                assert (await task_row(db, tid))["status"] == "done"
            else:  # Postgres never saw it: still the victim's, under the same lease
                row = await task_row(db, tid)
                assert (row["status"], row["token"]) == ("running", claimed["token"])
            await eventually(lambda: _status(db, tid, "done"), what="done", timeout=5)
            await asyncio.sleep(0.3)  # the rival keeps polling: it must find nothing
    task = await tq.get_task(db, tid)
    assert (task.status, task.attempts, task.result["by"]) == (TaskStatus.DONE, 1, "victim")
    assert victim_fn.runs == [(tid, 1)] and rival_fn.runs == []
    # The victim asked again with its token: applied now, or told it had committed.
    assert victim.stats.succeeded == 1 and victim.stats.replayed == (cut == "after")
    assert victim.stats.unconfirmed == victim.stats.rejected == 0


async def test_a_worker_cut_off_for_good_loses_the_task_only_when_its_lease_ends(
    db: Any, pg_dsn: str, proxy: PgProxy
) -> None:
    victim_fn, victim, tid, fired = await _setup(db, pg_dsn, proxy, "before", go_dark=True)
    rival_fn = Recorder("rival")
    rival = Worker(rival_fn, config(pg_dsn, worker_id="rival"))
    async with running(victim):
        await eventually(lambda: victim_fn.runs, what="the victim claims the task")
        token = (await task_row(db, tid))["token"]
        async with running(rival):
            victim_fn.release.set()  # cut, and Postgres unreachable for the victim after
            await asyncio.wait_for(fired.wait(), 5)
            lease_end = (await task_row(db, tid))["lease_expires_at"]
            await eventually(lambda: _status(db, tid, "done"), what="re-run", timeout=5)
            await eventually(lambda: victim.stats.unconfirmed == 1, what="victim gives up")
        proxy.refuse = False
    row = await task_row(db, tid)
    # The rival's claim came only after the victim's lease had run out.
    assert row["started_at"] > lease_end
    assert (row["attempts"], tq._decode(row["result"])["by"]) == (2, "rival")
    assert rival_fn.runs == [(tid, 2)] and victim_fn.runs == [(tid, 1)]
    with pytest.raises(TokenRejected):  # the victim's completion, were it to arrive now
        await tq.complete(db, tid, token, {"by": "victim"})


async def _status(db: Any, task_id: int, status: str) -> bool:
    return bool((await tq.get_task(db, task_id)).status == status)
