"""``roost demo``: the whole autoscaling loop on this machine, with one command.

It starts NATS, Postgres, the gateway, 3 nodes (``process`` driver) and the controller
(the `roost up` components, in this process, with short windows), creates a ``native``
pool whose workers run `roost.demo_tasks:echo`, submits a burst of tasks with
idempotency keys, and shows the queue, the replicas per node and the drain live. It ends
with a summary: tasks done, duplicates, lost, peak replicas, time to scale up and down.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import msgspec
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from roost.controller.adapters import NativeOrchestrator
from roost.controller.orchestrator import PoolRef
from roost.decide.snapshot import PoolSpec
from roost.embedded.proc import free_port
from roost.store import pools as pools_q
from roost.store import tasks as tasks_q
from roost.up.cluster import (
    ClusterSpec,
    ControllerComponent,
    DashboardComponent,
    LocalCluster,
    build_components,
    cluster_clients,
    new_credentials,
)

POOL = "demo"
TARGET = "roost.demo_tasks:echo"


class DemoTimeout(Exception):
    pass


@dataclass
class Figures:
    submitted: int = 0
    queued: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0
    replicas: int = 0
    ready: int = 0
    desired: int | None = None
    per_node: dict[str, int] = field(default_factory=dict)
    peak: int = 0
    phase: str = "starting"
    t_submit: float = 0.0
    t_first_replica: float | None = None
    t_peak: float | None = None
    t_all_done: float | None = None
    t_scaled_down: float | None = None


def _view(f: Figures, started: float) -> Group:
    queue = Table(title=f"pool {POOL!r}: {f.phase}  ({time.monotonic() - started:.0f} s)")
    for col in ("submitted", "queued", "running", "done", "failed", "replicas (ready)",
                "desired", "peak"):
        queue.add_column(col, justify="right")
    queue.add_row(str(f.submitted), str(f.queued), str(f.running), str(f.done),
                  str(f.failed), f"{f.replicas} ({f.ready})",
                  "-" if f.desired is None else str(f.desired), str(f.peak))
    nodes = Table(title="replicas per node")
    nodes.add_column("node")
    nodes.add_column("replicas", justify="right")
    for node, n in sorted(f.per_node.items()):
        nodes.add_row(node, "#" * n + f" {n}")
    return Group(queue, nodes)


def _decode(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


async def _observe(db: Any, orch: NativeOrchestrator, ref: PoolRef, cluster: LocalCluster,
                   f: Figures) -> None:
    s = await tasks_q.pool_summary(db, POOL)
    f.queued, f.running, f.done, f.failed = s.queued, s.running, s.succeeded, s.failed
    f.desired = s.desired
    state = await orch.pool_state(ref)
    f.replicas = len(state.instances)
    f.ready = sum(1 for i in state.instances if i.ready)
    if f.replicas > f.peak:
        f.peak, f.t_peak = f.replicas, time.monotonic()
    per_node: Counter[str] = Counter({a.config.node_id: 0 for a in cluster.nodes})
    service = cluster.gateway.service
    for inst in state.instances:
        rec = service.index.find(inst.ref) if service is not None else None
        per_node[rec.node_id if rec is not None else "(unplaced)"] += 1
    f.per_node = dict(per_node)


async def _check(db: Any, n: int, run: str) -> tuple[int, int, int, int]:
    """(done, duplicates, lost, re-runs) from the task rows: one row per idempotency key,
    and each done task's result is its own payload."""
    rows = await db.fetch("SELECT idempotency_key, status, attempts, payload, result "
                          "FROM tasks WHERE pool_id = $1", POOL)
    keys = Counter(r["idempotency_key"] for r in rows)
    dup_keys = sum(c - 1 for c in keys.values() if c > 1)
    seen: Counter[int] = Counter()
    for r in rows:
        if r["status"] == "done":
            result = _decode(r["result"])
            if isinstance(result, dict) and result.get("run") == run:
                seen[int(result["i"])] += 1
    dup_results = sum(c - 1 for c in seen.values() if c > 1)
    lost = sum(1 for i in range(n) if seen[i] == 0)
    reruns = sum(max(0, int(r["attempts"]) - 1) for r in rows)
    done = sum(1 for r in rows if r["status"] == "done")
    return done, dup_keys + dup_results, lost, reruns


