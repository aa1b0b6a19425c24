"""The demand model: how many replicas a pool's arrivals and backlog need.

Sizing a pool to ``(queued + running) / target`` overshoots on every burst: the queue
fills while new replicas take their start-up time to arrive, the pool is sized to the
whole queue, and most of those replicas start after the backlog has already drained.
This model sizes to the *work*, with what the pool already has counted as capacity:

- ``busy``: the tasks in service. Two figures estimate it: the running count, and
  ``arrival_rate x service_time`` (Little's law). Both are noisy: the running count of
  Poisson arrivals varies by its mean (``arrival_rate x service_time``), the rate's
  figure by ``service_time / rate_window`` times that. When the running count is within
  ``headroom_sigmas`` of their joint noise of the rate's figure, the two agree and
  ``busy`` is their inverse-variance mean, ``(service_time x running + rate_window x
  rate's figure) / (service_time + rate_window)``: mostly the rate for short tasks, half
  and half for tasks as long as the rate window. Beyond it (a rise, a drop, a backlog
  draining) ``busy`` is the running count, as before. Sizing on the raw count makes the
  windows read its noise: the most of it over the stabilization window holds about one
  standard deviation too many, and noise that goes up again after a scale-down looked
  like a flap;
- ``load = max(arrival_rate x service_time, busy)``: tasks the arrivals keep busy at
  once, or what runs now if that is more (the rate is a window average and lags a
  rise);
- ``startup``: the start-up time's estimate, or the age of the oldest replica still
  starting if that is longer (it shows the start-up is at least that: the first
  scale-up of a pool with a slow start-up is not planned with the 30 s default);
- ``serving = ready + sum(min(startup, age)) / startup`` over the starting replicas:
  the replicas that serve over the next start-up, on average. A starting replica
  serves only after it turns ready, about one start-up after it was first seen, so it
  counts for the share of the coming start-up it will be ready for (one just asked for
  counts 0). Counting starting replicas in full made a rise meeting a 90 s start-up
  look covered while the queue grew behind a single ready replica;
- ``spare = max(0, serving x target / service_time - arrival_rate)``: tasks per second
  the current replicas, starting ones included as above, clear beyond the arrivals;
- ``left = max(0, queued - spare x startup)``: the backlog they do not clear before a
  new replica could start; only that justifies new replicas. Its tasks already wait
  longer than a start-up;
- ``backlog = left x service_time / horizon``, ``horizon = max(drain_horizon,
  service_time)``: the extra tasks in service that drain ``left`` within the horizon
  of the new replicas starting. Tasks are served oldest first, so a task that arrives
  as they start waits for the backlog ahead of it: the horizon is the wait it gets,
  and ``drain_horizon`` is the queue wait aimed at. Never shorter than one service
  time: ``left x service / horizon`` tasks in service are then ``left`` or more, every
  queued task started at once, and a shorter horizon buys nothing but replicas;
- ``carried``: the load as the target counts it. ``target_per_replica`` is the
  outstanding tasks (queued + running) a replica should carry, and Poisson arrivals
  queue some even below full use: ``load`` Erlangs offered to ``r`` replicas of
  ``slots`` slots each keep ``mean_queue(slots x r, load)`` waiting on average
  (Erlang's C formula). ``carried`` is ``load`` when ``r = ceil(load / target)``
  replicas carry ``load`` + that queue within the target each; otherwise ``target x``
  the fewest replicas that do. ``slots`` is the fewest any live worker of the pool
  reported (its concurrency); with none reported, ``carried = load``. With more slots
  than the target (4 and 3) it binds mostly for small pools; with as many (1 and 1)
  the plan otherwise ran the slots at a utilisation of about 1, where the queue has
  no bound; with fewer slots than the target, ``ceil(load / target)`` replicas could
  have fewer slots than the load, and ``carried`` is at least ``target x load /
  slots``. It is skipped where ``load`` is already at or above ``queued + busy``,
  which bounds ``effective`` then;
- ``effective = ceil(min(queued + busy, carried + backlog))``: never more than the
  old rule asked for, beyond the noise of the running count;
- **until a start-up is seen**: while replicas are starting and none has turned ready
  since the model first read the pool, an overdue backlog (``left`` above 0) is sized
  as the old rule sized it, ``queued + running``. ``serving`` and ``left`` rest on the
  start-up, and until one is seen it is the 30 s default (or the age of the oldest
  replica still starting): a longer real start-up makes the model count starting
  replicas as nearly ready while the queue grows behind the ready ones (the first ramp
  of a sawtooth from one replica, 90 s start-ups). Only while replicas are starting: a
  pool that has not grown yet has nothing the start-up would miscount. Once a replica
  turns ready (a start-up shorter than the tick included), the model sizes as above.
- **a sustained rise** (`rise`): the rate read now and the newest reads one, two and
  three start-ups earlier (each at least a rate window apart) rose three times in a
  row beyond ``headroom_sigmas`` standard errors of Poisson window means. Then
  ``spare`` is read against the mean rate until a replica asked now serves, and
  ``carried`` is at least ``target x`` the fewest replicas whose slots carry the rate
  that replica meets (and its mean queue) within their slots; that figure holds every
  scale-down (`Sizing.rising`). With one slot a worker sized at one task a replica the
  target leaves no slack for a rise over a start-up: the pool drained on a ramp and
  asked for the replicas again a start-up too late.

More figures go to the plan's windows (`roost.decide.plan`):

- ``overdue = left``: backlog that will not clear before a new replica could start.
  While there is some, the scale-up window is skipped: waiting it out would only let
  the queue grow (the window is there to ignore noise, and this is not noise);
- ``reserve``, the **headroom**: room for the arrival rate's short-horizon peak,
  ``min(mean + headroom_sigmas x sd, highest)`` of the burst rates read over
  `PlanSettings.headroom_window`, times the service time. A burst rate (`burst_rate`)
  is the most tasks that arrived within one service time, per second, as far as the
  reads show it: the rate window's average, or the busiest ``peak_grain`` (5 s) since
  the last read if that is more, spread over the service time when that is longer
  than the grain. A 30 s average flattens a 10 s burst to about a third; one service
  time is the span whose arrivals are in service at once (Little's law at the burst's
  own scale), so tasks longer than the rate window read the average as before. Since
  the last read, not over the rate window: each burst then counts in one read, and the
  reads sample the rate over time. ``sd`` counts only the
  variance beyond what Poisson arrivals at the mean show at that span: the target per
  replica already absorbs that. It holds only for bursts that recur (the reads rose
  above ``mean + headroom_sigmas x`` the whole sd of the other reads, the highest left
  out, at least twice, falling below the mean between, or the pool is flapping), and it
  is never more than the second-highest of those bursts: one extreme burst neither
  hides the bursts that recur nor sets the room held for them. The service time it is
  sized on (`room_service`) follows the estimate's rises at once and its falls only
  beyond ``headroom_sigmas`` standard errors of a mean of the completions read: with
  few completions (30 s tasks at 1/s) the estimate wanders by a tenth between bursts,
  and the room held for the next burst must not wander down with it. It stops a
  scale-down; it makes a pool grow only as below. Bursts shorter than a start-up find
  room instead of a shrunk pool; a step down is not held at its old level;
- **a small pool of short tasks**: below `PlanSettings.small_pool_replicas` (the size
  below which one replica is a large share of the capacity), with a service time below
  ``drain_horizon`` (the queue wait aimed at). The model spreads the backlog of short
  tasks over the horizon (``left x service / horizon`` is a fraction of ``left``),
  where tasks as long as the horizon have every queued task sized at once, so a burst
  of short tasks is met by the room already there, or waited out in the queue; a
  small pool has the least of either. For such a pool only:

  - bursts that recurred are **held for one more headroom window** after they last
    did (`Estimates.recurred`), with the room no higher than their second-highest
    burst was then. The reads of the window show the bursts recur only while two of
    them are in it: bursts a little more than half a window apart drop to one at
    times, and the pool shrinks just before the next;
  - the pool **grows to the room** while bursts recur (or are held as above): a
    pool that kept up with the bursts at one replica, queueing a little, met the
    next larger one with one (the Azure LLM hour at peak 10, minute 14).

  Larger pools and longer tasks keep the rules above: both rules for every pool of
  short tasks held WorldCup98's smooth decline at its level for a window (1.3 % more
  replica-seconds, past 0.8x HPA's), grown pools of noisy demand went above HPA's,
  and for 30 s tasks they put the Azure hour above HPA's;
- ``short``: the pool is short of capacity now: its overdue backlog would wait longer
  than ``drain_horizon`` (the queue wait aimed at) to clear at the throughput the target
  gives the replicas serving, ``overdue x service / (serving x target) >
  drain_horizon``; or, without a rate or a service time, any queued task. A queue that
  clears within the wait aimed at costs no more than that wait: it is the arrivals' own
  noise, not a pool the shrink left unable to serve (2 s tasks at 12 replicas: 7 queued
  clear in 0.4 s). Counted as short, such queues held WorldCup98's quiet hours at 3
  replicas for 300 s at a time where 2 serve. Only a pool short when it grows again soon after
  a scale-down counts as flapping (`roost.decide.plan`): a pool that keeps up with a
  rise by its ordinary windows was right to shrink, and so was one short only once it
  has grown past the size it shrank from (demand rose since);
- ``level``, the **arrivals' level**: ``ceil(burst rate x service_time)``, the tasks
  the arrivals keep in service at their busiest (`burst_rate`), without the backlog a
  burst leaves. A flapping pool scales down no lower than the most of it over
  ``flap_window``, and of ``effective`` over the ordinary window only. After a burst of
  long tasks ``effective`` is the running count still working off the backlog (on/off
  spells of 30 s tasks at 10/s: 457 tasks, 153 replicas, where the arrivals' level read
  240-300), and holding it for the whole ``flap_window`` cost more than HPA's
  replica-seconds;
- ``jump``, **room for a jump**, for tasks shorter than ``drain_horizon`` only:
  ``jump_share(startup) x top x service_time``, ``top`` the busiest burst rate read
  over ``flap_window``. It stops every scale-down, whether or not bursts recur, and
  never makes a pool grow. Demand that moves between levels (three levels, on/off
  spells longer than a fifth of the time) never clears the recurrence test's line, so
  the headroom held nothing for a jump back to a level read a minute before. The
  share is what the pool must serve already for a jump's tasks to wait no longer than
  ``drain_horizon`` (`jump_share`). Short tasks only: the room is ``top x service``
  held through every lull, a few replicas for 0.2 s tasks and hundreds for 30 s ones,
  where room of this kind cost more than HPA's replica-seconds.

The plan divides ``effective`` by the pool's target per replica, the same target the
old rule and HPA use, so the utilisation aimed at is unchanged. Without a rate or a
service time (a new pool, or a controller that could not read them) the model falls
back to ``queued + running``.

Estimates the model carries from tick to tick (`Estimates`, kept in the plan's history):
the service time's moving average (each read weighed by the completions it had:
`smooth_service`), the replica start-up time, measured from the
orchestrator's view (a replica slot seen not ready is timed until a replica turns
ready; one asked for since the last read and ready already, never seen starting, as
the time between the two reads, the most it can have taken), the burst rates read
over the headroom window, and the service time the headroom is sized on.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from roost.decide.snapshot import Demand, Infra, PastArrivals, PlanSettings

STARTUP_WEIGHT = 0.3
"""Weight of a new start-up sample in the start-up time's moving average."""

