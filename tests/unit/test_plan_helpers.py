"""Small builders for capacity-plan snapshots, shared by the plan tests (no tests here).

Defaults describe a calm pool: 2 ready replicas with fresh, idle workers on one roomy
node, a healthy database with plenty of connections, and no demand.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from roost.decide.plan import Plan, PoolHistory, plan
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

NOW = 100_000.0
SETTINGS = PlanSettings(
    scale_up_window=30, scale_down_window=60, drain_timeout=120, max_input_age=30,
    heartbeat_timeout=30, memory_target_percent=80, memory_hard_percent=90,
    cpu_target_percent=80, db_non_worker_connections=10,
    small_pool_replicas=1,  # the plain windows; test_small_pool_waits_longer has its own
)


def spec(pool_id: str = "p", **kw: object) -> PoolSpec:
    """A pool with no growth bound to speak of and a disruption budget of one worker at
    a time, so each rule shows alone; test_plan_bounds.py covers both bounds."""
    base = PoolSpec(pool_id, min_replicas=0, max_replicas=10, target_per_replica=5,
                    worker_cpu_milli=1000, worker_mem_mib=1024, worker_db_pool_size=2,
                    growth_replicas=1000, disruption_replicas=1, disruption_percent=0)
    return replace(base, **kw)  # type: ignore[arg-type]


def node(node_id: str = "n1", *, cpu: int = 64_000, mem: int = 262_144, used_cpu: int = 0,
         used_mem: int = 0, pressure: bool = False) -> NodeFigures:
    return NodeFigures(node_id, cpu, mem, used_cpu, used_mem, pressure)


def worker(worker_id: str, *, status: WorkerStatus = WorkerStatus.ACTIVE, running: int = 0,
           leases: int = 0, revision: str = "r1", ref: str | None = None,
           hb: float = NOW, draining_since: float | None = None,
           removal: int | None = None) -> WorkerView:
    return WorkerView(worker_id, status, running, leases, revision, ref or f"i-{worker_id}",
                      hb, draining_since, removal)


def pool(
    s: PoolSpec | None = None,
    *,
    queued: int = 0,
    running: int = 0,
    replicas: int = 2,
    workers: Iterable[WorkerView] | None = None,
    nodes: Iterable[NodeFigures] | None = None,
    unready: Iterable[str] = (),
    instances: Iterable[str] | None = None,
    infra_at: float = NOW,
    missing: Iterable[str] = (),
    no_demand: bool = False,
    no_workers: bool = False,
    no_infra: bool = False,
) -> PoolInputs:
    s = s or spec()
    ws = tuple(workers) if workers is not None else tuple(
        worker(f"{s.pool_id}-w{i}") for i in range(replicas)
    )
    refs = list(instances) if instances is not None else [w.instance_ref for w in ws]
    bad = set(unready)
    infra = Infra(
        target_replicas=replicas,
        instances=tuple(InstanceView(r, r not in bad) for r in refs),
        nodes=tuple(nodes) if nodes is not None else (node(),),
        observed_at=infra_at,
    )
    return PoolInputs(
        s,
        None if no_demand else Demand(queued, running),
        None if no_workers else ws,
        None if no_infra else infra,
        tuple(missing),
    )


def db(*, max_connections: int = 200, reserved: int = 3, sync_peers: int = 0,
       in_recovery: bool = False, at: float = NOW) -> DbHealth:
    return DbHealth(max_connections, reserved, sync_peers, in_recovery, at)


def snap(*pools: PoolInputs, health: DbHealth | None = None, read_at: float = NOW,
         no_db: bool = False, errors: Iterable[str] = ()) -> Snapshot:
    return Snapshot(tuple(pools), None if no_db else (health or db()), read_at, tuple(errors))


def held(outstanding: int | Iterable[int], *, seconds: float = 100, step: float = 10
         ) -> PoolHistory:
    """A history with a sample every ``step`` seconds over the past ``seconds``, ending
    one step before NOW (the plan adds NOW's own sample); the arrivals' levels the same
    figures, as without the model."""
    n = int(seconds // step)
    values = [outstanding] * n if isinstance(outstanding, int) else list(outstanding)
    times = [NOW - step * (len(values) - i) for i in range(len(values))]
    series = tuple(zip(times, values, strict=True))
    return PoolHistory(series, levels=series)


def run(s: Snapshot, history: Mapping[str, PoolHistory] | None = None, *,
        settings: PlanSettings = SETTINGS, now: float = NOW) -> Plan:
    return plan(s, history or {}, now=now, settings=settings)
