"""`roost worker` as a real process: kill -9 while it holds a task, and SIGTERM as a
graceful drain. Processes are started here and signalled by their own pid."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from roost.embedded.proc import free_port
from roost.store import tasks as tq
from roost.store.tasks import TaskStatus, TokenRejected
from roost.worker import Worker, current_task
from tests.integration.worker_helpers import (
    config,
    eventually,
    open_pool_db,
    running,
    task_row,
    worker_row,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def db(pg_dsn: str) -> AsyncIterator[Any]:
    pool = await open_pool_db(pg_dsn)
    try:
        yield pool
    finally:
        await pool.close()


async def start_worker(dsn: str, target: str, worker_id: str, *extra: str
                       ) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "roost.worker", "--pool", "p", "--dsn", dsn,
        "--lease", "1", "--heartbeat", "0.2", "--poll", "0.05", "--worker-id", worker_id,
        "--log-level", "warning", *extra, target,
        cwd=ROOT, env={**os.environ, "ROOST_INSTANCE_ID": f"i-{worker_id}"},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )


async def stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        os.kill(proc.pid, signal.SIGKILL)
    await proc.wait()


def log_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def test_kill_9_mid_task_reruns_after_the_lease_and_refuses_the_old_token(
    db: Any, pg_dsn: str, tmp_path: Path
) -> None:
    log = tmp_path / "runs.log"
    tid = (await tq.submit(db, "p", {"log": str(log)})).task_id
    proc = await start_worker(pg_dsn, "tests.worker_tasks:hang", "doomed")
    try:
        await eventually(lambda: log_lines(log), what="the task starts", timeout=15)
        row = await worker_row(db, "doomed")
        assert row["instance_ref"] == "i-doomed"  # ROOST_INSTANCE_ID is the orchestrator ref
        held = await task_row(db, tid)
        assert (held["status"], held["worker_id"]) == ("running", "doomed")
        os.kill(proc.pid, signal.SIGKILL)  # by its own pid, while it holds the task
        await proc.wait()
        killed_at = time.time()
    finally:
        await stop(proc)
    lease_end = (await task_row(db, tid))["lease_expires_at"]  # its last renewal

    reruns: list[int] = []

    async def rerun(payload: Any) -> Any:
        reruns.append(current_task().attempt)
        return "second time"

    async with running(Worker(rerun, config(pg_dsn, worker_id="heir"))):
        await eventually(lambda: reruns, what="the re-run", timeout=5)
        await eventually(lambda: _done(db, tid), what="done")
    row = await task_row(db, tid)
    assert row["started_at"] > lease_end  # not before the dead worker's lease ran out
    assert time.time() - killed_at < 5
    assert (row["attempts"], row["worker_id"], reruns) == (2, "heir", [2])
    assert log_lines(log)[0].startswith(f"start task={tid} attempt=1 pid={proc.pid}")
    with pytest.raises(TokenRejected):  # the dead worker's late completion
        await tq.complete(db, tid, held["token"], "from beyond")
    assert (await tq.get_task(db, tid)).result == "second time"


async def test_sigterm_drains_then_exits(db: Any, pg_dsn: str, tmp_path: Path) -> None:
    log = tmp_path / "runs.log"
    first = (await tq.submit(db, "p", {"log": str(log), "seconds": 0.8})).task_id
    proc = await start_worker(pg_dsn, "tests.worker_tasks:slow", "polite")
    try:
        await eventually(lambda: log_lines(log), what="the task starts", timeout=15)
        os.kill(proc.pid, signal.SIGTERM)
        second = (await tq.submit(db, "p", {"log": str(log)})).task_id
        code = await asyncio.wait_for(proc.wait(), 10)
        stderr = (await proc.stderr.read()).decode() if proc.stderr else ""
        assert code == 0, stderr
    finally:
        await stop(proc)
    task = await tq.get_task(db, first)
    assert task.status is TaskStatus.DONE and task.result["pid"] == proc.pid
    assert (await tq.get_task(db, second)).status is TaskStatus.QUEUED  # not claimed
    row = await worker_row(db, "polite")
    assert (row["status"], row["running_tasks"], row["active_leases"]) == ("gone", 0, 0)


async def test_bad_usage_exits_2(pg_dsn: str) -> None:
    proc = await start_worker(pg_dsn, "tests.worker_tasks:nope", "x")
    try:
        assert await asyncio.wait_for(proc.wait(), 15) == 2
        assert proc.stderr is not None
        assert b"has no 'nope'" in await proc.stderr.read()
    finally:
        await stop(proc)


async def _done(db: Any, task_id: int) -> bool:
    return (await tq.get_task(db, task_id)).status is TaskStatus.DONE


def scrape(port: int) -> dict[str, float]:
    """``name{labels}`` -> value, from a worker's /metrics (labels in name order)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


async def test_a_worker_serves_its_figures_as_prometheus_metrics(
    db: Any, pg_dsn: str, tmp_path: Path
) -> None:
    log = tmp_path / "runs.log"
    ids = [(await tq.submit(db, "p", {"log": str(log), "seconds": 0.05})).task_id
           for _ in range(3)]
    port = free_port()
    proc = await start_worker(pg_dsn, "tests.worker_tasks:slow", "counted",
                              "--metrics-port", str(port), "--metrics-host", "127.0.0.1")
    try:
        async def all_done() -> bool:
            return [(await task_row(db, t))["status"] for t in ids] == ["done"] * 3

        await eventually(all_done, what="three tasks done", timeout=20)
        who = 'pool="p",worker="counted"'
        figures: dict[str, float] = {}

        def settled() -> bool:
            figures.update(scrape(port))
            return figures.get(f'roost_worker_settles_total{{outcome="succeeded",{who}}}') == 3

        await eventually(settled, what="the metrics to count three", timeout=10)
        assert figures[f"roost_worker_claims_total{{{who}}}"] == 3
        assert figures[f'roost_worker_settles_total{{outcome="failed",{who}}}'] == 0
        assert figures[f"roost_worker_running_tasks{{{who}}}"] == 0
        assert figures[f"roost_worker_draining{{{who}}}"] == 0
        os.kill(proc.pid, signal.SIGTERM)  # a drain, by its own pid
        assert await asyncio.wait_for(proc.wait(), 15) == 0
    finally:
        await stop(proc)


async def test_a_metrics_port_already_taken_costs_the_metrics_not_the_worker(
    db: Any, pg_dsn: str, tmp_path: Path
) -> None:
    log = tmp_path / "runs.log"
    task = (await tq.submit(db, "p", {"log": str(log), "seconds": 0.01})).task_id
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = await start_worker(pg_dsn, "tests.worker_tasks:slow", "no-metrics",
                                  "--metrics-port", str(port), "--metrics-host", "127.0.0.1")
        try:
            await eventually(lambda: _done(db, task), what="the task done", timeout=20)
            os.kill(proc.pid, signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 15) == 0
            assert proc.stderr is not None
            err = (await proc.stderr.read()).decode()
            assert f"not serving metrics: cannot listen on 127.0.0.1:{port}" in err
        finally:
            await stop(proc)