RISE_WINDOWS = 3
"""Rises in a row between reads a start-up apart that a sustained rise needs (`rise`):
the means of disjoint windows over one burst or step rise at most twice."""


def rise_span(startup: float | None, s: PlanSettings) -> float:
    """How far apart `rise` reads the rate: the start-up's estimate (the default until
    one is measured), at least a rate window. `Estimates.observe` keeps the reads for
    this span and `size` reads them at it: one figure, so the two cannot disagree."""
    return max(s.rate_window, startup if startup is not None else s.startup_default)


def rise_keep(startup: float | None, s: PlanSettings) -> float:
    """How long `Estimates.observe` keeps the arrival reads: `rise` picks each read at
    least a span before the one after it, so each pick can land up to a tick further
    back. `RISE_WINDOWS` spans and a tick each (two, for ticks that run late), and the
    read before the first."""
    return RISE_WINDOWS * (rise_span(startup, s) + 2 * s.interval) + s.interval


def read_back_span(startup: float | None, s: PlanSettings) -> float:
    """How far back a new leader reads a pool's arrivals (`Estimates.read_back`): as far
    as a leader reading all along would still hold them. The headroom's reads reach
    back one headroom window and a recurrence they show holds one more
    (`Estimates.recurred`); the rise's reads reach back `rise_keep`."""
    return max(2 * s.headroom_window, rise_keep(startup, s))


