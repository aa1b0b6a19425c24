"""``roost bench wake``: how long the first task of an idle pool waits, end to end.

It starts the `roost up` components in this process (NATS, Postgres, the gateway, one
node with the ``process`` driver, the controller with its *default* tick interval and
windows) and, for each round, creates a fresh ``native`` pool at 0 replicas, waits until
the controller has published a plan that sees it idle, submits one task
(`roost.demo_tasks:echo`, sleeping ``--task-seconds``) and reads back, from the task's
own row (the database's clock, so no two clocks are compared):

- **registered**: ``created_at`` to the first worker's registration (``registered_at``
  of its row: the instance launched and its process started);
- **started**: ``created_at`` to the worker's claim (``started_at``);
- **done**: ``created_at`` to ``finished_at``.

Between the two sit the whole path: the database's ``NOTIFY`` on insert wakes the
controller (it does not wait for its tick), the plan scales from zero with no window,
the native adapter's RunInstances, the gateway's placement, the node starting a
``roost worker`` process (a Python interpreter importing roost), its registration and
its first claim. Each round uses a new pool so that every one starts from zero.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg
import click
from rich.console import Console

from roost.bench.report import machine, markdown_table, write_json
from roost.controller.adapters import NativeOrchestrator
from roost.controller.orchestrator import PoolRef
from roost.decide.snapshot import PoolSpec
from roost.embedded.proc import free_port
from roost.store import pools as pools_q
from roost.store import tasks as tasks_q
from roost.up.cluster import (
    ClusterSpec,
    ControllerComponent,
    LocalCluster,
    build_components,
    cluster_clients,
    new_credentials,
)

log = logging.getLogger("roost.bench.wake")

TARGET = "roost.demo_tasks:echo"
WORKER_ENV = {"ROOST_WORKER_HEARTBEAT": "0.5", "ROOST_WORKER_POLL": "0.1"}
"""Inherited by the worker processes: a quick first poll (the worker runtime's own
settings, not the controller's)."""


async def _published_idle(db: Any, pool_id: str, deadline: float) -> None:
    """Until the leader has published a plan in which ``pool_id`` has 0 replicas."""
    while time.monotonic() < deadline:
        row = await db.fetchrow("SELECT current FROM desired_capacity WHERE pool_id = $1",
                                pool_id)
        if row is not None and row["current"] == 0:
            return
        await asyncio.sleep(0.1)
    raise click.ClickException(f"the controller never published pool {pool_id}")


async def _finished(db: Any, task_id: int, deadline: float) -> asyncpg.Record:
    while time.monotonic() < deadline:
        row = await db.fetchrow(
            "SELECT status, extract(epoch FROM created_at) AS created, "
            "extract(epoch FROM started_at) AS started, "
            "extract(epoch FROM finished_at) AS finished, (SELECT extract(epoch FROM "
            "min(w.registered_at)) FROM workers w WHERE w.pool_id = t.pool_id) AS registered "
            "FROM tasks t WHERE t.id = $1", task_id)
        if row is not None and row["finished"] is not None:
            return row
        await asyncio.sleep(0.05)
    raise click.ClickException(f"task {task_id} did not finish in time")


async def run_rounds(cluster: LocalCluster, spec: ClusterSpec, *, rounds: int,
                     task_seconds: float, timeout: float, console: Console
                     ) -> list[dict[str, Any]]:
    orch: NativeOrchestrator | None = None
    db: Any = None
    refs: list[PoolRef] = []
    out: list[dict[str, Any]] = []
    try:
        await cluster.start()
        orch, db = await cluster_clients(cluster, spec, max_size=2)
        ref_text = f"type=t3.small; target={TARGET}; concurrency=1"
        for r in range(rounds):
            pool_id = f"wake-{r + 1}"
            refs.append(PoolRef(pool_id, ref_text))
            await pools_q.create_pool(db, PoolSpec(
                pool_id=pool_id, min_replicas=0, max_replicas=1, target_per_replica=1,
                worker_cpu_milli=1000, worker_mem_mib=1024, worker_db_pool_size=2,
                expected_revision="", orchestrator="native", orchestrator_ref=ref_text))
            deadline = time.monotonic() + timeout
            await _published_idle(db, pool_id, deadline)
            sub = await tasks_q.submit(db, pool_id, {"seconds": task_seconds})
            row = await _finished(db, sub.task_id, deadline)
            registered = float(row["registered"]) - float(row["created"])
            started = float(row["started"]) - float(row["created"])
            done = float(row["finished"]) - float(row["created"])
            out.append({"round": r + 1, "pool": pool_id, "status": row["status"],
                        "submitted_to_registered": round(registered, 3),
                        "submitted_to_started": round(started, 3),
                        "submitted_to_done": round(done, 3)})
            console.print(f"round {r + 1}: worker registered {registered:.2f} s, first task "
                          f"started {started:.2f} s and done {done:.2f} s after it was "
                          f"submitted ({row['status']})")
            await orch.scale_pool(refs[-1], 0, request_id=f"{pool_id}-cleanup")
        return out
    finally:
        await asyncio.shield(asyncio.create_task(_shutdown(cluster, db, orch, refs)))


async def _shutdown(cluster: LocalCluster, db: Any, orch: NativeOrchestrator | None,
                    refs: list[PoolRef]) -> None:
    if orch is not None:
        for ref in refs:  # no worker left behind
            try:
                if (await orch.pool_state(ref)).instances:
                    await orch.scale_pool(ref, 0, request_id=f"{ref.pool_id}-cleanup")
            except Exception as exc:  # the gateway may be gone; the nodes stop theirs
                log.info("cleanup of %s: %s", ref.pool_id, exc)
    if db is not None:
        await db.close()
    await cluster.stop()
    if orch is not None:
        await orch.close()


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def stats(key: str) -> dict[str, float]:
        xs = [r[key] for r in rows]
        return {"median": round(statistics.median(xs), 3), "min": min(xs), "max": max(xs)}
    return {"rounds": len(rows), "submitted_to_registered": stats("submitted_to_registered"),
            "submitted_to_started": stats("submitted_to_started"),
            "submitted_to_done": stats("submitted_to_done")}


@click.command("wake")
@click.option("--rounds", type=click.IntRange(1), default=5, show_default=True,
              help="Idle pools to wake, one after the other.")
@click.option("--task-seconds", type=click.FloatRange(0), default=0.1, show_default=True,
              help="How long the first task sleeps.")
@click.option("--timeout", type=click.FloatRange(1), default=120.0, show_default=True,
              help="Give up on a round after this many seconds.")
@click.option("--json", "json_out", type=click.Path(path_type=Path, dir_okay=False),
              default=None, help="Write the results here (and a .md beside it).")
def wake(rounds: int, task_seconds: float, timeout: float, json_out: Path | None) -> None:
    """Scale-from-zero latency: first task submitted to started and to done, through the
    real controller, gateway, node and worker process."""
    console = Console()
    for k, v in WORKER_ENV.items():
        os.environ.setdefault(k, v)
    tmp = Path(tempfile.mkdtemp(prefix="roost-wake-"))
    key, secret = new_credentials()
    spec = ClusterSpec(
        data_dir=tmp, nodes=1, driver="process", node_capacity="8vcpu,32GiB",
        heartbeat_seconds=0.5, nats_port=free_port(), port=free_port(),
        credentials={key: secret}, postgres_port=free_port(), controller_port=free_port())
    cluster = LocalCluster(build_components(spec))
    ctl = cluster.get(ControllerComponent)
    assert isinstance(ctl, ControllerComponent)
    config = ctl.config
    try:
        rows = asyncio.run(run_rounds(cluster, spec, rounds=rounds, task_seconds=task_seconds,
                                      timeout=timeout, console=console))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summary = summarize(rows)
    s, d = summary["submitted_to_started"], summary["submitted_to_done"]
    console.print(f"wake from zero over {rounds} rounds: started median {s['median']:.2f} s "
                  f"(min {s['min']:.2f}, max {s['max']:.2f}); done median {d['median']:.2f} s "
                  f"(min {d['min']:.2f}, max {d['max']:.2f}); controller interval "
                  f"{config.interval:g} s")
    if json_out is not None:
        controller = {k: getattr(config, k) for k in (
            "interval", "scale_up_window", "scale_down_window", "small_pool_replicas",
            "rate_window", "flap_window", "growth_period")}  # never the DSN or secrets
        doc = {"settings": {"controller": controller, "rounds": rounds,
                            "task_seconds": task_seconds, "worker_env": WORKER_ENV},
               "machine": machine(), "rounds": rows, "summary": summary}
        write_json(json_out, doc)
        table = markdown_table(
            ["round", "submitted to registered s", "submitted to started s",
             "submitted to done s"],
            [[str(r["round"]), f"{r['submitted_to_registered']:.2f}",
              f"{r['submitted_to_started']:.2f}",
              f"{r['submitted_to_done']:.2f}"] for r in rows])
        json_out.with_suffix(".md").write_text(
            f"# roost bench wake\n\n{table}\n\nController interval {config.interval:g} s; "
            f"task sleeps {task_seconds:g} s.\n")