async def run_demo(cluster: LocalCluster, spec: ClusterSpec, *, tasks: int, seconds: float,
                   max_replicas: int, per_replica: int, timeout: float, console: Console,
                   live: bool) -> Figures:
    started = time.monotonic()
    f = Figures()
    ref_text = f"type=t3.small; target={TARGET}; concurrency=2"
    ref = PoolRef(POOL, ref_text)
    db: Any = None
    orch: NativeOrchestrator | None = None
    try:
        console.print("starting NATS, Postgres, the gateway, "
                      f"{spec.nodes} nodes and the controller ...")
        await cluster.start()
        for c in cluster.components:
            if isinstance(c, DashboardComponent):
                console.print(f"dashboard: {c.url}  (watch the pool on its Pools page)")
        orch, db = await cluster_clients(cluster, spec, max_size=4)
        await pools_q.create_pool(db, PoolSpec(
            pool_id=POOL, min_replicas=0, max_replicas=max_replicas,
            target_per_replica=per_replica, worker_cpu_milli=2000, worker_mem_mib=2048,
            worker_db_pool_size=2, expected_revision="", orchestrator="native",
            orchestrator_ref=ref_text))
        run = uuid.uuid4().hex[:8]
        f.phase = "submitting"
        f.t_submit = time.monotonic()
        for i in range(tasks):
            await tasks_q.submit(db, POOL, {"run": run, "i": i, "seconds": seconds},
                                 idempotency_key=f"demo-{run}-{i}")
        # Submitting each again: the same key names the same task, nothing new is queued.
        for i in range(tasks):
            again = await tasks_q.submit(db, POOL, {"run": run, "i": i, "seconds": seconds},
                                         idempotency_key=f"demo-{run}-{i}")
            assert not again.created
        f.submitted = tasks
        f.phase = "scaling up"
        deadline = started + timeout

        async def loop(update: Any) -> None:
            while True:
                if time.monotonic() > deadline:
                    raise DemoTimeout(f.phase)
                await _observe(db, orch, ref, cluster, f)
                now = time.monotonic()
                if f.replicas and f.t_first_replica is None:
                    f.t_first_replica = now
                if f.done + f.failed >= tasks and f.t_all_done is None:
                    f.t_all_done = now
                    f.phase = "all done; draining and scaling down"
                elif f.t_first_replica is not None and f.t_all_done is None:
                    f.phase = "running tasks"
                if f.t_all_done is not None and f.replicas == 0:
                    f.t_scaled_down = now
                    f.phase = "scaled down to 0"
                    update()
                    return
                update()
                await asyncio.sleep(0.5)

        if live:
            with Live(_view(f, started), console=console, refresh_per_second=4) as lv:
                await loop(lambda: lv.update(_view(f, started)))
        else:
            last = [""]

            def plain() -> None:
                line = (f"{f.phase}: queued {f.queued} running {f.running} done {f.done} "
                        f"replicas {f.replicas} {f.per_node}")
                if line != last[0]:
                    console.print(line, soft_wrap=True)
                    last[0] = line
            await loop(plain)
        done, dups, lost, reruns = await _check(db, tasks, run)
        f.done = done
        t_up = (f.t_first_replica or f.t_submit) - f.t_submit
        t_down = (f.t_scaled_down or 0.0) - (f.t_all_done or 0.0)
        console.print(
            f"demo summary: tasks done {done}/{tasks}, duplicates {dups}, lost {lost}, "
            f"peak replicas {f.peak}, scale up {t_up:.1f} s (first replica after submit), "
            f"scale down {t_down:.1f} s (all done to 0 replicas), re-runs {reruns}, "
            f"total {time.monotonic() - started:.1f} s", soft_wrap=True)
        if done != tasks or dups or lost:
            raise click.ClickException("the demo did not run every task exactly once")
        return f
    finally:
        # In a task of its own: this one may be cancelled (Ctrl-C), and the shutdown's
        # own timeouts must still work. A second Ctrl-C does not interrupt it.
        await asyncio.shield(asyncio.create_task(_shutdown(cluster, db, orch, ref, console)))