def past_span(startup: float | None, s: PlanSettings) -> float:
    """How far back the tasks a new leader reads reach: its reads' span
    (`read_back_span`) and the rate window of the oldest. The store's read, the
    retention's floor and the bench all take it from here."""
    return s.rate_window + read_back_span(startup, s)


def peak_span(since: float, s: PlanSettings) -> float:
    """The span the busiest ``peak_grain`` of arrivals is read over: the time since the
    previous read, so that each burst counts in one read; never finer than its grain,
    never past the rate window. The live read and a new leader's replay of it alike."""
    return min(max(since, s.peak_grain), s.rate_window)


def rise(arrivals: tuple[tuple[float, float], ...], now: float, span: float,
         s: PlanSettings) -> tuple[float, tuple[float, ...]] | None:
    """The arrival rate's slope (tasks/s per second) on a sustained rise, and the reads
    it rests on, oldest first; None unless there is one.

    The reads: the newest, and before each the newest read at least ``span`` (the
    start-up, at least a rate window) earlier, `RISE_WINDOWS` + 1 of them, so their
    windows do not overlap. A sustained rise: each read above the one before by more
    than ``headroom_sigmas`` standard errors of the difference of two Poisson window
    means (``sqrt((a + b) / rate_window)``). The means of disjoint windows over a
    single burst or step rise at most twice (into the window it begins in, then into a
    full one), so three rises are never one burst or step. None when
    ``headroom_sigmas`` is 0 (or less), which turns the headroom off too: without a
    noise bound any three rises in a row would count."""
    if not arrivals or arrivals[-1][0] != now or s.headroom_sigmas <= 0:
        return None  # 0 sigmas turns the read off, as it does the headroom
    w = s.rate_window
    span = max(span, w)
    picked = [arrivals[-1]]
    for t, r in reversed(arrivals[:-1]):
        if len(picked) > RISE_WINDOWS:
            break
        if t <= picked[-1][0] - span + 1e-9:
            picked.append((t, r))
    if len(picked) <= RISE_WINDOWS:
        return None
    picked.reverse()
    for (_, a), (_, b) in itertools.pairwise(picked):
        if b - a <= s.headroom_sigmas * math.sqrt((a + b) / w):
            return None
    (t0, r0), (t1, r1) = picked[0], picked[-1]
    return (r1 - r0) / (t1 - t0), tuple(r for _, r in picked)


def service_grain(service: float | None, s: PlanSettings) -> float:
    """The span a burst's load is read over: one service time (the tasks that arrive
    within it are in service at once), no finer than the peak grain and no longer than
    the rate window (what the controller reads)."""
    return min(max(service or 0.0, s.peak_grain), s.rate_window)


def burst_rate(rate: float, peak: float | None, service: float | None,
               s: PlanSettings) -> float:
    """A lower bound of the most tasks that arrived within one service time, per second:
    ``max(rate, peak x peak_grain / span)`` with ``span`` = `service_grain`. The busiest
    ``peak_grain`` seconds keep their tasks in service for one service time; the rate
    window's average holds for longer tasks."""
    if peak is None:
        return rate
    return max(rate, peak * s.peak_grain / service_grain(service, s))


def in_service(running: int, steady: float, service: float, s: PlanSettings
               ) -> tuple[float, bool]:
    """The tasks in service, and whether the two estimates of it agree.

    ``running`` (what the pool runs now) and ``steady`` (``arrival_rate x service``,
    Little's law) both estimate it. For Poisson arrivals the running count varies by
    ``steady`` (its variance is its mean) and the rate's figure by ``steady x service /
    rate_window`` (a count over the rate window, scaled by the service time). Within
    ``headroom_sigmas`` of their joint noise they agree, and the estimate is their
    inverse-variance mean; beyond it the demand changed faster than the rate window
    shows, and the running count is the figure."""
    w = s.rate_window
    noise = math.sqrt(steady * (1.0 + service / w))
    if abs(running - steady) > s.headroom_sigmas * noise:
        return float(running), False
    return (service * running + w * steady) / (service + w), True


