"""What the capacity plan sees: one snapshot of every pool's demand, workers and
infrastructure, plus the database's health, and the settings that bound the plan.

Everything here is plain frozen data so that `plan()` stays a pure function: the
controller reads Postgres and the orchestrators, builds a `Snapshot`, and hands it in
with ``now``. An input that could not be read is ``None`` (with the error in
``missing``), never a default: a default would look like "no demand" and scale pools
down on missing data.

Times are float seconds since the epoch, the same clock as ``now``.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field


class WorkerStatus(enum.StrEnum):
    ACTIVE = "active"
    DRAINING = "draining"  # takes no new tasks; removed once it has none
    GONE = "gone"  # its replica was removed; kept for history, ignored by the plan


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """A worker pool as an operator configured it."""

    pool_id: str
    min_replicas: int
    max_replicas: int
    target_per_replica: int
    """Outstanding (queued + running) tasks one replica should carry."""
    worker_cpu_milli: int
    worker_mem_mib: int
    worker_db_pool_size: int
    """Connections one worker may open: its share of the database budget."""
    expected_revision: str = ""
    """The release every worker should run; empty means "don't check"."""
    orchestrator: str = "fake"
    orchestrator_ref: str = ""
    growth_replicas: int = 4
    """Scale-up bound: at most ``max(growth_replicas, growth_percent % of the pool)`` more
    replicas per `PlanSettings.growth_period` (HPA's default behavior: 4 pods or 100 %
    per 15 s, whichever is more), as a rate whatever the tick (`roost.decide.plan.Allowance`)."""
    growth_percent: int = 100
    disruption_replicas: int = 2
    """Scale-down budget: at most ``max(disruption_replicas, disruption_percent % of the
    pool)`` workers start draining per `PlanSettings.disruption_period`."""
    disruption_percent: int = 20
    scale_down_window: int | None = None
    """Seconds demand must stay below the pool's size before it scales down (its
    stabilization, as HPA's ``scaleDown.stabilizationWindowSeconds``), in place of the
    controller's `PlanSettings.scale_down_window` and its lengthening for a small pool.
    None: the controller's. The flap guard can still hold a flapping pool longer."""


MAX_SCALE_DOWN_WINDOW = 3600
"""The longest a pool's own scale-down window may be (HPA's bound, one hour)."""


def pool_spec_problems(spec: PoolSpec) -> list[str]:
    """What is wrong with a pool's autoscaling bounds, in words an operator can act on
    (empty when nothing is). The store refuses such a pool before it reaches the plan."""
    out = []
    if spec.growth_replicas < 1:
        out.append(f"growth_replicas must be >= 1 (got {spec.growth_replicas}): a pool "
                   "that may never grow by one replica cannot follow demand")
    if spec.growth_percent < 0:
        out.append(f"growth_percent must be >= 0 (got {spec.growth_percent})")
    if spec.disruption_replicas < 1:
        out.append(f"disruption_replicas must be >= 1 (got {spec.disruption_replicas}): a "
                   "zero or negative disruption budget never lets the pool scale down")
    if not 0 <= spec.disruption_percent <= 100:
        out.append(f"disruption_percent must be within 0..100 (got "
                   f"{spec.disruption_percent})")
    w = spec.scale_down_window
    if w is not None and (type(w) is not int or not 0 <= w <= MAX_SCALE_DOWN_WINDOW):
        out.append(f"scale_down_window must be whole seconds within "
                   f"0..{MAX_SCALE_DOWN_WINDOW} (got {w!r}); leave it unset for the "
                   "controller's window")
    return out


@dataclass(frozen=True, slots=True)
class Demand:
    queued: int
    running: int
    arrival_rate: float | None = None
    """Tasks created per second over the last `PlanSettings.rate_window`; None when
    not read (the plan then sizes on queued + running alone)."""
    service_time: float | None = None
    """Mean run time, seconds, of the tasks completed over the last
    `PlanSettings.rate_window`; None when none completed."""
    arrival_peak: float | None = None
    """The most tasks created in any `PlanSettings.peak_grain` seconds (buckets aligned
    to the epoch) since the previous read, per second; None when not read. Since the
    previous read, not over the rate window: each burst then counts in one read, so
    the reads sample the rate over time (overlapping windows would count a 10 s burst
    three times and hold room for it as if it were three times as frequent)."""
    completed: int | None = None
    """How many tasks ``service_time`` is the mean of; None when not read (each read
    then weighs as one)."""

    @property
    def outstanding(self) -> int:
        return self.queued + self.running


