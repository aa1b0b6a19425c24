"""``roost bench autoscale``: a real per-minute demand curve against three autoscalers.

The WorldCup98 requests-per-minute curve (or any ``minute,count`` CSV) is scaled so its
busiest minute arrives at ``--peak`` tasks per second, and replayed as tasks on a
simulated clock: Poisson arrivals within each minute and lognormal service times, both
seeded. A simulated pool runs them: each worker has ``--slots`` task slots, a new
replica takes ``--startup`` seconds before it takes work, and queued tasks go, oldest
first, to the least-loaded active worker.

Three policies drive the same pool, in the same run, with the same target of
outstanding tasks per replica:

- **roost**: every ``--interval`` seconds the benchmark builds a
  `roost.decide.snapshot.Snapshot` of the pool (demand, workers, instances) the way
  `roost.controller.inputs.read_snapshot` does and calls `roost.decide.plan.plan`, the
  function the controller calls, with the history it returned last tick. The steps are
  applied as the controller's actuator applies them: ``ScaleUp`` asks for more replicas,
  ``MarkDraining`` makes a worker take no new tasks, ``RemoveReplica`` (issued by the
  plan only once its workers report nothing running) gives their instances the lowest
  termination priority and asks once for that many replicas fewer, so the drained ones
  go; ``Reactivate`` gives a worker its tasks back. The demand model gets what the
  controller's queries read: tasks created per second and the mean run time of the
  tasks finished, over the last ``rate_window`` seconds, and the busiest
  ``peak_grain`` seconds of arrivals since the previous tick.
- **hpa**: Kubernetes' HPA algorithm every 15 s: ``desired = ceil(current *
  metric / target)`` with the metric outstanding (queued + running) tasks per replica,
  no change within a 0.1 tolerance, a 300 s scale-down stabilization (the highest
  recommendation over the window wins) and the default scale-up limit (the larger of
  +100 % and +4 pods per 15 s).
- **keda**: KEDA's queue scaler through the same HPA rules: the metric is the lag
  (queued tasks, not yet started), ``desired = ceil(lag / target)``, at least one
  replica.

HPA and KEDA remove replicas at once: a pending replica first (as Kubernetes does),
then a random ready one; its running tasks are killed and queued again (their queue
wait counts from their first arrival). roost must kill none.
"""

from __future__ import annotations

import csv
import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import click
import numpy as np
import numpy.typing as npt
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from roost.bench.report import fmt, machine, markdown_table, write_json
from roost.bench.traces import default_data_dir
from roost.decide.demand import past_span
from roost.decide.drain import MarkDraining, Reactivate, RemoveReplica, ScaleUp
from roost.decide.plan import Plan, PoolHistory, plan, read_back, remembered
from roost.decide.snapshot import (
    MAX_SCALE_DOWN_WINDOW,
    DbHealth,
    Demand,
    Infra,
    InstanceView,
    NodeFigures,
    PastArrivals,
    PlanSettings,
    PoolInputs,
    PoolSpec,
    Snapshot,
    WorkerStatus,
    WorkerView,
)

WORLDCUP98 = "worldcup98"
WORLDCUP_FILE = "invocation_count.csv"
POLICIES = ("roost", "hpa", "keda")
POOL = "bench"
EPOCH = 1_700_000_000.0
"""Simulated time 0 as an epoch time: the plan sees ordinary timestamps."""
QUICK_MINUTES = 20
SLOTS = 4
"""Tasks one worker runs at once by default, in the suite too."""
TARGET_PER_REPLICA = 3
"""Outstanding tasks per replica by default (every policy's), in the suite too."""
SERVICE_SIGMA = 0.6
"""The service times' lognormal sigma by default, in the suite too (`roost.bench.suite`)."""
MAX_SERVICE_SIGMA = 4.0
"""Past it a lognormal's mean rests on a handful of tasks a run draws (at sigma 4 the
mean is e^8, about 3,000 times the median): the run would not show the mean asked for."""
HPA_SYNC = 15.0
HPA_TOLERANCE = 0.1
HPA_DOWN_WINDOW = 300.0


# ---------------------------------------------------------------------------- demand