def jump_share(startup: float, s: PlanSettings) -> float:
    """The share of a jump's arrival rate a pool must already serve for the jump's
    tasks to wait no longer than ``drain_horizon`` (the wait aimed at) before the
    replicas it asks for serve: ``max(0, 1 - drain_horizon / (interval + startup))``.

    A jump to ``L`` tasks/s finds the pool serving ``C``. The controller reads it at its
    next tick, up to ``interval`` later, and no replica asked for then serves before one
    start-up ``T`` more, so ``(L - C) x (interval + T)`` tasks queue; the grown pool
    serves at least ``L`` and clears them in at most ``(1 - C / L) x (interval + T)``,
    which is the wait aimed at when ``C = (1 - drain_horizon / (interval + T)) x L``.
    A lower bound: the growth bound and the scale-up window (which holds a tick while
    the backlog still looks clear within a start-up) lengthen the wait. 0 when the
    interval and a start-up are within the wait aimed at."""
    wait = s.interval + startup
    if wait <= s.drain_horizon:
        return 0.0
    return 1.0 - s.drain_horizon / wait


def trimmed_line(xs: list[float], sigmas: float) -> float:
    """``mean + sigmas x sd`` of ``xs`` without their highest: a quantile that the one
    most extreme read does not lift."""
    rest = sorted(xs)[:-1]
    if len(rest) < 2:
        return max(xs)
    # float sums, not `statistics`' exact fractions: this runs for every pool at every
    # read (and for every read a new leader replays), and fsum is exact to a rounding
    mean = math.fsum(rest) / len(rest)
    return mean + sigmas * math.sqrt(math.fsum((x - mean) ** 2 for x in rest)
                                     / (len(rest) - 1))


def room_service(held: float | None, service: float, rate: float | None,
                 s: PlanSettings) -> float:
    """The service time the headroom is sized on: the estimate when it rises, and when
    it falls by more than ``headroom_sigmas`` standard errors of a mean of the
    completions it was read from (about ``rate x rate_window`` of them; run times taken
    as spread as an exponential's, sd = mean). A fall within that is the noise of few
    completions, not shorter tasks, and must not shrink the room held for bursts."""
    if held is None or service >= held:
        return service
    n = max(1.0, (rate or 0.0) * s.rate_window)
    if held - service > s.headroom_sigmas * held / math.sqrt(n):
        return service
    return held


def smooth_service(service: float | None, weight: float, at: float | None, mean: float,
                   count: int | None, now: float, s: PlanSettings) -> tuple[float, float]:
    """The service time's moving average, and the weight behind it, after a read of
    ``count`` completions whose mean run time is ``mean`` (``count`` None: one).

    Each read weighs as many completions as it had, and earlier ones fade with time
    constant `PlanSettings.service_smoothing`. Weighing reads alike would let a few
    completions move it as far as a thousand: after a burst of long tasks the last to
    finish are the longest (the short ones finished first), so a read of the few left
    runs well above the mean, and one at the burst's start well below it. With a
    steady count per read this is a plain exponential moving average."""
    n = float(count) if count is not None else 1.0
    fade = math.exp(-max(0.0, now - at) / s.service_smoothing) \
        if at is not None and s.service_smoothing > 0 else 0.0
    if n <= 0:  # a mean of no completions says nothing: keep what there is
        return (service, weight * fade) if service is not None else (mean, 0.0)
    total = weight * fade + n
    if service is None:
        return mean, n
    return service + n / total * (mean - service), total


@dataclass(frozen=True, slots=True)
class Peak:
    """The short-horizon peak of the arrival rate: ``min(mean + headroom_sigmas x sd,
    highest)`` of the rates read over the headroom window, the highest being the
    second-highest burst's once bursts recur. A quantile of what arrived, never above
    what was seen (twice, for bursts): a step's own variance does not lift it past the
    step, nor one extreme burst the room held for the others."""

    mean: float
    sd: float
    highest: float
    rate: float
    recurs: bool = False
    """The reads rose above `trimmed_line` (Poisson noise included) at least twice,
    falling below the mean between: bursts that come back."""
    ceiling: float | None = None
    """The most room is held for: the highest read, or the second-highest burst's once
    bursts recur (None: the highest)."""


