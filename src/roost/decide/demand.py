"""The demand model: how many replicas a pool's arrivals and backlog need.

Sizing a pool to ``(queued + running) / target`` overshoots on every burst: the queue
fills while new replicas take their start-up time to arrive, the pool is sized to the
whole queue, and most of those replicas start after the backlog has already drained.
This model sizes to the *work*, with what the pool already has counted as capacity:

- ``load = max(arrival_rate x service_time, running)``: tasks the arrivals keep busy at
  once (Little's law), or what runs now if that is more (the rate is a window average
  and lags a rise);
- ``spare = max(0, replicas x target / service_time - arrival_rate)``: tasks per second
  the current replicas, starting ones included, clear beyond the arrivals;
- ``left = max(0, queued - spare x startup)``: the backlog they do not clear before a
  new replica could start; only that justifies new replicas;
- ``backlog = left x service_time / drain_horizon``: the extra tasks in service that
  drain ``left`` within the horizon;
- ``effective = min(queued + running, ceil(load + backlog))``: never more than the
  old rule asked for.

The plan divides ``effective`` by the pool's target per replica, the same target the
old rule and HPA use, so the utilisation aimed at is unchanged. Without a rate or a
service time (a new pool, or a controller that could not read them) the model falls
back to ``queued + running``.

Estimates the model carries from tick to tick (`Estimates`, kept in the plan's history):
the service time's moving average and the replica start-up time, measured from the
orchestrator's view: a replica slot seen not ready is timed until a replica turns ready.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from roost.decide.snapshot import Demand, Infra, PlanSettings

STARTUP_WEIGHT = 0.3
"""Weight of a new start-up sample in the start-up time's moving average."""


@dataclass(frozen=True, slots=True)
class Estimates:
    service: float | None = None
    """Moving average of the service time, seconds."""
    service_at: float | None = None
    startup: float | None = None
    """Moving average of the observed start-up time, seconds."""
    starting_since: tuple[float, ...] = ()
    """When each replica slot now starting was first seen not ready, oldest first."""
    ready: int | None = None
    """Ready replicas last seen."""

    def observe(self, demand: Demand | None, infra: Infra | None, now: float,
                s: PlanSettings) -> Estimates:
        service, service_at = self.service, self.service_at
        if demand is not None and demand.service_time is not None and demand.service_time > 0:
            if service is None or service_at is None:
                service = demand.service_time
            else:
                a = 1.0 - math.exp(-max(0.0, now - service_at) / s.service_smoothing) \
                    if s.service_smoothing > 0 else 1.0
                service = service + a * (demand.service_time - service)
            service_at = now
        startup, since, ready = self.startup, self.starting_since, self.ready
        if infra is not None:
            now_ready = sum(1 for i in infra.instances if i.ready)
            starting = max(0, infra.target_replicas - now_ready)
            slots = list(since)
            if ready is not None and now_ready > ready:
                for t in slots[:now_ready - ready]:  # the oldest slots turned ready
                    sample = now - t
                    startup = sample if startup is None else (
                        startup + STARTUP_WEIGHT * (sample - startup))
                slots = slots[now_ready - ready:]
            if len(slots) < starting:
                slots += [now] * (starting - len(slots))
            since, ready = tuple(slots[:starting]), now_ready
        return Estimates(service, service_at, startup, since, ready)

    def startup_time(self, s: PlanSettings) -> float:
        return self.startup if self.startup is not None else s.startup_default


@dataclass(frozen=True, slots=True)
class Sizing:
    effective: int
    """Outstanding tasks the pool should be sized for (queued + running, or less)."""
    explain: tuple[str, ...]
    """Every input and step, for /status."""


def size(demand: Demand, est: Estimates, *, replicas: int, target: int,
         s: PlanSettings) -> Sizing:
    """The tasks to size for (see the module docstring), with the reasoning."""
    q, x = demand.queued, demand.running
    outstanding = q + x
    rate, service = demand.arrival_rate, est.service
    startup = est.startup_time(s)
    known = "measured" if est.startup is not None else "default"
    lines = [f"queued {q}, running {x}, replicas {replicas} (starting ones included), "
             f"target {target}/replica"]
    if rate is None or service is None:
        why = "arrival rate not read" if rate is None else "no task completed yet"
        lines.append(f"{why}: size for queued + running = {outstanding}")
        return Sizing(outstanding, tuple(lines))
    load = max(rate * service, float(x))
    spare = max(0.0, replicas * target / service - rate)
    left = max(0.0, q - spare * startup)
    backlog = left * service / s.drain_horizon
    effective = min(outstanding, math.ceil(load + backlog - 1e-9))
    lines += [
        f"arrivals {rate:.3g}/s over {s.rate_window:g}s, service {service:.3g}s, "
        f"start-up {startup:.3g}s ({known})",
        f"load = max(arrivals x service, running) = {load:.3g} tasks",
        f"spare = max(0, replicas x target / service - arrivals) = {spare:.3g} tasks/s",
        f"backlog left after start-up = max(0, queued - spare x start-up) = {left:.3g}",
        f"backlog term = left x service / {s.drain_horizon:g}s horizon = {backlog:.3g} tasks",
        f"size for min(queued + running, ceil(load + backlog)) = {effective} tasks",
    ]
    return Sizing(effective, tuple(lines))