def read_demand(path: Path) -> list[float]:
    """Per-minute counts from a CSV whose last column is the count (a header is skipped)."""
    out: list[float] = []
    with path.open(newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            try:
                out.append(float(row[-1]))
            except ValueError:
                continue  # the header
    if not out:
        raise click.ClickException(f"{path}: no per-minute counts found")
    return out


def busiest_window(counts: Sequence[float], minutes: int) -> int:
    """The start of the ``minutes``-long window with the most requests."""
    if minutes >= len(counts):
        return 0
    c = np.cumsum(np.asarray([0.0, *counts]))
    sums = c[minutes:] - c[:-minutes]
    return int(np.argmax(sums))


def rates_per_second(counts: Sequence[float], peak: float) -> list[float]:
    """Scale a window of per-minute counts so its busiest minute is ``peak`` tasks/s."""
    top = max(counts) if counts else 0.0
    if top <= 0:
        return [0.0 for _ in counts]
    return [c / top * peak for c in counts]


@dataclass(frozen=True, slots=True)
class Workload:
    arrivals: npt.NDArray[np.float64]
    service: npt.NDArray[np.float64]
    rates: list[float]
    """Scaled demand, tasks per second, per minute."""

    @property
    def seconds(self) -> float:
        return 60.0 * len(self.rates)


def make_workload(rates: Sequence[float], *, service_mean: float, service_sigma: float,
                  seed: int, resolution: float = 60.0) -> Workload:
    """Poisson arrivals within each ``resolution``-second bucket of ``rates`` (tasks/s)
    and lognormal service times (mean ``service_mean``; ``service_sigma`` 0 means
    fixed), from one seeded generator."""
    rng = np.random.default_rng(seed)
    counts = rng.poisson(np.asarray(rates, dtype=np.float64) * resolution)
    starts = np.repeat(np.arange(len(rates), dtype=np.float64) * resolution, counts)
    arrivals = np.sort(starts + rng.uniform(0.0, resolution, len(starts)))
    return with_service(arrivals, per_minute(rates, resolution), service_mean=service_mean,
                        service_sigma=service_sigma, rng=rng)


def per_minute(rates: Sequence[float], resolution: float) -> list[float]:
    """Mean rate per minute of rates given per ``resolution`` seconds."""
    if resolution == 60.0:
        return list(rates)
    per = max(1, round(60.0 / resolution))
    a = np.asarray(rates, dtype=np.float64)
    pad = (-len(a)) % per
    a = np.concatenate([a, np.zeros(pad)]).reshape(-1, per)
    return [float(x) for x in a.mean(axis=1)]


def with_service(arrivals: npt.NDArray[np.float64], minute_rates: Sequence[float], *,
                 service_mean: float, service_sigma: float,
                 rng: np.random.Generator) -> Workload:
    if service_sigma > 0:
        mu = math.log(service_mean) - service_sigma ** 2 / 2
        service = rng.lognormal(mu, service_sigma, len(arrivals))
    else:
        service = np.full(len(arrivals), service_mean)
    return Workload(arrivals, service, list(minute_rates))


# ---------------------------------------------------------------------------- the pool


@dataclass(slots=True)
class Worker:
    worker_id: str
    instance_ref: str
    ready_at: float
    status: WorkerStatus = WorkerStatus.ACTIVE
    running: set[int] = field(default_factory=set)
    draining_since: float | None = None
    removal_target: int | None = None
    priority: int = 0


@dataclass(frozen=True, slots=True)
class SimConfig:
    slots: int = SLOTS
    target_per_replica: int = TARGET_PER_REPLICA
    startup: float = 30.0
    interval: float = 10.0
    """roost's controller tick."""
    min_replicas: int = 1
    max_replicas: int = 1000
    settings: PlanSettings = field(default_factory=PlanSettings)
    seed: int = 42
    phase: float = 0.0
    """Where each policy's tick grid falls against the demand, in [0, 1): its first tick
    comes at its interval x (1 + phase). A curve whose bursts start on multiples of a
    policy's tick (the spike train's, every 300 s, on HPA's 15 s and roost's 10 s) is
    seen differently at each phase."""
    pool_down_window: int | None = None
    """The pool's own scale-down window (`PoolSpec.scale_down_window`) for roost; None:
    the controller's."""
    failover_every: float | None = None
    """roost's controller changes leader this often (seconds): its history starts afresh
    with the start-up remembered, as a new leadership's; None: never."""
    read_back: bool = True
    """On a change of leader, the new one reads the arrivals before it back from the
    tasks (`roost.decide.plan.read_back`), as the controller does."""


class Pool:
    """Workers, the queue and the clock: the event-driven simulation."""

    def __init__(self, work: Workload, cfg: SimConfig, initial: int) -> None:
        self.work = work
        self.cfg = cfg
        self.now = 0.0
        self.queue: deque[int] = deque()
        self.workers: dict[str, Worker] = {}
        self.target = 0
        self._serial = 0
        self._seq = 0
        self.events: list[tuple[float, int, int, Any]] = []
        self.free: list[tuple[int, str]] = []
        self.attempt = np.zeros(len(work.arrivals), dtype=np.int64)
        self.started = np.full(len(work.arrivals), np.nan)
        self.done = 0
        self.killed = 0
        self.actions: list[int] = []  # +1 / -1 per change of the asked replica count
        self.replica_seconds = 0.0
        self.minute_replicas = np.zeros(len(work.rates) + 1)
        self.peak_replicas = initial
        self.completions: deque[tuple[float, float]] = deque()
        """(finish time, service seconds) of recent completions, for the estimate."""
        self.finished: deque[tuple[float, float]] = deque()
        """The same, over as long as a new leader reads back (`past`); kept only when
        the controller changes leader."""
        self._last = 0.0
        self._add(initial, ready_at=0.0)
        self.target = initial

    # -- bookkeeping
    def _push(self, t: float, kind: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind, payload))

    def _advance(self, t: float) -> None:
        """Account replica-seconds (every instance, starting or not) up to ``t``."""
        n = len(self.workers)
        a = self._last
        while a < t:
            m = int(a // 60)
            b = min(t, 60.0 * (m + 1))
            if m < len(self.minute_replicas):
                self.minute_replicas[m] += n * (b - a)
            a = b
        self.replica_seconds += n * (t - self._last)
        self._last = t
        self.now = t

    def _add(self, count: int, *, ready_at: float) -> None:
        for _ in range(count):
            self._serial += 1
            ref = f"i-{self._serial:05d}"
            w = Worker(f"w-{self._serial:05d}", ref, ready_at)
            self.workers[w.worker_id] = w
            if ready_at > self.now:
                self._push(ready_at, READY, w.worker_id)
            else:
                self.offer(w)

    def ready(self, w: Worker) -> bool:
        return w.ready_at <= self.now

    def outstanding(self) -> tuple[int, int]:
        running = sum(len(w.running) for w in self.workers.values())
        return len(self.queue), running

    def rates(self, window: float, grain: float, span: float
              ) -> tuple[float, float | None, int, float]:
        """What the controller's queries read: tasks created per second over the last
        ``window`` seconds, the mean run time of the tasks completed in it and how many
        they are, and the most tasks created in any ``grain`` seconds of the last
        ``span`` (since the previous read; buckets aligned to the epoch, as the
        database's), per second."""
        arrivals = self.work.arrivals
        lo = int(np.searchsorted(arrivals, self.now - window, side="right"))
        hi = int(np.searchsorted(arrivals, self.now, side="right"))
        while self.completions and self.completions[0][0] <= self.now - window:
            self.completions.popleft()
        service = (sum(x for _, x in self.completions) / len(self.completions)
                   if self.completions else None)
        peak = 0.0
        since = int(np.searchsorted(arrivals, self.now - span, side="right"))
        if hi > since:
            buckets = np.floor((EPOCH + arrivals[since:hi]) / grain).astype(np.int64)
            peak = float(np.bincount(buckets - buckets[0]).max()) / grain
        return (hi - lo) / window, service, len(self.completions), peak

    def past(self, span: float, grain: float) -> PastArrivals:
        """What the store's `runtime.read_past` reads: the tasks created and completed
        over the last ``span`` seconds, counted by age in buckets of ``grain``."""
        n = max(1, math.ceil(span / grain))
        arrivals = self.work.arrivals
        lo = int(np.searchsorted(arrivals, self.now - span, side="right"))
        hi = int(np.searchsorted(arrivals, self.now, side="right"))
        created = np.bincount(((self.now - arrivals[lo:hi]) // grain).astype(np.int64),
                              minlength=n)[:n]
        while self.finished and self.finished[0][0] <= self.now - span:
            self.finished.popleft()
        done = np.asarray(self.finished, dtype=np.float64).reshape(-1, 2)
        ages = ((self.now - done[:, 0]) // grain).astype(np.int64)
        completed = np.bincount(ages, minlength=n)[:n]
        ran = np.bincount(ages, weights=done[:, 1], minlength=n)[:n]
        return PastArrivals(grain, span, tuple(int(x) for x in created),
                            tuple(int(x) for x in completed), tuple(float(x) for x in ran))

    def _record(self, before: int, after: int) -> None:
        if after != before:
            self.actions.append(1 if after > before else -1)

    # -- scaling
    def scale_to(self, replicas: int) -> None:
        """Ask for ``replicas``: start new ones, or remove the lowest termination priority
        first (pending before ready, then random), killing what they run."""
        replicas = max(0, replicas)
        self._record(self.target, replicas)
        if replicas > len(self.workers):
            self._add(replicas - len(self.workers), ready_at=self.now + self.cfg.startup)
            self.peak_replicas = max(self.peak_replicas, len(self.workers))
        while len(self.workers) > replicas:
            ws = list(self.workers.values())
            low = min(w.priority for w in ws)
            cands = [w for w in ws if w.priority == low]
            pending = [w for w in cands if not self.ready(w)]
            victim = pending[-1] if pending else self.rng.choice(cands)
            self._kill(victim)
        self.target = replicas

    def _kill(self, w: Worker) -> None:
        del self.workers[w.worker_id]
        for task in sorted(w.running, reverse=True):
            self.killed += 1
            self.attempt[task] += 1  # its completion event goes stale
            self.started[task] = np.nan
            self.queue.appendleft(task)

    # -- dispatch
    def offer(self, w: Worker) -> None:
        """Note that ``w`` may take a task (a lazy heap: entries are checked on use)."""
        if (w.status is WorkerStatus.ACTIVE and self.ready(w)
                and len(w.running) < self.cfg.slots):
            heapq.heappush(self.free, (len(w.running), w.worker_id))

    def dispatch(self) -> None:
        """Queued tasks, oldest first, to the least-loaded active ready worker."""
        while self.queue and self.free:
            load, wid = heapq.heappop(self.free)
            w = self.workers.get(wid)
            if (w is None or w.status is not WorkerStatus.ACTIVE or not self.ready(w)
                    or len(w.running) != load or load >= self.cfg.slots):
                continue
            task = self.queue.popleft()
            w.running.add(task)
            self.started[task] = self.now
            self._push(self.now + float(self.work.service[task]), DONE,
                       (w.worker_id, task, int(self.attempt[task])))
            self.offer(w)

    rng: random.Random


READY, DONE, TICK = 0, 1, 2


# ---------------------------------------------------------------------------- policies


class RoostPolicy:
    """Builds the controller's snapshot of the simulated pool and applies the plan."""

    name = "roost"

    def __init__(self, cfg: SimConfig,
                 on_plan: Callable[[float, Snapshot, Plan], None] | None = None) -> None:
        self.cfg = cfg
        self.on_plan = on_plan
        """Called with (seconds since the start, the snapshot, the plan) at every tick:
        `roost bench autoscale --trace` prints from it."""
        self.interval = cfg.interval
        self.history: dict[str, PoolHistory] = {}
        self.spec = PoolSpec(POOL, min_replicas=cfg.min_replicas,
                             max_replicas=cfg.max_replicas,
                             target_per_replica=cfg.target_per_replica,
                             worker_cpu_milli=500, worker_mem_mib=512, worker_db_pool_size=1,
                             scale_down_window=cfg.pool_down_window)
        self.node = NodeFigures("sim-node", 10_000_000, 100_000_000, 0, 0)
        # the simulated controller reads at its own tick (`PlanSettings.interval`)
        self.settings = replace(cfg.settings, interval=cfg.interval)
        self.leaderships = 0
        """Changes of the controller's leader so far (`SimConfig.failover_every`)."""

    def snapshot(self, pool: Pool, now: float) -> Snapshot:
        queued, running = pool.outstanding()
        views = []
        for w in pool.workers.values():
            if not pool.ready(w):
                continue  # a worker reports itself once its replica has started
            views.append(WorkerView(
                worker_id=w.worker_id, status=w.status, running_tasks=len(w.running),
                active_leases=0, revision="", instance_ref=w.instance_ref,
                heartbeat_at=now, draining_since=w.draining_since,
                removal_target=w.removal_target, slots=self.cfg.slots,
            ))
        instances = tuple(InstanceView(w.instance_ref, pool.ready(w), w.priority)
                          for w in pool.workers.values())
        infra = Infra(pool.target, instances, (self.node,), now)
        db = DbHealth(max_connections=100_000, reserved_connections=3, sync_peers=0,
                      in_recovery=False, observed_at=now)
        rate, service, done, peak = pool.rates(
            self.settings.rate_window, self.settings.peak_grain,
            min(self.interval, self.settings.rate_window))
        inputs = PoolInputs(self.spec, Demand(queued, running, rate, service, peak, done),
                            tuple(views), infra)
        return Snapshot((inputs,), db, now)

    def new_leader(self, pool: Pool, now: float) -> None:
        """What a change of the controller's leader leaves the plan: its history afresh,
        the start-up remembered (published with the plan) and, as the controller does,
        the arrivals before it read back from the tasks (`roost.decide.plan.read_back`)."""
        s = self.settings
        startup = self.history[POOL].estimates.startup if POOL in self.history else None
        self.history = remembered({}, {} if startup is None else {POOL: startup})
        if self.cfg.read_back:
            past = pool.past(past_span(startup, s), s.peak_grain)
            self.history = read_back(self.history, {POOL: past}, now=now, settings=s)

    def tick(self, pool: Pool) -> None:
        now = EPOCH + pool.now
        every = self.cfg.failover_every
        if every is not None and pool.now >= every * (self.leaderships + 1):
            self.leaderships += 1
            self.new_leader(pool, now)
        snap = self.snapshot(pool, now)
        p = plan(snap, self.history, now=now, settings=self.settings)
        if self.on_plan is not None:
            self.on_plan(pool.now, snap, p)
        self.history = p.history
        for step in p.steps:
            match step:
                case ScaleUp():
                    pool.scale_to(step.replicas)
                case MarkDraining():
                    w = pool.workers[step.worker_id]
                    w.status, w.draining_since = WorkerStatus.DRAINING, now
                case Reactivate():
                    w = pool.workers[step.worker_id]
                    w.status, w.draining_since, w.priority = WorkerStatus.ACTIVE, None, 0
                    pool.offer(w)
                case RemoveReplica():
                    victims = [pool.workers[wid] for wid, _ in step.victims]
                    if step.replicas is not None:
                        for w in victims:
                            w.removal_target = step.replicas
                            w.priority = step.priority
                        pool.scale_to(step.replicas)
                    # mark gone: the simulated orchestrator removed them at once
                    for w in victims:
                        pool.workers.pop(w.worker_id, None)


class HpaPolicy:
    """Kubernetes' HPA algorithm (or KEDA's queue scaler through it)."""

    def __init__(self, cfg: SimConfig, *, lag_only: bool) -> None:
        self.cfg = cfg
        self.name = "keda" if lag_only else "hpa"
        self.lag_only = lag_only
        self.interval = HPA_SYNC
        self.recs: deque[tuple[float, int]] = deque()
        self.last_up = -math.inf

    def desired(self, current: int, queued: int, running: int) -> int:
        target = self.cfg.target_per_replica
        metric_total = queued if self.lag_only else queued + running
        if current <= 0:
            return max(self.cfg.min_replicas, -(-metric_total // target))
        ratio = metric_total / (current * target)
        if abs(ratio - 1.0) <= HPA_TOLERANCE:
            return current
        return math.ceil(current * ratio - 1e-9)

    def tick(self, pool: Pool) -> None:
        now = pool.now
        queued, running = pool.outstanding()
        current = pool.target
        rec = min(max(self.desired(current, queued, running), self.cfg.min_replicas),
                  self.cfg.max_replicas)
        self.recs.append((now, rec))
        while self.recs and self.recs[0][0] < now - HPA_DOWN_WINDOW:
            self.recs.popleft()
        # scale-down stabilization: the highest recommendation over the window, never
        # above the current size (Kubernetes' stabilizeRecommendationWithBehaviors with
        # no scale-up window)
        new = rec if rec > current else min(current, max(r for _, r in self.recs))
        if new > current:  # default scale-up policy: max(+100 %, +4 pods) per 15 s
            new = min(new, max(2 * current, current + 4))
        new = min(max(new, self.cfg.min_replicas), self.cfg.max_replicas)
        if new != current:
            pool.scale_to(new)


Policy = RoostPolicy | HpaPolicy


def make_policy(name: str, cfg: SimConfig) -> Policy:
    if name == "roost":
        return RoostPolicy(cfg)
    return HpaPolicy(cfg, lag_only=name == "keda")


# ---------------------------------------------------------------------------- run


def simulate(work: Workload, policy: Policy, cfg: SimConfig,
             tick: Callable[[int], None] | None = None) -> Pool:
    """Run the workload through the pool under ``policy`` until every task finished."""
    first = work.rates[0] if work.rates else 0.0
    mean = float(work.service.mean()) if len(work.service) else 1.0
    initial = min(max(cfg.min_replicas, math.ceil(first * mean / cfg.target_per_replica)),
                  cfg.max_replicas)
    pool = Pool(work, cfg, initial)
    pool.rng = random.Random(cfg.seed)
    arrivals = work.arrivals
    n = len(arrivals)
    i = 0
    pool._push(policy.interval * (1.0 + cfg.phase), TICK, None)
    reported = 0
    while pool.done < n:
        nxt = pool.events[0][0] if pool.events else math.inf
        if i < n and arrivals[i] <= nxt:
            pool._advance(float(arrivals[i]))
            while i < n and arrivals[i] <= pool.now:
                pool.queue.append(i)
                i += 1
            pool.dispatch()
            continue
        t, _, kind, payload = heapq.heappop(pool.events)
        pool._advance(t)
        if kind == DONE:
            wid, task, attempt = payload
            if attempt != pool.attempt[task]:
                continue  # killed and queued again
            w = pool.workers.get(wid)
            if w is not None:
                w.running.discard(task)
                pool.offer(w)
            pool.done += 1
            pool.completions.append((pool.now, float(work.service[task])))
            if cfg.failover_every is not None:
                pool.finished.append(pool.completions[-1])
            pool.dispatch()
        elif kind == READY:
            w = pool.workers.get(payload)
            if w is not None:
                pool.offer(w)
            pool.dispatch()
        else:
            policy.tick(pool)
            pool.dispatch()
            pool._push(t + policy.interval, TICK, None)
            if tick is not None and i - reported >= 1000:
                tick(i - reported)
                reported = i
    if tick is not None:
        tick(n - reported)
    return pool


def _reversals(actions: Sequence[int]) -> int:
    return sum(1 for a, b in itertools.pairwise(actions) if a != b)


def minute_p99s(work: Workload, pool: Pool) -> list[tuple[int, float]]:
    """``(minute, p99 queue wait)`` of every minute in which a task arrived."""
    waits = pool.started - work.arrivals
    if not len(waits):
        return []
    minutes = (work.arrivals // 60).astype(np.int64)
    order = np.argsort(minutes, kind="stable")
    m_sorted, w_sorted = minutes[order], waits[order]
    bounds = np.flatnonzero(np.diff(m_sorted)) + 1
    return [(int(m[0]), float(np.percentile(w, 99)))
            for m, w in zip(np.split(m_sorted, bounds), np.split(w_sorted, bounds),
                            strict=True)]


def measure(work: Workload, pool: Pool, policy: str, slo_seconds: float) -> dict[str, Any]:
    """The JSON figures of one policy.

    ``slo_minutes_share``: of the minutes in which at least one task arrived, the share
    whose tasks' p99 queue wait (arrival to the start of the run that completed) is at
    most ``slo_seconds``.
    """
    waits = pool.started - work.arrivals
    served = int(np.count_nonzero(~np.isnan(waits)))
    p99s = minute_p99s(work, pool)
    total = len(p99s)
    met = sum(1 for _, p in p99s if p <= slo_seconds)
    p50 = float(np.percentile(waits, 50)) if len(waits) else 0.0
    p99 = float(np.percentile(waits, 99)) if len(waits) else 0.0
    return {
        "policy": policy,
        "tasks": len(work.arrivals),
        "tasks_served": served,
        "queue_wait_p50": round(p50, 3),
        "queue_wait_p99": round(p99, 3),
        "slo_minutes_share": round(met / total, 4) if total else 1.0,
        "replica_seconds": round(pool.replica_seconds, 1),
        "scale_actions": len(pool.actions),
        "direction_reversals": _reversals(pool.actions),
        "tasks_killed": pool.killed,
        "peak_replicas": pool.peak_replicas,
        "replicas_per_minute": [round(float(x) / 60.0, 2)
                                for x in pool.minute_replicas[:len(work.rates)]],
    }


def plot(path: Path, rates: Sequence[float], results: Sequence[dict[str, Any]],
         *, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 5))
    xs = [m / 60.0 for m in range(len(rates))]
    ax2 = ax.twinx()
    ax2.fill_between(xs, rates, color="0.85", step="post", label="demand")
    ax2.set_ylabel("demand, tasks/s")
    for r in results:
        ax.step(xs, r["replicas_per_minute"], where="post", lw=1.4, label=r["policy"])
    ax.set_zorder(ax2.get_zorder() + 1)
    ax.patch.set_visible(False)
    ax.set_xlabel("hours")
    ax.set_yscale("log")  # a flapping baseline would flatten the others
    ax.set_ylabel("replicas (mean per minute, log scale)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    lines, labels = ax.get_legend_handles_labels()
    l2, lb2 = ax2.get_legend_handles_labels()
    ax.legend(lines + l2, labels + lb2, loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(rates: Sequence[float], policies: Sequence[str], cfg: SimConfig, *,
        service_mean: float, service_sigma: float, slo_seconds: float,
        progress: Progress | None = None) -> list[dict[str, Any]]:
    work = make_workload(rates, service_mean=service_mean, service_sigma=service_sigma,
                         seed=cfg.seed)
    results = []
    for name in policies:
        cb = None
        if progress is not None:
            task = progress.add_task(name, total=len(work.arrivals))
            cb = lambda k, task=task: progress.advance(task, k)  # noqa: E731
        pool = simulate(work, make_policy(name, cfg), cfg, tick=cb)
        results.append(measure(work, pool, name, slo_seconds))
    return results


def _markdown(doc: dict[str, Any]) -> str:
    rows = [[r["policy"], fmt(r["queue_wait_p50"]), fmt(r["queue_wait_p99"]),
             fmt(r["slo_minutes_share"] * 100, 1), f"{r['replica_seconds']:.0f}",
             str(r["scale_actions"]), str(r["direction_reversals"]), str(r["tasks_killed"])]
            for r in doc["results"]]
    head = ["policy", "wait p50 s", "wait p99 s", "SLO minutes %", "replica-s",
            "scale actions", "reversals", "tasks killed"]
    text = "# roost bench autoscale\n\n" + markdown_table(head, rows)
    ratio = doc.get("roost_over_hpa_replica_seconds")
    if ratio is not None:
        text += f"\nroost / hpa replica-seconds: {ratio:.3f}\n"
    text += f"\nSettings: `{doc['settings']}`\n"
    return text


def _floats(text: str, option: str) -> set[float]:
    """A comma-separated list of numbers above 0, each finite (peaks, service times)."""
    try:
        out = {float(x) for x in text.split(",") if x.strip()}
    except ValueError:
        raise click.BadParameter(f"not a comma-separated list of numbers: {text!r}",
                                 param_hint=option) from None
    if not out or not all(0 < x < math.inf for x in out):
        raise click.BadParameter(f"{text!r}: give one number or more, each above 0 and "
                                 "finite", param_hint=option)
    return out


def _spread(sigma: float) -> float:
    """``--service-sigma``: from 0 (every task the mean) to `MAX_SERVICE_SIGMA`."""
    if not 0.0 <= sigma <= MAX_SERVICE_SIGMA:  # NaN fails too
        raise click.BadParameter(f"{sigma:g} is not within 0 and {MAX_SERVICE_SIGMA:g}",
                                 param_hint="--service-sigma")
    return sigma


def _between(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(":"))
    except ValueError:
        raise click.BadParameter(f"not FROM:TO in seconds: {text!r}",
                                 param_hint="--trace-between") from None
    if lo > hi:
        raise click.BadParameter(f"FROM {lo:g} is after TO {hi:g}",
                                 param_hint="--trace-between")
    return lo, hi


@click.command("autoscale")
@click.option("--demand", "demand_path", type=click.Path(path_type=Path, dir_okay=False),
              default=None, help="A per-minute demand CSV (last column: count). "
              f"Default: {WORLDCUP98}/{WORLDCUP_FILE} under --data-dir.")
@click.option("--data-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Where the traces are (default ../shared/data beside the project).")
@click.option("--policy", "policies", multiple=True, type=click.Choice([*POLICIES, "all"]),
              default=("all",), show_default=True, help="Repeat for several.")
@click.option("--peak", type=float, default=40.0, show_default=True,
              help="Task arrival rate (tasks/s) of the window's busiest minute.")
@click.option("--minutes", type=int, default=1440, show_default=True,
              help="Length of the replayed window.")
@click.option("--start", type=int, default=None,
              help="First minute of the window (default: the busiest window).")
@click.option("--service-mean", type=float, default=2.0, show_default=True,
              help="Mean task service time, seconds (lognormal).")
@click.option("--service-sigma", type=float, default=SERVICE_SIGMA, show_default=True,
              callback=lambda _ctx, _param, x: _spread(x),
              help="Lognormal sigma of the service time (0: fixed; at most "
              f"{MAX_SERVICE_SIGMA:g}). Also with --suite and --trace: another spread than "
              "the suite's own, at the same means (with --held-out, every point held out).")
@click.option("--slots", type=click.IntRange(min=1), default=SLOTS,
              show_default=True,
              help="Tasks one worker runs at once. Also with --suite and --trace: "
              "workers the suite's defaults were not chosen on (with --held-out, every "
              "point held out).")
@click.option("--target", "target_per_replica", type=click.IntRange(min=1),
              default=TARGET_PER_REPLICA, show_default=True,
              help="Outstanding tasks per replica, the same for every policy. Also with "
              "--suite and --trace, as --slots.")
@click.option("--startup", type=float, default=30.0, show_default=True,
              help="Seconds from asking for a replica until it takes tasks.")
@click.option("--interval", type=float, default=10.0, show_default=True,
              help="roost's controller tick, seconds.")
@click.option("--up-window", type=float, default=30.0, show_default=True,
              help="roost's PlanSettings.scale_up_window.")
@click.option("--down-window", type=float, default=PlanSettings().scale_down_window,
              show_default=True,
              help="roost's PlanSettings.scale_down_window.")
@click.option("--small-pool", "small_pool_replicas", type=click.IntRange(1),
              default=PlanSettings().small_pool_replicas, show_default=True,
              help="roost's PlanSettings.small_pool_replicas (1: off).")
@click.option("--pool-down-window", type=click.IntRange(0, MAX_SCALE_DOWN_WINDOW),
              default=None,
              help="roost's pool its own scale-down window, seconds (PoolSpec."
              "scale_down_window, `roost pools create --scale-down-window`; default: the "
              "controller's). Also with --suite and --trace: an operator's choice for one "
              "pool, not the suite's defaults.")
@click.option("--slo-seconds", type=float, default=5.0, show_default=True,
              help="A minute meets the SLO when its tasks' p99 queue wait is at most this.")
@click.option("--seed", type=int, default=42, show_default=True)
@click.option("--phase", type=click.FloatRange(0.0, 1.0, max_open=True), default=0.0,
              show_default=True,
              help="Where every policy's tick grid falls against the demand: its first tick "
              "at its interval x (1 + PHASE). (--suite --phases N runs N of them.)")
@click.option("--json", "json_out", type=click.Path(path_type=Path, dir_okay=False),
              default=None, help="Write the results here (.md and .png beside it).")
@click.option("--quick", is_flag=True,
              help=f"A smoke run: {QUICK_MINUTES} minutes at peak 10 tasks/s.")
@click.option("--suite", is_flag=True,
              help="Replay every curve of the suite (roost.bench.suite) with the default "
              "settings; writes suite.json, suite.md and a plot per curve to --out.")
@click.option("--full", is_flag=True,
              help="With --suite: the whole matrix (adds WorldCup98 at peak 100: slow).")
@click.option("--only", default=None,
              help="With --suite: comma-separated curve names to run (default: all).")
@click.option("--peaks", default=None,
              help="With --suite: comma-separated peaks (tasks/s) to run (default: all).")
@click.option("--services", default=None,
              help="With --suite: comma-separated mean service times (s) that replace the "
              "matrix's 0.2 and 30 s, at its peaks and start-ups: points outside the suite, "
              "to check the rules on tasks they were not tuned on.")
@click.option("--baselines", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              default=None,
              help="With --suite: an earlier suite.json of the same seed; its HPA and KEDA "
              "figures are reused (per point, when the task count matches) and only roost "
              "is re-simulated.")
@click.option("--held-out", is_flag=True,
              help="With --suite: this run's seed (and --services' service times) were never "
              "looked at while the defaults were chosen: label its synthetic shapes (with "
              "--services, every point) held out in the results.")
@click.option("--unseen-shapes", "unseen", is_flag=True,
              help="With --suite: replay four shapes the defaults were never chosen on "
              "(ramp-hold, flash-crowd, mmpp-three-level, heavy-tailed-bursts) instead of the "
              "suite's curves, at the same matrix; every point is held out.")
@click.option("--phases", "phase_count", type=click.IntRange(1, 20), default=1,
              show_default=True,
              help="With --suite: run roost and HPA on every point with their first tick at "
              "this many places within a tick (0, 1/N, ...), and read the bar on the "
              "medians: a curve whose bursts fall on a policy's tick grid is then not "
              "judged on where the grid happens to fall. N times slower.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False),
              default=Path("bench-results/autoscale-suite"), show_default=True,
              help="With --suite: where the results go.")
@click.option("--trace", "trace", default=None, metavar="CURVE:PEAK:STARTUP:SERVICE",
              help="Replay one point of the suite (e.g. sawtooth:100:90:0.2) under roost "
              "and print the plan at every tick: demand, the decision, its reason and the "
              "demand model's steps; then the minutes that missed the SLO, roost's and "
              "HPA's (at --phase). Writes no file.")
@click.option("--trace-between", default=None, metavar="FROM:TO",
              help="With --trace: only the ticks between these seconds (e.g. 0:300).")
@click.option("--failover-every", type=click.FloatRange(1.0, max_open=False), default=None,
              metavar="SECONDS",
              help="roost's controller changes leader this often: the new leader's history "
              "starts afresh, with the start-up remembered and the arrivals before it read "
              "back from the tasks, as the controller's (default: never).")
@click.option("--no-read-back", is_flag=True,
              help="With --failover-every: the new leader does not read the arrivals back "
              "(the controller before it did), to measure what reading them back is worth.")
def autoscale(demand_path: Path | None, data_dir: Path | None, policies: tuple[str, ...],
              peak: float, minutes: int, start: int | None, service_mean: float,
              service_sigma: float, slots: int, target_per_replica: int, startup: float,
              interval: float, up_window: float, down_window: float,
              small_pool_replicas: int, pool_down_window: int | None, slo_seconds: float,
              seed: int, phase: float,
              json_out: Path | None, quick: bool, suite: bool, full: bool, only: str | None,
              peaks: str | None, services: str | None, baselines: Path | None,
              held_out: bool, unseen: bool, phase_count: int, out_dir: Path,
              trace: str | None, trace_between: str | None,
              failover_every: float | None, no_read_back: bool) -> None:
    """Replay a per-minute demand curve against roost's plan, HPA and KEDA."""
    if not suite:  # said rather than ignored: the run would not be the one asked for
        given = [flag for flag, on in (
            ("--full", full), ("--only", only is not None), ("--peaks", peaks is not None),
            ("--services", services is not None), ("--baselines", baselines is not None),
            ("--held-out", held_out), ("--unseen-shapes", unseen),
            ("--phases", phase_count > 1)) if on]
        if given:
            raise click.UsageError(f"{', '.join(given)} only with --suite")
    if no_read_back and failover_every is None:
        raise click.UsageError("--no-read-back only with --failover-every")
    if trace is not None:
        from roost.bench.suite_cli import trace_point

        trace_point(data_dir or default_data_dir(), seed=seed, point=trace,
                    between=None if trace_between is None else _between(trace_between),
                    phase=phase, pool_down_window=pool_down_window,
                    service_sigma=service_sigma, slots=slots, target=target_per_replica,
                    failover_every=failover_every, read_back=not no_read_back)
        return
    if suite:
        from roost.bench.suite_cli import run_suite

        run_suite(data_dir or default_data_dir(), out_dir, full=full, seed=seed,
                  only=None if only is None else set(only.split(",")),
                  peaks=None if peaks is None else _floats(peaks, "--peaks"),
                  services=None if services is None else _floats(services, "--services"),
                  baselines=baselines, held_out=held_out, phase_count=phase_count,
                  unseen=unseen, pool_down_window=pool_down_window,
                  service_sigma=service_sigma, slots=slots, target=target_per_replica,
                  failover_every=failover_every, read_back=not no_read_back)
        return
    if demand_path is None:
        demand_path = (data_dir or default_data_dir()) / WORLDCUP98 / WORLDCUP_FILE
    if not demand_path.is_file():
        raise click.ClickException(
            f"{demand_path} not found: get the WorldCup98 per-minute counts "
            "(nimamahmoudi/worldcup98-dataset, see docs/benchmarks.md), or pass --demand.")
    if quick:
        minutes, peak = QUICK_MINUTES, min(peak, 10.0)
    names = list(POLICIES) if "all" in policies else list(dict.fromkeys(policies))
    counts = read_demand(demand_path)
    if start is None:
        start = busiest_window(counts, minutes)
    window = counts[start:start + minutes]
    if not window:
        raise click.ClickException(f"--start {start} is past the end ({len(counts)} minutes)")
    rates = rates_per_second(window, peak)
    settings = PlanSettings(scale_up_window=up_window, scale_down_window=down_window,
                            small_pool_replicas=small_pool_replicas)
    cfg = SimConfig(slots=slots, target_per_replica=target_per_replica, startup=startup,
                    interval=interval, settings=settings, seed=seed, phase=phase,
                    pool_down_window=pool_down_window, failover_every=failover_every,
                    read_back=not no_read_back)
    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total} tasks"), TimeElapsedColumn(),
                  console=console) as progress:
        results = run(rates, names, cfg, service_mean=service_mean,
                      service_sigma=service_sigma, slo_seconds=slo_seconds, progress=progress)
    by = {r["policy"]: r for r in results}
    ratio = None
    if "roost" in by and "hpa" in by and by["hpa"]["replica_seconds"]:
        ratio = by["roost"]["replica_seconds"] / by["hpa"]["replica_seconds"]
    doc: dict[str, Any] = {
        "demand": demand_path.name,
        "start_minute": start,
        "minutes": len(window),
        "peak_tasks_per_second": peak,
        "slo_seconds": slo_seconds,
        "settings": {
            "service": f"lognormal mean {service_mean}s sigma {service_sigma}",
            "slots": slots, "target_per_replica": target_per_replica, "startup": startup,
            "roost_interval": interval, "roost_scale_up_window": up_window,
            "roost_scale_down_window": down_window,
            "roost_small_pool_replicas": small_pool_replicas, "hpa_sync": HPA_SYNC,
            "hpa_tolerance": HPA_TOLERANCE, "hpa_scale_down_stabilization": HPA_DOWN_WINDOW,
            "seed": seed, "phase": phase,
            **({} if pool_down_window is None else
               {"roost_pool_scale_down_window": pool_down_window}),
            **({} if failover_every is None else
               {"roost_failover_every": failover_every,
                "roost_read_back": not no_read_back}),
        },
        "machine": machine(),
        "demand_per_minute": [round(r, 3) for r in rates],
        "results": results,
        "roost_over_hpa_replica_seconds": None if ratio is None else round(ratio, 4),
    }
    table = Table(title=f"autoscale: {len(window)} min from minute {start}, peak {peak:g}/s, "
                        f"SLO p99 <= {slo_seconds:g}s")
    for col in ("policy", "wait p50 s", "wait p99 s", "SLO min %", "replica-s", "actions",
                "reversals", "killed"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in results:
        table.add_row(r["policy"], fmt(r["queue_wait_p50"]), fmt(r["queue_wait_p99"]),
                      fmt(r["slo_minutes_share"] * 100, 1), f"{r['replica_seconds']:.0f}",
                      str(r["scale_actions"]), str(r["direction_reversals"]),
                      str(r["tasks_killed"]))
    out = Console()
    out.print(table)
    if ratio is not None:
        verdict = ("met" if ratio <= 0.8
                   and by["roost"]["slo_minutes_share"] >= by["hpa"]["slo_minutes_share"]
                   else "not met")
        out.print(f"roost / hpa replica-seconds: {ratio:.3f} (target <= 0.8 at equal or "
                  f"better SLO: {verdict})")
    if json_out is not None:
        write_json(json_out, doc)
        json_out.with_suffix(".md").write_text(_markdown(doc))
        plot(json_out.with_suffix(".png"), rates, results,
             title=f"{demand_path.name}: demand vs replicas")