@dataclass(frozen=True, slots=True)
class PastArrivals:
    """One pool's tasks over the last ``span`` seconds, counted by age in buckets of
    ``grain`` seconds: bucket ``k`` holds what happened ``k x grain`` to ``(k + 1) x
    grain`` seconds before the read. A new leader reads them once from the task table
    so that its demand estimates start from the arrivals it did not see itself
    (`roost.decide.demand.Estimates.read_back`)."""

    grain: float
    span: float
    created: tuple[int, ...] = ()
    """Tasks created, per bucket."""
    completed: tuple[int, ...] = ()
    """Tasks completed (done, having started), per bucket of their finish."""
    ran: tuple[float, ...] = ()
    """The run times of those completed tasks, summed per bucket, seconds."""

    def between(self, young: float, old: float) -> tuple[int, int, float, float]:
        """Created, completed and their summed run time from ``young`` to ``old``
        seconds before the read, and the seconds they cover: the buckets whose middle
        falls in that span (exactly those within it when both ends are whole buckets),
        at least one."""
        lo, hi = self._buckets(young, old)
        hi = max(lo + 1, hi)
        return (sum(self.created[lo:hi]), sum(self.completed[lo:hi]), sum(self.ran[lo:hi]),
                (hi - lo) * self.grain)

    def busiest(self, young: float, old: float) -> int:
        """The most tasks created in one bucket from ``young`` to ``old`` seconds before
        the read (buckets as in `between`)."""
        lo, hi = self._buckets(young, old)
        return max(self.created[lo:hi], default=0)

    def _buckets(self, young: float, old: float) -> tuple[int, int]:
        """The buckets whose middle falls from ``young`` to ``old`` seconds before the
        read, as a slice (empty if none does)."""
        lo = max(0, math.ceil(young / self.grain - 0.5))
        return lo, max(lo, math.ceil(old / self.grain - 0.5))


@dataclass(frozen=True, slots=True)
class WorkerView:
    """One worker as it reported itself (through the worker runtime's heartbeat)."""

    worker_id: str
    status: WorkerStatus
    running_tasks: int
    active_leases: int
    revision: str
    instance_ref: str
    heartbeat_at: float
    draining_since: float | None = None
    removal_target: int | None = None
    """Set when the controller committed to removing this worker's replica: the replica
    count it asked the orchestrator for. A new leader finishes the removal from here."""
    slots: int | None = None
    """Tasks this worker runs at once (its concurrency), as it registered; None when it
    did not say (a worker from before the column)."""

    @property
    def busy(self) -> int:
        return self.running_tasks + self.active_leases


@dataclass(frozen=True, slots=True)
class InstanceView:
    """One replica as the orchestrator sees it (a pod, an instance, a host)."""

    ref: str
    ready: bool
    termination_priority: int = 0


@dataclass(frozen=True, slots=True)
class NodeFigures:
    """A node that can run this pool's workers, in the units of `roost.domain.resources`."""

    node_id: str
    allocatable_cpu_milli: int
    allocatable_mem_mib: int
    used_cpu_milli: int
    used_mem_mib: int
    memory_pressure: bool = False


@dataclass(frozen=True, slots=True)
class Infra:
    """The orchestrator's view of a pool."""

    target_replicas: int
    """How many replicas the orchestrator is trying to run: the current size."""
    instances: tuple[InstanceView, ...]
    nodes: tuple[NodeFigures, ...]
    observed_at: float
    removal_batch: int | None = None
    """The most replicas the orchestrator removes safely in one request (None: any
    number, as every adapter roost ships says: the Kubernetes one verifies each marked
    pod of a batch). An adapter that can verify only one at a time says 1: drains still
    run in parallel, removals then go one per tick."""

    @property
    def settled(self) -> bool:
        """Every replica the orchestrator wants exists and is ready.

        Kubernetes removes not-ready and pending pods before it looks at deletion cost,
        so a replica is removed only while the pool is settled: then the drained worker
        is the one that goes.
        """
        return len(self.instances) == self.target_replicas and all(
            i.ready for i in self.instances
        )


@dataclass(frozen=True, slots=True)
class DbHealth:
    max_connections: int
    reserved_connections: int
    """superuser_reserved_connections + reserved_connections: not for applications."""
    sync_peers: int
    """Synchronous replication peers currently attached (pg_stat_replication)."""
    in_recovery: bool
    observed_at: float
    clock_offset: float = 0.0
    """The database's clock minus the controller's, seconds, as read with the rest."""