async def _shutdown(cluster: LocalCluster, db: Any, orch: NativeOrchestrator | None,
                    ref: PoolRef, console: Console) -> None:
    if orch is not None:
        # No worker left behind: terminate whatever the pool still has.
        try:
            if (await orch.pool_state(ref)).instances:
                await orch.scale_pool(ref, 0, request_id="demo-cleanup")
        except Exception as exc:  # the gateway may already be gone
            console.print(f"cleanup: could not terminate the pool's instances: {exc}")
    if db is not None:
        await db.close()
    console.print("stopping roost ...")
    await cluster.stop()
    if orch is not None:
        await orch.close()


@click.command("demo")
@click.option("--tasks", type=click.IntRange(1), default=60, show_default=True,
              help="How many tasks to submit in the burst.")
@click.option("--task-seconds", type=click.FloatRange(0), default=0.3, show_default=True,
              help="How long each task sleeps.")
@click.option("--max-replicas", type=click.IntRange(1), default=6, show_default=True)
@click.option("--per-replica", type=click.IntRange(1), default=4, show_default=True,
              help="Outstanding tasks per replica the controller aims for.")
@click.option("--timeout", type=click.FloatRange(1), default=180.0, show_default=True,
              help="Give up (exit 1) after this many seconds.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the demo's cluster keeps its state [default: a temporary "
                   "directory, removed afterwards].")
@click.option("--no-live", is_flag=True, help="Print plain lines instead of a live table.")
def demo(tasks: int, task_seconds: float, max_replicas: int, per_replica: int,
         timeout: float, data_dir: Path | None, no_live: bool) -> None:
    """Run the whole autoscaling loop locally: a burst of tasks scales a pool of workers
    up across 3 nodes, they run every task once, and the pool drains back to zero."""
    console = Console()
    tmp = None
    if data_dir is None:
        tmp = Path(tempfile.mkdtemp(prefix="roost-demo-"))
        data_dir = tmp
    # Worker processes inherit the nodes' environment: short leases and quick polls.
    for k, v in {"ROOST_WORKER_LEASE": "5", "ROOST_WORKER_HEARTBEAT": "0.5",
                 "ROOST_WORKER_POLL": "0.1"}.items():
        os.environ.setdefault(k, v)
    key, secret = new_credentials()
    spec = ClusterSpec(
        data_dir=data_dir.absolute(), nodes=3, driver="process", node_capacity="8vcpu,32GiB",
        heartbeat_seconds=0.5, nats_port=free_port(), port=free_port(),
        credentials={key: secret}, postgres_port=free_port(), controller_port=free_port(),
        dashboard_port=free_port())
    components = build_components(spec)
    cluster = LocalCluster(components)
    ctl = cluster.get(ControllerComponent)
    assert isinstance(ctl, ControllerComponent)
    ctl.config = msgspec.structs.replace(ctl.config, interval=1.0, scale_up_window=2.0,
                                         scale_down_window=5.0).validate()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        job = asyncio.current_task()
        assert job is not None
        interrupted: list[bool] = []

        def on_signal() -> None:
            if not interrupted:
                job.cancel()
            interrupted.append(True)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        try:
            await run_demo(cluster, spec, tasks=tasks, seconds=task_seconds,
                           max_replicas=max_replicas, per_replica=per_replica,
                           timeout=timeout, console=console, live=not no_live)
        except asyncio.CancelledError:
            if interrupted:
                raise KeyboardInterrupt from None
            raise
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        console.print("interrupted: roost stopped.")
        raise SystemExit(130) from None
    except DemoTimeout as exc:
        raise click.ClickException(
            f"roost demo timed out after {timeout:.0f} s while {exc}") from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
