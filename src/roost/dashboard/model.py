"""What the dashboard shows, as plain data computed from one `ClusterState`.

Every page is a function of a state and nothing else, so tests build a state by hand
and assert the numbers, and the benchmark times the same functions a request runs.
No I/O and no clock here: the state carries its own time.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from roost.bus.schemas import CapacitySnapshot, InstanceRecord
from roost.domain.catalog import BUILTIN, Catalog, InstanceType
from roost.domain.resources import GPU_MILLI


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node's last capacity snapshot, with how long ago it arrived and whether it is
    still a placement candidate (heard from within three heartbeats)."""

    snap: CapacitySnapshot
    age_seconds: float
    live: bool

    @property
    def status(self) -> str:
        if not self.live:
            return "stale"
        return "draining" if self.snap.draining else "live"


@dataclass(frozen=True, slots=True)
class LaunchCounters:
    """The gateway's launch counters, cumulative since it started (Prometheus style)."""

    launched: float = 0.0
    insufficient_capacity: float = 0.0
    failed: float = 0.0
    latency_buckets: tuple[tuple[float, float], ...] = ()
    """(upper bound in seconds, cumulative count), ascending, +Inf last."""
    attempts: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """(route, outcome) -> attempts sent to nodes."""


@dataclass(frozen=True, slots=True)
class ClusterState:
    at: float
    """Wall-clock seconds when the state was read."""
    nodes: Sequence[NodeState]
    instances: Mapping[str, InstanceRecord]
    controller: Mapping[str, Any] | None = None
    """The controller's /status document, or None when it has not answered."""
    controller_error: str = ""
    launches: LaunchCounters | None = None


# -- capacity -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Capacity:
    """Live nodes' totals. ``used`` is what instances hold; ``free`` is what nodes that
    take launches offer; a draining node's idle part is neither (``alloc`` is the sum of
    all three)."""

    cpu_alloc: int = 0  # milli
    cpu_used: int = 0
    cpu_free: int = 0
    mem_alloc: int = 0  # MiB
    mem_used: int = 0
    mem_free: int = 0
    gpu_total: int = 0  # milli, 1000 per device
    gpu_used: int = 0
    gpu_free: int = 0
    gpu_stranded: int = 0
    gpus: int = 0  # devices


@dataclass(frozen=True, slots=True)
class GpuStrip:
    index: int
    model: str
    used: int
    free: int
    stranded: int
    """Free milli on this device that no instance type this node can still take would
    use: free capacity that is, for now, wasted."""


def gpu_types(catalog: Catalog) -> list[InstanceType]:
    return [t for t in catalog.values() if t.gpu_total_milli > 0]


def gpu_strips(snap: CapacitySnapshot, catalog: Catalog = BUILTIN) -> list[GpuStrip]:
    """Each device's use; its free part is stranded when no GPU type that the node
    still fits (its own fit count > 0) needs no more than that device has free."""
    needs = [min(t.gpu_total_milli, GPU_MILLI) for t in gpu_types(catalog)
             if snap.fit.get(t.name, 0) > 0]
    out = []
    for i, free in enumerate(snap.gpu_free):
        model = snap.gpu_models[i] if i < len(snap.gpu_models) else ""
        usable = any(n <= free for n in needs)
        out.append(GpuStrip(i, model, GPU_MILLI - free, free, 0 if usable else free))
    return out


def capacity(nodes: Iterable[NodeState], catalog: Catalog = BUILTIN) -> Capacity:
    cpu_a = cpu_u = cpu_f = mem_a = mem_u = mem_f = 0
    g_tot = g_used = g_free = g_str = gpus = 0
    for n in nodes:
        if not n.live:
            continue
        s = n.snap
        cpu_a += s.alloc_cpu_milli
        cpu_u += s.alloc_cpu_milli - s.free_cpu_milli
        mem_a += s.alloc_mem_mib
        mem_u += s.alloc_mem_mib - s.free_mem_mib
        gpus += len(s.gpu_free)
        g_tot += GPU_MILLI * len(s.gpu_free)
        g_used += GPU_MILLI * len(s.gpu_free) - sum(s.gpu_free)
        if s.draining:
            continue
        cpu_f += s.free_cpu_milli
        mem_f += s.free_mem_mib
        g_free += sum(s.gpu_free)
        if s.gpu_free:
            g_str += sum(g.stranded for g in gpu_strips(s, catalog))
    return Capacity(cpu_a, cpu_u, cpu_f, mem_a, mem_u, mem_f, g_tot, g_used, g_free, g_str,
                    gpus)


def node_counts(nodes: Iterable[NodeState]) -> dict[str, int]:
    out = {"live": 0, "draining": 0, "stale": 0}
    for n in nodes:
        out[n.status] += 1
    return out


_STATE = operator.attrgetter("state")
STATE_ORDER = ("pending", "running", "stopping", "stopped", "shutting-down", "terminated")


def instance_counts(instances: Iterable[InstanceRecord]) -> dict[str, int]:
    """Instances by state, in lifecycle order, every state listed (zero included)."""
    counted = Counter(map(_STATE, instances))
    out = {s: counted.pop(s, 0) for s in STATE_ORDER}
    out.update(sorted(counted.items()))
    return out


def fits_now(nodes: Iterable[NodeState]) -> dict[str, int]:
    """How many more of each type the cluster takes now: the sum of each live,
    non-draining node's own fit count (each count assumes that node alone)."""
    total: Counter[str] = Counter()
    for n in nodes:
        if n.live and not n.snap.draining:
            total.update(n.snap.fit)
    return dict(total)


# -- launches -----------------------------------------------------------------------


def quantile(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    """The q-quantile of a cumulative histogram, interpolated inside its bucket like
    PromQL's histogram_quantile; None with no observations."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lo_bound, lo_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lo_bound
            span = count - lo_count
            frac = (rank - lo_count) / span if span else 1.0
            return lo_bound + (bound - lo_bound) * frac
        lo_bound, lo_count = bound, count
    return lo_bound


def bucket_delta(new: Sequence[tuple[float, float]], old: Sequence[tuple[float, float]]
                 ) -> list[tuple[float, float]]:
    """``new`` less ``old``: the observations between two scrapes of one histogram."""
    if len(old) != len(new):
        return list(new)
    return [(b, max(0.0, c - o)) for (b, c), (_, o) in zip(new, old, strict=True)]