@dataclass(frozen=True, slots=True)
class PoolInputs:
    spec: PoolSpec
    demand: Demand | None
    workers: tuple[WorkerView, ...] | None
    infra: Infra | None
    missing: tuple[str, ...] = ()
    """Why an input is None, e.g. ``"infra: orchestrator 'k8s' timed out"``."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    pools: tuple[PoolInputs, ...]
    db: DbHealth | None
    read_at: float
    """When demand and workers were read (one pass over Postgres)."""
    errors: tuple[str, ...] = field(default=())
    """Read errors that concern every pool (e.g. the database health query)."""


@dataclass(frozen=True, slots=True)
class PlanSettings:
    """Every knob of the plan. Durations in seconds, percents in 0..100."""

    scale_up_window: float = 30.0
    scale_down_window: float = 60.0
    """Shorter than HPA's 300 s, since a scale-down removes only a drained worker, one at
    a time, with the queue empty: an early one costs a restart later, never work."""
    small_pool_replicas: int = 5
    """Below this many replicas a pool waits longer to scale down:
    ``scale_down_window * small_pool_replicas / replicas`` (300 s at one replica with the
    defaults, as HPA). Removing one of n replicas takes 1/n of the capacity, and a
    removal made too early costs a replica's startup of queueing, which a small pool
    feels most. 1 turns it off."""
    drain_timeout: float = 600.0
    memory_target_percent: float = 80.0
    memory_hard_percent: float = 90.0
    cpu_target_percent: float = 80.0
    max_input_age: float = 30.0
    heartbeat_timeout: float = 30.0
    db_total_connections: int | None = None
    """Overrides max_connections - reserved (e.g. behind a pooler); None reads the server."""
    db_non_worker_connections: int = 10
    db_connections_per_sync_peer: int = 1
    db_expected_sync_peers: int = 0
    rate_window: float = 30.0
    """The window the arrival rate and service time are measured over (the controller's
    query and the bench compute the same figures)."""
    service_smoothing: float = 60.0
    """Time constant of the moving average of the service time, seconds."""
    startup_default: float = 30.0
    """Replica start-up time assumed until the pool has shown its own."""
    drain_horizon: float = 5.0
    """Backlog left after the replicas already there (or starting) have done what they
    can is sized to drain within this many seconds of new replicas starting, or one
    service time if that is longer. Tasks are served oldest first, so this is the queue
    wait of a task that arrives as they start: the wait aimed at."""
    growth_period: float = 15.0
    disruption_period: float = 60.0
    interval: float = 10.0
    """Seconds between the controller's reads of demand and the orchestrator (its tick):
    a jump in the arrivals shows only at the next read, so the room held for one counts
    it (`roost.decide.demand.jump_share`). The controller sets it from its own
    interval."""
    flap_window: float = 300.0
    """A pool that grows again within this long of a scale-down, while short of
    capacity (an overdue backlog that would wait longer than ``drain_horizon``), waits
    this long (HPA's stabilization) before its next scale-down, for as long again."""
    headroom_window: float = 600.0
    """The arrival rates read over this long size the headroom: twice HPA's 300 s
    stabilization, so that bursts up to 300 s apart are seen at least twice (the
    headroom holds only for bursts that recur)."""
    peak_grain: float = 5.0
    """The arrival rate's peak is read at this grain: the most tasks created in any
    ``peak_grain`` seconds since the previous read. The headroom is sized on it
    (`roost.decide.demand.burst_rate`)."""
    headroom_sigmas: float = 2.0
    """The pool holds capacity for the arrival rate this many standard deviations above
    its mean over `headroom_window` (a one-sided normal quantile: 2 is about 97.7 %), so
    that a burst finds room before a new replica could start. 0 turns it off. The same
    quantile bounds the noise within which the running count and arrivals x service
    are taken to agree (`roost.decide.demand.in_service`); 0 sizes on the running count
    alone, as before."""

    def validate(self) -> None:
        """Raise ValueError on settings that would make the plan meaningless."""
        for name in ("scale_up_window", "scale_down_window", "drain_timeout",
                     "max_input_age", "heartbeat_timeout", "service_smoothing",
                     "startup_default", "headroom_sigmas", "interval"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in ("rate_window", "drain_horizon", "growth_period", "disruption_period",
                     "flap_window", "headroom_window", "peak_grain"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.peak_grain > self.rate_window:
            raise ValueError("peak_grain must be <= rate_window (the peak is read within it)")
        if self.small_pool_replicas < 1:
            raise ValueError("small_pool_replicas must be >= 1")
        if not 0 < self.memory_target_percent <= self.memory_hard_percent <= 100:
            raise ValueError("need 0 < memory target % <= memory hard % <= 100")
        if not 0 < self.cpu_target_percent <= 100:
            raise ValueError("need 0 < cpu target % <= 100")
        if self.db_total_connections is not None and self.db_total_connections < 0:
            raise ValueError("db_total_connections must be >= 0")
        for name in ("db_non_worker_connections", "db_connections_per_sync_peer",
                     "db_expected_sync_peers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
