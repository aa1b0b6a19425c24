"""The capacity plan: a pure function of a snapshot, the pools' demand history and ``now``.

``plan(snapshot, history, now=..., settings=...)`` returns a `Plan`: per pool the raw
and desired replica counts, why (including what capped it or froze it), and the steps
the reconcile loop should apply. It reads no clock and does no I/O, so every rule in
docs/autoscaling.md is a table-driven unit test, and the benchmark and the WorldCup98
replay run the very function the controller runs.

The order of the rules, for each pool:

1. freeze on anything that makes acting unsafe (missing or stale inputs, an unhealthy
   database, a database budget that cannot hold the minimums, a release revision
   mismatch): desired stays at current and nothing new happens;
2. the demand model (`roost.decide.demand`): the tasks to size for, from the arrival
   rate, the service time, the backlog and the start-up time, never more than
   queued + running; ``raw = ceil(tasks / target_per_replica)``;
3. the scale-up window (the least demand seen over it must exceed current) and the
   scale-down stabilization window (the most demand seen over it must be below
   current) *and* an empty queue; the headroom stops a scale-down of bursts that
   recur, and grows a small pool of short tasks to it at once;
4. min/max replicas, then the growth bound (at most ``max(growth_replicas,
   growth_percent %)`` more per growth period, a rate whatever the tick: `Allowance`);
5. growth capped by node memory/CPU headroom and the shared database budget;
6. drain-safe scale-down steps (`roost.decide.drain`), as many drains at once as the
   pool's disruption budget allows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from roost.decide.caps import Growth, GrowthAsk, allocate_growth, db_worker_budget
from roost.decide.demand import Estimates, Sizing, size
from roost.decide.drain import MarkDraining, ScaleUp, Step, decide_drain, fresh
from roost.decide.snapshot import (
    PastArrivals,
    PlanSettings,
    PoolInputs,
    PoolSpec,
    Snapshot,
    WorkerStatus,
)

# Stable codes that open a frozen_reason ("code: detail"); metrics label by the code.
INPUTS_MISSING = "inputs_missing"
STALE_INPUTS = "stale_inputs"
DB_UNHEALTHY = "db_unhealthy"
DB_BUDGET = "db_budget"
REVISION_MISMATCH = "revision_mismatch"


def _covering(series: Sequence[tuple[float, int]], since: float) -> int | None:
    """The index of ``series``' newest value at or before ``since``: the value that
    proves a window reaching back to ``since`` is covered; None when none does."""
    start = None
    for i, (t, _) in enumerate(series):
        if t <= since:
            start = i
    return start


def _kept(series: list[tuple[float, int]], now: float, keep: float
          ) -> tuple[tuple[float, int], ...]:
    """``series`` from the value covering ``now - keep`` on (all of it if none does)."""
    return tuple(series[_covering(series, now - keep) or 0:])


@dataclass(frozen=True, slots=True)
class Allowance:
    """The growth bound's state, read at ``at`` with the pool seen at ``seen`` replicas:
    ``left`` of one growth period's allowance is unspent (0 to 1).

    The bound is a rate. A pool may grow by ``max(growth_replicas, growth_percent %)``
    per growth period: the allowance refills at one period's worth per period, never
    past one, and growth spends the part of a period it needed (the percent compounded:
    doubling twice takes two periods). So a pool idle for a period may grow by a whole
    period's worth at once, as HPA's first step, and a pool growing all along grows at
    the rate whatever the tick. A window (the smallest size seen over the last period)
    would not: with a 10 s tick and a 15 s period it let a pool double only every other
    tick, every 20 s, where HPA's 15 s sync doubles it every 15 s.
    """

    at: float
    seen: int
    left: float = 1.0

    def read(self, spec: PoolSpec, now: float, seen: int, period: float) -> Allowance:
        """The allowance at ``now``: the growth since the last read spent, then refilled
        for the time between (the growth was asked at the last read)."""
        left = max(0.0, self.left - periods_spent(spec, self.seen, seen))
        return Allowance(now, seen, min(1.0, left + max(0.0, now - self.at) / period))

    def limit(self, spec: PoolSpec) -> int:
        """The most replicas the unspent allowance lets the pool grow to from ``seen``
        (rounded down, so the rate holds; `growth_limit`)."""
        return growth_limit(spec, self.seen, self.left)


def growth_limit(spec: PoolSpec, current: int, periods: float) -> int:
    """The most replicas ``periods`` of the growth bound's allowance let ``current``
    grow to: ``max(growth_replicas, growth_percent %)`` per period, the percent
    compounded (HPA's policy arithmetic with ``selectPolicy: Max``, as a rate)."""
    added = spec.growth_replicas * periods
    grown = current * math.pow(1 + spec.growth_percent / 100, periods)
    return math.floor(max(current + added, grown) + 1e-9)


def periods_spent(spec: PoolSpec, before: int, after: int) -> float:
    """The part of a period's allowance growing from ``before`` to ``after`` replicas
    needed: the least of what either policy took (the inverse of `growth_limit`)."""
    if after <= before:
        return 0.0
    spent = (after - before) / spec.growth_replicas
    if before > 0 and spec.growth_percent > 0:
        spent = min(spent, math.log(after / before) / math.log1p(spec.growth_percent / 100))
    return spent


@dataclass(frozen=True, slots=True)
class PoolHistory:
    """What the plan carries from tick to tick for one pool.

    ``samples`` are ``(time, tasks to size for)``, oldest first: the demand model's
    figure (`roost.decide.demand`), which is queued + running when no rate is known.
    ``levels`` are ``(time, the arrivals' level)`` at the same times (`Sizing.level`;
    the same figure as the sample without the model): what the flap guard holds.
    Tasks, not replica counts, so that changing a pool's target per replica takes
    effect at once. A gap in the data (a failed read) clears them: a window must be
    observed without holes before it can justify a change. ``allowance`` is the growth
    bound's state, ``drains`` when each drain began (the disruption budget),
    ``estimates`` the service and start-up times.
    """

    samples: tuple[tuple[float, int], ...] = ()
    allowance: Allowance | None = None
    drains: tuple[tuple[float, str], ...] = ()
    estimates: Estimates = field(default_factory=Estimates)
    shrunk_at: float | None = None
    """When the plan last began a scale-down (drained a worker)."""
    shrunk_from: int | None = None
    """The pool's size when that scale-down began: a pool short of capacity once it has
    grown past it is short because demand rose, not because it shrank."""
    flap_until: float | None = None
    """Until then the pool scales down only after `PlanSettings.flap_window`: it had to
    grow again soon after it shrank."""
    levels: tuple[tuple[float, int], ...] = ()
    """``(time, the arrivals' level)``, at the samples' times (see above)."""

    def add(self, now: float, outstanding: int, keep: float, level: int | None = None
            ) -> PoolHistory:
        # Without the model there is no level apart from the sized figure (queued +
        # running, a backlog included): the guard then holds that, as it always did.
        level = outstanding if level is None else level
        return replace(self, samples=_kept([*self.samples, (now, outstanding)], now, keep),
                       levels=_kept([*self.levels, (now, level)], now, keep))

    def window(self, now: float, seconds: float, *, levels: bool = False
               ) -> list[int] | None:
        """Values demand took during ``[now - seconds, now]`` (the arrivals' levels with
        ``levels``), or None if the history does not reach back that far."""
        series = self.levels if levels else self.samples
        start = _covering(series, now - seconds)
        return None if start is None else [v for _, v in series[start:]]


@dataclass(frozen=True, slots=True)
class PoolPlan:
    pool_id: str
    current_replicas: int | None
    raw_desired: int | None
    desired_replicas: int | None
    frozen_reason: str | None
    reason: str
    capped_by: tuple[str, ...] = ()
    steps: tuple[Step, ...] = ()
    history: PoolHistory = field(default_factory=PoolHistory)
    queued: int | None = None
    running: int | None = None
    sizing: tuple[str, ...] = ()
    """The demand model's inputs and steps, in words (`roost.decide.demand.size`)."""

    @property
    def action(self) -> str:
        if self.frozen_reason:
            return "frozen"
        if self.current_replicas is None or self.desired_replicas is None:
            return "hold"
        if self.desired_replicas > self.current_replicas:
            return "scale_up"
        if self.desired_replicas < self.current_replicas:
            return "scale_down"
        return "hold"


@dataclass(frozen=True, slots=True)
class Plan:
    now: float
    pools: tuple[PoolPlan, ...]
    db_worker_budget: int | None
    db_connections_used: int

    @property
    def steps(self) -> tuple[Step, ...]:
        return tuple(s for p in self.pools for s in p.steps)

    @property
    def history(self) -> dict[str, PoolHistory]:
        return {p.pool_id: p.history for p in self.pools}

    def pool(self, pool_id: str) -> PoolPlan:
        for p in self.pools:
            if p.pool_id == pool_id:
                return p
        raise KeyError(pool_id)


def raw_desired(outstanding: int, target_per_replica: int) -> int:
    """``ceil(outstanding / target)``, in integers."""
    return -(-outstanding // max(1, target_per_replica))


def _global_freeze(snapshot: Snapshot, now: float, s: PlanSettings) -> str | None:
    db = snapshot.db
    if db is None:
        detail = "; ".join(snapshot.errors) or "database health not read"
        return f"{INPUTS_MISSING}: {detail}"
    if now - db.observed_at > s.max_input_age:
        return f"{STALE_INPUTS}: database health is {now - db.observed_at:.0f}s old"
    if now - snapshot.read_at > s.max_input_age:
        return f"{STALE_INPUTS}: demand and workers are {now - snapshot.read_at:.0f}s old"
    if db.in_recovery:
        return f"{DB_UNHEALTHY}: the server is in recovery (read-only)"
    if db.sync_peers < s.db_expected_sync_peers:
        return (f"{DB_UNHEALTHY}: {db.sync_peers} of {s.db_expected_sync_peers} synchronous "
                "replication peers attached; commits may block")
    budget = db_worker_budget(db, s)
    floor = sum(p.spec.min_replicas * p.spec.worker_db_pool_size for p in snapshot.pools)
    if floor > budget:
        return (f"{DB_BUDGET}: the worker budget of {budget} connections cannot hold every "
                f"pool's min replicas ({floor})")
    return None


def _pool_freeze(p: PoolInputs, now: float, s: PlanSettings) -> str | None:
    if p.missing or p.demand is None or p.workers is None or p.infra is None:
        names = [n for n, v in (("demand", p.demand), ("workers", p.workers),
                                ("infra", p.infra)) if v is None]
        return f"{INPUTS_MISSING}: " + ("; ".join(p.missing) or ", ".join(names))
    age = now - p.infra.observed_at
    if age > s.max_input_age:
        return f"{STALE_INPUTS}: orchestrator state is {age:.0f}s old"
    want = p.spec.expected_revision
    if want:
        off = sorted({
            w.revision for w in p.workers
            if w.status is not WorkerStatus.GONE and fresh(w, now, s) and w.revision != want
        })
        if off:
            return f"{REVISION_MISMATCH}: expected {want!r}, workers run {', '.join(off)}"
    return None


def scale_down_window(replicas: int, s: PlanSettings, spec: PoolSpec | None = None) -> float:
    """The stabilization a pool of ``replicas`` waits before it scales down: the pool's
    own window if its operator set one, else the controller's, lengthened for a small
    pool."""
    if spec is not None and spec.scale_down_window is not None:
        return float(spec.scale_down_window)
    return s.scale_down_window * max(1.0, s.small_pool_replicas / max(replicas, 1))


def down_window(current: int, hist: PoolHistory, now: float, s: PlanSettings,
                spec: PoolSpec | None = None) -> float:
    """The stabilization before a scale-down: `scale_down_window`, or the longer
    ``flap_window`` while the pool is flapping (it grew again within ``flap_window`` of
    a scale-down, short of capacity and no larger than it was then: demand that recurs,
    such as bursts every few minutes, would find it shrunk each time)."""
    base = scale_down_window(current, s, spec)
    if hist.flap_until is not None and now < hist.flap_until:
        return max(base, s.flap_window)
    return base


def _windowed(p: PoolInputs, hist: PoolHistory, current: int, sizing: Sizing, now: float,
              s: PlanSettings) -> tuple[int, str]:
    """Replicas demand justifies after the windows, before min/max and caps."""
    assert p.demand is not None
    target = p.spec.target_per_replica
    raw = raw_desired(sizing.effective, target)
    flapping = hist.flap_until is not None and now < hist.flap_until
    up_wait = 0.0 if flapping or sizing.overdue > 0 else s.scale_up_window
    up = hist.window(now, up_wait)
    wait = down_window(current, hist, now, s, p.spec)
    down = hist.window(now, wait)
    held = f"{wait:.0f}s"  # how long the scale-down has waited, in the reason
    if flapping:
        # The guard holds the arrivals' level over its window, and the sized figures
        # (a burst's backlog included) over the ordinary window only: sized on a running
        # count still working off the backlog, a burst's peak is not a level it recurs
        # at. (A history without levels that far back keeps the sized figures.)
        ordinary = scale_down_window(current, s, p.spec)
        base = hist.window(now, ordinary)
        levels = hist.window(now, wait, levels=True)
        if base is not None and levels is not None:
            down = [*base, *levels]
            held = f"{ordinary:.0f}s and the arrivals' level for {wait:.0f}s (flapping)"
    room = raw_desired(sizing.reserve, target) if sizing.grows else 0
    if room > max(raw, current):
        return room, f"headroom: bursts recur; a small pool of short tasks grows to its " \
                     f"room of {sizing.reserve} tasks"
    if raw > current == 0:
        return raw, "scale from zero: no window (an idle pool has no capacity to wait with)"
    if raw > current:
        low = raw_desired(min(up), target) if up else None
        if low is not None and low > current:
            return low, f"demand above {current} for {up_wait:.0f}s"
        return current, f"scale-up window: demand {raw} > {current} not yet held for " \
                        f"{up_wait:.0f}s"
    if raw < current:
        high = raw_desired(max(down), target) if down else None
        if high is None or high >= current:
            return current, f"stabilization: demand {raw} < {current} not yet held for " \
                            f"{held}"
        if p.demand.queued:
            return current, f"scale-down needs an empty queue ({p.demand.queued} queued)"
        # Room is held only for demand that recurs (the flap guard's signal): after a
        # step down, the old level's reads would otherwise hold it for the whole window.
        # Tasks shorter than the wait aimed at also keep room for a jump back to a rate
        # read lately, recurring or not (`roost.decide.demand.jump_share`).
        # A sustained rise holds the slots the rate ahead needs: a replica released now
        # would be asked again within a start-up (`roost.decide.demand.rise`).
        other = max(sizing.reserve if flapping or sizing.recurs else 0, sizing.jump)
        kept = max(other, sizing.rising)
        why = "a sustained rise" if sizing.rising > other else "headroom"
        room = raw_desired(kept, target)
        if room >= current:
            return current, f"{why}: {kept} tasks of room hold {current}"
        if room > high:
            return room, f"demand below {current} for {held}, queue empty; {why} " \
                         f"keeps {room}"
        return high, f"demand below {current} for {held}, queue empty"
    return current, "demand matches replicas"


def disruption_budget(spec: PoolSpec, current: int) -> int:
    """Drains the pool may start per disruption period (and one more whenever none is
    in flight, so a pool never shrinks slower than one drained worker at a time)."""
    return max(spec.disruption_replicas, current * spec.disruption_percent // 100)


@dataclass(slots=True)
class _Draft:
    p: PoolInputs
    history: PoolHistory
    current: int | None
    raw: int | None
    wanted: int | None
    frozen: str | None
    reason: str
    sizing: tuple[str, ...] = ()
    short: bool = False
    """The pool is short of capacity now (`roost.decide.demand.Sizing.short`)."""


def _tracks(p: PoolInputs, prev: PoolHistory, now: float, s: PlanSettings) -> PoolHistory:
    """The history's growth allowance, drain records and estimates brought up to now."""
    allowance = prev.allowance
    if p.infra is not None:
        size = p.infra.target_replicas
        allowance = (Allowance(now, size) if allowance is None
                     else allowance.read(p.spec, now, size, s.growth_period))
    drains = [(t, w) for t, w in prev.drains if t > now - s.disruption_period]
    seen = {w for _, w in drains}
    for w in p.workers or ():
        if (w.status is WorkerStatus.DRAINING and w.draining_since is not None
                and w.worker_id not in seen and w.draining_since > now - s.disruption_period):
            drains.append((w.draining_since, w.worker_id))
    est = prev.estimates.observe(p.demand, p.infra, now, s)
    return replace(prev, allowance=allowance, drains=tuple(sorted(drains)), estimates=est)


def _draft(p: PoolInputs, prev: PoolHistory, global_freeze: str | None, now: float,
           s: PlanSettings) -> _Draft:
    keep = max(s.scale_up_window, scale_down_window(1, s), scale_down_window(1, s, p.spec),
               s.flap_window)
    tracked = _tracks(p, prev, now, s)
    current = p.infra.target_replicas if p.infra is not None else None
    sizing: Sizing | None = None
    if p.demand is not None:
        sizing = size(p.demand, tracked.estimates, replicas=current or 0,
                      target=p.spec.target_per_replica, s=s, now=now, slots=worker_slots(p))
        hist = tracked.add(now, sizing.effective, keep, sizing.level)
    else:
        hist = replace(tracked, samples=(), levels=())
    raw = raw_desired(sizing.effective, p.spec.target_per_replica) if sizing else None
    explain = sizing.explain if sizing else ()
    frozen = global_freeze or _pool_freeze(p, now, s)
    if frozen or current is None or sizing is None:
        return _Draft(p, hist, current, raw, current, frozen, "frozen", explain)
    wanted, reason = _windowed(p, hist, current, sizing, now, s)
    spec = p.spec
    clamped = min(max(wanted, spec.min_replicas), spec.max_replicas)
    if clamped != wanted:
        bound = "min" if clamped > wanted else "max"
        reason = f"{bound}_replicas {clamped} (demand alone: {wanted})"
    if clamped > current and clamped > spec.min_replicas:
        allowance = hist.allowance or Allowance(now, current)
        bounded = max(min(clamped, allowance.limit(spec)), spec.min_replicas, current)
        if bounded < clamped:
            reason = (f"{reason}; growth bound {bounded} (max({spec.growth_replicas}, "
                      f"{spec.growth_percent}%) per {s.growth_period:g}s, "
                      f"{allowance.left:.2f} of a period's worth unspent)")
            clamped = bounded
    return _Draft(p, hist, current, raw, clamped, None, reason, explain, sizing.short)


def worker_slots(p: PoolInputs) -> int | None:
    """The fewest slots any live worker of the pool reported (a pool mid-rollout may
    mix two concurrencies: the fewer queues more), None when none did."""
    said = [w.slots for w in p.workers or ()
            if w.slots is not None and w.status is not WorkerStatus.GONE]
    return min(said, default=None)


def _removal_pending(d: _Draft) -> bool:
    return any(w.removal_target is not None for w in d.p.workers or ())


def remembered(history: Mapping[str, PoolHistory], startups: Mapping[str, float]
               ) -> dict[str, PoolHistory]:
    """``history`` with each pool it lacks started from a remembered replica start-up
    time (the previous leadership's estimate, docs/architecture.md): a leader measures
    the start-up only when a pool grows, and until then would size on the default. The
    windows are not remembered: a new leader observes them itself before it acts."""
    out = dict(history)
    for pool_id, startup in startups.items():
        if pool_id not in out and startup >= 0:
            out[pool_id] = PoolHistory(estimates=Estimates(startup=startup,
                                                           startup_remembered=True))
    return out


def read_back(history: Mapping[str, PoolHistory], past: Mapping[str, PastArrivals], *,
              now: float, settings: PlanSettings) -> dict[str, PoolHistory]:
    """``history`` with the estimates of each pool in ``past`` that has read no arrivals
    yet started from its tasks before ``now`` (`Estimates.read_back`): what a new leader
    reads once from the task table. The windows the plan acts on (its samples, levels,
    growth and drains) are not read back: a new leader observes them itself."""
    out = dict(history)
    for pool_id, tasks in past.items():
        h = out.get(pool_id, PoolHistory())
        if not h.estimates.rates and not h.estimates.arrivals:
            out[pool_id] = replace(h, estimates=h.estimates.read_back(tasks, now, settings))
    return out


def plan(
    snapshot: Snapshot,
    history: Mapping[str, PoolHistory],
    *,
    now: float,
    settings: PlanSettings,
) -> Plan:
    settings.validate()
    freeze = _global_freeze(snapshot, now, settings)
    drafts = [
        _draft(p, history.get(p.spec.pool_id, PoolHistory()), freeze, now, settings)
        for p in snapshot.pools
    ]
    budget = db_worker_budget(snapshot.db, settings) if snapshot.db is not None else None
    used = 0
    for d in drafts:
        live = d.current
        if live is None:
            live = sum(1 for w in d.p.workers or () if w.status is not WorkerStatus.GONE)
        used += live * d.p.spec.worker_db_pool_size
    asks = [
        GrowthAsk(
            d.p.spec.pool_id, d.wanted - d.current, d.p.spec.worker_cpu_milli,
            d.p.spec.worker_mem_mib, d.p.spec.worker_db_pool_size, d.p.infra.nodes,
        )
        for d in drafts
        if d.frozen is None and d.p.infra is not None and d.current is not None
        and d.wanted is not None and d.wanted > d.current and not _removal_pending(d)
    ]
    growth = allocate_growth(asks, db_room=(budget or 0) - used, settings=settings)
    pools = tuple(_finish(d, growth.get(d.p.spec.pool_id), now, settings) for d in drafts)
    return Plan(now, pools, budget, used)


def _finish(d: _Draft, growth: Growth | None, now: float, s: PlanSettings) -> PoolPlan:
    spec = d.p.spec
    desired, reason = d.wanted, d.reason
    capped: tuple[str, ...] = ()
    steps: list[Step] = []
    history = d.history
    if d.current is not None and desired is not None and desired > d.current:
        if growth is None:  # a committed removal finishes first
            desired, reason = d.current, f"{reason}; scale-up waits for a pending removal"
        else:
            desired, capped = d.current + growth.granted, growth.capped_by
            if capped:
                reason = f"{reason}; capped at {desired} by {', '.join(capped)}"
            if growth.granted:
                steps.append(ScaleUp(spec.pool_id, desired))
                # a flap: grown again soon after a scale-down, and short of capacity
                # (the shrink left it unable to serve). A pool keeping up with a rise by
                # its windows, or with noise, was right to shrink; so was one short only
                # once it has grown past the size it shrank from (demand rose since).
                if (d.short and history.shrunk_at is not None
                        and now - history.shrunk_at <= s.flap_window
                        and (history.shrunk_from is None or d.current <= history.shrunk_from)):
                    history = replace(history, flap_until=now + s.flap_window)
    note = ""
    if d.p.workers is not None:
        # Frozen pools still get here: a drain past its timeout is re-activated even
        # then, since that only gives a worker its tasks back.
        current = d.current if d.current is not None else 0
        budget = disruption_budget(spec, current) - len(d.history.drains)
        if not any(w.status is WorkerStatus.DRAINING for w in d.p.workers):
            # never slower than one drain at a time: a spent budget still lets one
            # worker drain once the last has gone
            budget = max(budget, 1)
        drain = decide_drain(
            spec.pool_id, d.p.workers, current=current,
            desired=desired if desired is not None else current, infra=d.p.infra,
            frozen=d.frozen is not None or d.current is None, now=now, settings=s,
            budget=budget,
        )
        steps.extend(drain.steps)
        note = drain.note
        marks = tuple((now, x.worker_id) for x in drain.steps if isinstance(x, MarkDraining))
        if marks:
            history = replace(history, drains=(*history.drains, *marks), shrunk_at=now,
                              shrunk_from=current)
    if note:
        reason = f"{reason}; {note}"
    return PoolPlan(
        pool_id=spec.pool_id,
        current_replicas=d.current,
        raw_desired=d.raw,
        desired_replicas=desired,
        frozen_reason=d.frozen,
        reason=reason,
        capped_by=capped,
        steps=tuple(steps),
        history=history,
        sizing=d.sizing,
        queued=d.p.demand.queued if d.p.demand else None,
        running=d.p.demand.running if d.p.demand else None,
    )