@dataclass(frozen=True, slots=True)
class Estimates:
    service: float | None = None
    """Moving average of the service time, seconds."""
    service_at: float | None = None
    startup: float | None = None
    """Moving average of the observed start-up time, seconds."""
    starting_since: tuple[float, ...] = ()
    """When each replica slot now starting was first seen not ready, oldest first."""
    unseen: int = 0
    """The oldest this many of ``starting_since`` were starting already when this
    leadership first read the pool: how long they had been is not known, so their
    turning ready is no sample of the start-up (it would be short by the handover)."""
    ready: int | None = None
    """Ready replicas last seen."""
    rates: tuple[tuple[float, float], ...] = ()
    """``(time, burst rate)`` read over the last `PlanSettings.headroom_window`
    (`burst_rate`)."""
    room_service: float | None = None
    """The service time the headroom is sized on (`room_service`)."""
    turned_ready: bool = False
    """A replica turned ready since the pool was first read: the start-up has been
    seen (measured, or shorter than one read apart)."""
    recurred: tuple[float, float] | None = None
    """When the reads last showed bursts that recur, and the most room was held for
    then (`Peak.ceiling`): a small pool of short tasks holds it one more headroom
    window."""
    service_weight: float = 0.0
    """The completions behind ``service``, each weighed down by its age
    (`smooth_service`)."""
    read_at: float | None = None
    """When the orchestrator's view was last read: a replica asked for since then and
    ready now started within that long."""
    startup_remembered: bool = False
    """``startup`` is the previous leadership's estimate, published with its plan, and
    no start-up has been measured since (docs/architecture.md)."""
    arrivals: tuple[tuple[float, float], ...] = ()
    """``(time, arrival rate)`` as read, over the last `RISE_WINDOWS` start-ups (each at
    least a rate window) and two ticks more (`rise`)."""
    read_back_at: tuple[float, float] | None = None
    """When this leadership read the arrivals before it back from the task table, and
    how far back (`read_back`): /status says so while reads from before it are in use."""

    def read_back(self, past: PastArrivals, now: float, s: PlanSettings) -> Estimates:
        """These estimates as a leader reading the pool every ``interval`` until ``now``
        would have left them, from its tasks in ``past`` (the read at ``now`` is the
        tick's own). A new leader starts its service time, headroom, recurring bursts
        and sustained rise from the task table rather than from nothing. Only what the
        task table shows: the start-up and the replicas starting are the orchestrator's,
        read live. ``past`` must be counted at ``peak_grain``, the grain the peak is
        read at."""
        if s.interval <= 0:
            return self
        reach = min(read_back_span(self.startup, s), past.span - s.rate_window)
        since = peak_span(s.interval, s)  # each read's peak: since the one before
        ticks = max(0, math.floor(reach / s.interval + 1e-9))
        est = self
        for j in range(ticks, 0, -1):
            age = j * s.interval
            created, completed, ran, covered = past.between(age, age + s.rate_window)
            # per second of the whole buckets read: a window that is not a whole number
            # of them is read over the nearest whole number
            read = Demand(0, 0, created / covered, ran / completed if completed else None,
                          past.busiest(age, age + since) / past.grain, completed)
            est = est.observe(read, None, now - age, s, recur=age < s.headroom_window)
        return replace(est, read_back_at=(now, ticks * s.interval)) if ticks else est

    def observe(self, demand: Demand | None, infra: Infra | None, now: float,
                s: PlanSettings, *, recur: bool = True) -> Estimates:
        """These estimates with the reads at ``now``. ``recur`` False skips whether bursts
        recur now: a replayed read a headroom window or more before the leader's first
        tick, whose recurrence (`recurred`) would have lapsed by then."""
        service, service_at, weight = self.service, self.service_at, self.service_weight
        if demand is not None and demand.service_time is not None and demand.service_time > 0:
            service, weight = smooth_service(service, weight, service_at, demand.service_time,
                                             demand.completed, now, s)
            service_at = now
        startup, since, ready = self.startup, self.starting_since, self.ready
        turned, remembered, unseen = self.turned_ready, self.startup_remembered, self.unseen
        if infra is not None:
            now_ready = sum(1 for i in infra.instances if i.ready)
            starting = max(0, infra.target_replicas - now_ready)
            slots = list(since)
            if ready is not None and now_ready > ready:
                turned = True
                came = now_ready - ready
                # the oldest slots turned ready, those starting before this leadership
                # first; never a negative time, whatever the wall clock did between the
                # reads (the estimate is published, and the store refuses a negative one)
                skip = min(came, unseen, len(slots))
                unseen -= skip
                samples = [max(0.0, now - t) for t in slots[skip:came]]
                # the rest were asked for since the last read and are ready already:
                # their start-up is at most the time between the reads
                if self.read_at is not None:
                    samples += [max(0.0, now - self.read_at)] * (
                        came - skip - len(samples))
                for sample in samples:
                    startup = sample if startup is None else (
                        startup + STARTUP_WEIGHT * (sample - startup))
                    remembered = False
                slots = slots[came:]
            if len(slots) < starting:
                if ready is None:  # this leadership's first read: starting since when?
                    unseen = starting
                slots += [now] * (starting - len(slots))
            since, ready = tuple(slots[:starting]), now_ready
            unseen = min(unseen, len(since))
        rates = tuple((t, r) for t, r in self.rates if t > now - s.headroom_window)
        if demand is not None and demand.arrival_rate is not None:
            rates += ((now, burst_rate(demand.arrival_rate, demand.arrival_peak, service, s)),)
        room = self.room_service
        if service is not None and demand is not None and demand.service_time is not None:
            room = room_service(room, service, demand.arrival_rate, s)
        keep = rise_keep(startup, s)
        arrivals = tuple((t, r) for t, r in self.arrivals if t >= now - keep)
        if demand is not None and demand.arrival_rate is not None:
            arrivals += ((now, demand.arrival_rate),)
        out = Estimates(service, service_at, startup, since, unseen, ready, rates, room,
                        turned, self.recurred, weight,
                        now if infra is not None else self.read_at, remembered, arrivals,
                        self.read_back_at)
        peak = out.peak_rate(s) if recur else None
        if peak is not None and peak.recurs:
            ceiling = peak.ceiling if peak.ceiling is not None else peak.highest
            out = replace(out, recurred=(now, ceiling))
        return out

    def peak_rate(self, s: PlanSettings) -> Peak | None:
        """The arrival rate to hold capacity for (see `Peak`); None before two reads."""
        if len(self.rates) < 2 or s.headroom_sigmas <= 0:
            return None
        xs = [r for _, r in self.rates]
        mean = sum(xs) / len(xs)
        var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
        # Poisson arrivals at the mean would vary by mean / span on their own: the
        # target per replica absorbs that, so only the variance beyond it is burstiness.
        sd = math.sqrt(max(0.0, var - mean / service_grain(self.service, s)))
        # excursions above the quantile of all the variance (Poisson's included, so noise
        # seldom gets there), each after the rate fell back below the mean: a burst that
        # came back, not one step or a ramp wavering near the line. The quantile leaves
        # the highest read out, so one extreme burst does not hide the others.
        line = trimmed_line(xs, s.headroom_sigmas)
        tops: list[float] = []  # the highest read of each burst
        armed = True
        for x in xs:
            if armed and x > line:
                tops.append(x)
                armed = False
            elif not armed and x > tops[-1]:
                tops[-1] = x
            elif x < mean:
                armed = True
        # never room above what the bursts reached at least twice: one extreme burst does
        # not set the room held for the others
        cap = sorted(tops)[-2] if len(tops) >= 2 else max(xs)
        return Peak(mean, sd, max(xs), min(mean + s.headroom_sigmas * sd, cap),
                    sd > 0 and len(tops) >= 2, cap)

    def startup_time(self, s: PlanSettings) -> float:
        return self.startup if self.startup is not None else s.startup_default


@dataclass(frozen=True, slots=True)
class Sizing:
    effective: int
    """Outstanding tasks the pool should be sized for (queued + running, or less)."""
    explain: tuple[str, ...]
    """Every input and step, for /status."""
    reserve: int = 0
    """Tasks the pool keeps room for when it scales down (the headroom): it never
    shrinks below them, and they make it grow only where ``grows`` says so."""
    recurs: bool = False
    """The arrival rate burst more than once over the headroom window (or, for a small
    pool of short tasks, did within the window before it)."""
    overdue: float = 0.0
    """Backlog the pool's replicas (starting ones included) will not clear before a new
    replica could start: waiting out the scale-up window would only let it grow."""
    short: bool = False
    """The pool is short of capacity now: ``overdue`` would wait longer than the
    ``drain_horizon`` aimed at to clear at the replicas' target throughput, or, without
    the model (no rate or no service time), any task is queued."""
    grows: bool = False
    """The room grows the pool, not only holds it: a small pool of short tasks, bursts
    that recur (see the module docstring)."""
    jump: int = 0
    """Tasks of room for a jump back to the busiest rate read lately, kept for tasks
    shorter than the wait aimed at (`jump_share`): it holds every scale-down, whether
    or not bursts recur, and never makes the pool grow."""
    level: int | None = None
    """The arrivals' level: ``ceil(burst rate x service)`` (`burst_rate`), the tasks
    the arrivals keep in service at their busiest, without the backlog a burst leaves
    behind. The flap guard holds it (`roost.decide.plan`). None without the model."""
    rising: int = 0
    """On a sustained rise (`rise`), the tasks at the target whose replicas' slots carry
    the rate a replica asked now meets: it holds every scale-down and never makes the
    pool grow. 0 without a rise or without the workers' slots."""


def serving(est: Estimates, replicas: int, now: float | None, startup: float) -> float:
    """The replicas that serve over the next start-up, on average: a ready one for all
    of it, a starting one for the part after it turns ready, ``min(startup, age) /
    startup`` where ``age`` is how long it has been starting (it turns ready about one
    start-up after it was first seen). All of them when which are ready is not known."""
    if now is None or est.ready is None or startup <= 0:
        return float(replicas)
    ready = min(est.ready, replicas)
    ages = [now - t for t in est.starting_since[:replicas - ready]]
    return ready + sum(min(startup, max(0.0, a)) for a in ages) / startup


def mean_queue(slots: int, load: float) -> float:
    """Tasks waiting on average (not in service) when Poisson arrivals offer ``load``
    Erlangs to ``slots`` slots with exponential service times (M/M/c, Erlang's C
    formula); inf when the slots cannot keep up. Service times spread more than an
    exponential's queue more. Erlang's B formula by its recursion, which stays within
    float range at any size where the closed form's powers and factorials do not
    (hand-written: a few lines, where scipy would be a new dependency).

    The recursion runs on ``x = 1 / B``: ``x(k) = 1 + k / load * x(k - 1)``, so an error
    in ``x`` is multiplied by exactly ``k / load`` a step. It starts `_QUEUE_START_SDS`
    standard deviations of the load (``sqrt(load)``) below it, from the fluid guess
    ``load / (load - k)``, not at ``k = 0``: the steps up to the load shrink the guess's
    error by about ``exp(-sds**2 / 2)`` of the result, far below float precision, and a
    read costs ``O(sqrt(load))`` steps, not ``O(load)``. Past the load ``x`` grows at
    least as fast, so the loop ends where it overflows (no queue to float precision),
    also within ``O(sqrt(load))`` steps of the load, whatever slots a worker claims."""
    if load <= 0:
        return 0.0
    if slots <= load:
        return math.inf
    start = max(0, math.floor(load - _QUEUE_START_SDS * math.sqrt(load)))
    x = 1.0 if start == 0 else load / (load - start)
    for k in range(start + 1, slots + 1):
        x = 1.0 + k / load * x
        if x == math.inf:
            return 0.0
    b = 1.0 / x
    waits = slots * b / (slots - load * (1.0 - b))  # P(a task waits), Erlang's C
    return waits * load / (slots - load)


_QUEUE_START_SDS = 12.0  # exp(-72) of the result: the start's guess leaves no trace


def carried(load: float, target: int, slots: int | None) -> float:
    """The tasks to size ``load`` (tasks in service) as: ``load``, unless the replicas
    sized for it at ``target`` a replica would carry more than ``target`` outstanding
    each with the queue ``slots`` slots a worker keep (`mean_queue`); then ``target x``
    the fewest replicas that carry no more. ``load`` when ``slots`` is not known."""
    if slots is None or not 0 < load < math.inf:
        return load
    least = max(1, math.ceil(load / target - 1e-9))

    def carries(replicas: int) -> bool:  # more replicas queue less and carry more; the
        # same 1e-9 of float slack as `least`, so a load a hair above a whole number of
        # replicas with no queue to speak of is not one replica more
        return load + mean_queue(slots * replicas, load) <= target * replicas + 1e-9

    if carries(least):
        return load
    low, step = least, 1  # carries(low) is False; gallop, then halve, to the fewest
    while not carries(least + step):
        low, step = least + step, step * 2
    high = least + step
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if carries(mid) else (mid, high)
    return float(target * high)


def size(demand: Demand, est: Estimates, *, replicas: int, target: int,
         s: PlanSettings, now: float | None = None, slots: int | None = None) -> Sizing:
    """The tasks to size for (see the module docstring), with the reasoning.
    ``slots``: the tasks a worker of the pool runs at once, None when not known."""
    q, x = demand.queued, demand.running
    outstanding = q + x
    rate, service = demand.arrival_rate, est.service
    startup = est.startup_time(s)
    known = ("default" if est.startup is None else
             "remembered from the previous leadership" if est.startup_remembered else
             "measured")
    oldest = now - est.starting_since[0] if now is not None and est.starting_since else 0.0
    if oldest > startup:  # a replica still starting shows the start-up is at least that
        startup, known = oldest, f"{known} {est.startup_time(s):.3g}s, but a replica has " \
                                 f"been starting {oldest:.3g}s"
    lines = [f"queued {q}, running {x}, replicas {replicas} (starting ones included), "
             f"target {target}/replica"]
    if rate is None or service is None:
        why = "arrival rate not read" if rate is None else "no task completed yet"
        lines.append(f"{why}: size for queued + running = {outstanding}")
        return Sizing(outstanding, tuple(lines), short=q > 0)
    # the reads a start-up's estimate apart: a replica starting longer than it lengthens
    # the horizon below, not the span the history was kept for
    span = rise_span(est.startup, s)
    rising = rise(est.arrivals, now, span, s) if now is not None else None
    ahead = mean_ahead = rate  # the rate a replica asked now meets; the mean until then
    if rising is not None:
        # the window's mean lags the rise by half a window, and a replica asked now
        # serves from one start-up on
        ahead = rate + rising[0] * (s.rate_window / 2 + startup)
        mean_ahead = rate + rising[0] * (s.rate_window + startup) / 2
    steady = rate * service
    busy, agree = in_service(x, steady, service, s)
    load = max(steady, busy)
    bounded = load >= q + busy  # the size is queued + in service whatever carried is
    carry_now = load if bounded else carried(load, target, slots)  # the load read now
    keeps_up = None  # tasks at the target whose replicas' slots carry the rate ahead
    if rising is not None and slots is not None:
        keeps_up = target * carried(ahead * service, slots, slots) / slots
    carry = carry_now if keeps_up is None else max(carry_now, keeps_up)
    serve = serving(est, replicas, now, startup)
    throughput = serve * target / service  # tasks/s the serving replicas clear at the target
    spare = max(0.0, throughput - mean_ahead)
    left = max(0.0, q - spare * startup)
    horizon = max(s.drain_horizon, service)
    backlog = left * service / horizon
    effective = math.ceil(min(q + busy, carry + backlog) - 1e-9)
    unseen = (left > 0 and bool(est.starting_since) and est.startup is None
              and not est.turned_ready)
    if unseen:
        effective = max(effective, outstanding)
    peak = est.peak_rate(s)
    small = service < s.drain_horizon and replicas < s.small_pool_replicas
    recurs = peak is not None and peak.recurs
    room_rate = peak.rate if peak is not None else 0.0
    held = None  # (seconds since bursts last recurred, the room then), while a small
    # pool holds them
    if (peak is not None and not recurs and small and est.recurred is not None
            and now is not None and now - est.recurred[0] < s.headroom_window):
        held, recurs = (now - est.recurred[0], est.recurred[1]), True
        room_rate = min(room_rate, held[1])
    # the overdue backlog's wait at the target's throughput; with no replica serving
    # yet, any of it waits past the start-up
    clears = left / throughput if throughput > 0 else math.inf if left > 0 else 0.0
    short = clears > s.drain_horizon
    reserve = 0
    if peak is not None:
        room_s = est.room_service or service
        reserve = math.ceil(room_rate * room_s - 1e-9)
    grows = recurs and small
    # tasks shorter than the wait aimed at: room for a jump back to the busiest rate
    # read over the flap window, and the room holds every scale-down (`jump_share`)
    quick = service < s.drain_horizon and peak is not None
    lately = min(s.flap_window, s.headroom_window)  # the reads are kept that long
    top = max((r for t, r in est.rates if now is None or t > now - lately), default=0.0)
    share = jump_share(startup, s)
    jump = math.ceil(share * top * service - 1e-9) if quick else 0
    lines += [
        f"arrivals {rate:.3g}/s over {s.rate_window:g}s"
        + ("" if demand.arrival_peak is None else
           f" (busiest {s.peak_grain:g}s: {demand.arrival_peak:.3g}/s)")
        + f", service {service:.3g}s (weight {est.service_weight:.0f}: the completions "
        f"read, fading over {s.service_smoothing:g}s), start-up {startup:.3g}s ({known})",
        *([] if (back := est.read_back_at) is None or not any(
            t < back[0] for t, _ in est.rates + est.arrivals) else [
            f"reads from before this leadership: the task table's, read back over "
            f"{back[1]:.0f}s when it began (a read every {s.interval:g}s, as live)"]),
        (f"in service: running {x} is within {s.headroom_sigmas:g} sd of arrivals x service "
         f"= {steady:.3g}: read as their inverse-variance mean = {busy:.3g}" if agree else
         f"in service: running {x} (not within {s.headroom_sigmas:g} sd of arrivals x "
         f"service = {steady:.3g})"),
        *([] if rising is None else [
            f"a sustained rise: the rate read at least {span:.3g}s apart (the start-up's "
            f"estimate, at least a rate window) rose beyond {s.headroom_sigmas:g} "
            f"standard errors each time ("
            + ", ".join(f"{r:.3g}" for r in rising[1]) + f"/s): {rising[0]:.3g}/s per "
            f"second; a replica asked now meets {ahead:.3g}/s (the window's half lag and "
            f"a start-up ahead), {mean_ahead:.3g}/s on average until then",
            "slots for the rise: no worker reported its slots" if keeps_up is None else
            f"slots for the rise: the fewest replicas of {slots} slots each that carry "
            f"{ahead * service:.3g} Erlangs between them and their mean queue (Erlang C) "
            f"= {keeps_up:.3g} tasks at the target; it holds every scale-down"]),
        f"load = max(arrivals x service, in service) = {load:.3g} tasks",
        ("carried = load (no worker reported its slots)" if slots is None else
         "carried = load (at or above queued + in service, which bounds the size)"
         if bounded else
         f"carried = load: ceil(load / target) replicas ({slots} slots each) carry the "
         f"load and its mean queue (Erlang C) within the target" if carry_now == load else
         f"carried = {carry_now:.3g} tasks: ceil(load / target) replicas ({slots} slots "
         f"each) would carry more than {target} each with the load's mean queue (Erlang "
         f"C); {carry_now / target:.0f} replicas carry no more"),
        *([] if keeps_up is None or keeps_up <= carry_now else [
            f"carried = the slots for the rise, {carry:.3g} tasks, more than the load "
            f"read now needs"]),
        f"serving over the start-up = ready + starting ones for the part after they turn "
        f"ready = {serve:.3g} replicas",
        f"spare = max(0, serving x target / service - arrivals"
        f"{' until a replica asked now serves' if rising else ''}) = {spare:.3g} tasks/s",
        f"backlog left after start-up = max(0, queued - spare x start-up) = {left:.3g}",
        f"backlog term = left x service / horizon max({s.drain_horizon:g}s, service) = "
        f"{backlog:.3g} tasks",
        f"size for ceil(min(queued + in service, carried + backlog)) = {effective} tasks"
        if not unseen else
        f"no start-up seen yet ({len(est.starting_since)} starting, none turned ready): "
        f"the overdue backlog is sized as queued + running = {effective} tasks",
    ]
    if left > 0:
        lines.append(
            f"short of capacity: {'yes' if short else 'no'}: the backlog left clears at "
            f"serving x target / service in {clears:.3g}s, "
            f"{'more' if short else 'no more'} than the {s.drain_horizon:g}s wait aimed at"
            if throughput > 0 else
            "short of capacity: yes: no replica serves the backlog left before the next "
            "start-up")
    if peak is not None:
        lines.append(
            f"headroom: burst rates (most arrivals within one service time, read at "
            f"{service_grain(service, s):.3g}s) over {s.headroom_window:g}s: mean "
            f"{peak.mean:.3g}/s, sd "
            f"{peak.sd:.3g}/s, highest {peak.highest:.3g}/s"
            + ("" if peak.ceiling is None or peak.ceiling >= peak.highest else
               f", second-highest burst {peak.ceiling:.3g}/s")
            + f"; bursts {'recur' if peak.recurs else 'do not recur'}"
            + ("" if held is None else
               f", but they did {held[0]:.0f}s ago (within {s.headroom_window:g}s: a "
               f"pool below {s.small_pool_replicas} replicas of tasks shorter than the "
               f"{s.drain_horizon:g}s wait aimed at holds them one window more, no "
               f"higher than their second-highest burst then, {held[1]:.3g}/s)")
            + "; hold room for "
            f"min(mean + {s.headroom_sigmas:g} sd, "
            + ("highest" if peak.ceiling is None or peak.ceiling >= peak.highest else
               "second-highest burst")
            + ("" if held is None else f", {held[1]:.3g}/s then")
            + f") = {room_rate:.3g}/s x service"
            + ("" if room_s == service else
               f" {room_s:.3g}s (its fall to {service:.3g}s is within "
               f"{s.headroom_sigmas:g} standard errors)")
            + f" = {reserve} tasks")
    if quick:
        lines.append(
            f"room for a jump (tasks shorter than the {s.drain_horizon:g}s wait aimed "
            f"at): the busiest burst rate read over {lately:g}s, {top:.3g}/s, x "
            f"max(0, 1 - {s.drain_horizon:g}s / (the {s.interval:g}s to the next read + "
            f"start-up {startup:.3g}s)) = {share:.3g} of it "
            f"served already keeps its wait within {s.drain_horizon:g}s until new "
            f"replicas serve: x service = {jump} tasks")
    if quick and recurs:
        lines.append(f"scale down no lower than the room: max(headroom, jump) = "
                     f"{max(reserve, jump)} tasks"
                     + (f"; a pool below {s.small_pool_replicas} replicas of tasks shorter "
                        f"than {s.drain_horizon:g}s grows to the headroom while bursts "
                        f"recur" if grows else ""))
    elif quick:
        lines.append(f"scale down no lower than the jump's room: {jump} tasks (the "
                     f"headroom's {reserve} only while the pool flaps: bursts do not "
                     f"recur)")
    elif peak is not None:
        lines.append(f"scale down no lower than the headroom: {reserve} tasks"
                     if recurs else
                     f"no room held for bursts that do not recur: a scale-down keeps the "
                     f"headroom's {reserve} tasks only while the pool flaps")
    burst = burst_rate(rate, demand.arrival_peak, service, s)
    level = math.ceil(burst * service - 1e-9)
    lines.append(f"arrivals' level = burst rate {burst:.3g}/s x service = {level} tasks "
                 f"(a flapping pool holds the most of it over {s.flap_window:g}s)")
    rising_room = 0 if keeps_up is None else math.ceil(keeps_up - 1e-9)
    return Sizing(effective, tuple(lines), reserve, recurs, left, short, grows, jump, level,
                  rising_room)
