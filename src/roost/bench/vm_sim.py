"""Replay a VM trace with departures on identical hosts, and size the cluster for it.

Each arrival goes where the policy puts it (through `ReplayCluster`, i.e. the gateway's
policy code); each VM leaves at its departure time, departures before arrivals at the
same second. The fewest hosts that serve the whole trace with zero rejections is found
by binary search between a lower bound (peak demand / host size) and an upper bound
found by growing 25% at a time. Feasibility is monotone in the host count for any sane
policy but not guaranteed for every heuristic; the search reports what it tried.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from roost.bench.replay import Placed, ReplayCluster
from roost.bench.traces import VmTrace
from roost.decide.placement import NodeView, Policy
from roost.domain.catalog import InstanceType
from roost.domain.fit import FreeCapacity
from roost.domain.resources import Resources


def flavor_types(trace: VmTrace) -> list[InstanceType]:
    """Azure flavors as instance types (vCPU, GiB), indexed like ``trace.flavors``."""
    return [
        InstanceType(
            f"azure.{f.letter}", round(f.vcpus * 1000), round(f.mem_gib * 1024)
        )
        for f in trace.flavors
    ]


def hosts(count: int, shape: Resources) -> list[NodeView]:
    width = max(5, len(str(count)))
    return [
        NodeView(f"host-{i:0{width}d}", shape, FreeCapacity(shape)) for i in range(count)
    ]


@dataclass(frozen=True, slots=True)
class Peak:
    """The moment the most vCPU is in use, and how the hosts look then."""

    index: int  # arrival index (0-based) after which the peak holds
    time: int
    cpu_used_milli: int
    mem_used_mib: int


@dataclass(frozen=True, slots=True)
class Outcome:
    hosts: int
    rejected: int  # 0 when the whole trace was served; counting stops at the first
    first_rejection: int | None  # arrival index


@dataclass(frozen=True, slots=True)
class PeakState:
    hosts: int
    empty_hosts: int
    cpu_free_milli: int
    mem_free_mib: int
    stranded_cpu_milli: int  # free CPU on hosts whose free memory fits no flavor
    stranded_mem_mib: int  # free memory on hosts whose free CPU fits no flavor
    cluster_cpu_milli: int
    cluster_mem_mib: int


def find_peak(trace: VmTrace, types: Sequence[InstanceType]) -> Peak:
    """Demand alone (everything placed) sets the peak, whatever the policy."""
    cpu = mem = 0
    leaving: list[tuple[int, int, int]] = []
    best = Peak(0, 0, 0, 0)
    for i, a in enumerate(trace.arrivals):
        while leaving and leaving[0][0] <= a.time:
            _, c, m = heapq.heappop(leaving)
            cpu -= c
            mem -= m
        t = types[a.flavor]
        cpu += t.cpu_milli
        mem += t.mem_mib
        if a.departs is not None:
            heapq.heappush(leaving, (a.departs, t.cpu_milli, t.mem_mib))
        if cpu > best.cpu_used_milli:
            best = Peak(i, a.time, cpu, mem)
    return best


def replay(
    trace: VmTrace,
    types: Sequence[InstanceType],
    policy: Policy,
    *,
    host: Resources,
    count: int,
    seed: int = 42,
    stop_at: int | None = None,
    stop_on_reject: bool = True,
    tick: Callable[[int], None] | None = None,
) -> tuple[Outcome, ReplayCluster]:
    """Serve ``trace`` on ``count`` hosts; stop at the first rejection (by default) or
    after arrival ``stop_at``."""
    cluster = ReplayCluster(hosts(count, host), policy, rng=random.Random(seed))
    leaving: list[tuple[int, int, int, Placed]] = []  # (time, seq, flavor, where)
    rejected = 0
    first: int | None = None
    step = 2000
    for i, a in enumerate(trace.arrivals):
        while leaving and leaving[0][0] <= a.time:
            _, _, flavor, placed = heapq.heappop(leaving)
            cluster.release(placed, types[flavor])
        placed_at = cluster.place(types[a.flavor])
        if placed_at is None:
            rejected += 1
            first = i if first is None else first
            if stop_on_reject:
                break
        elif a.departs is not None:
            heapq.heappush(leaving, (a.departs, i, a.flavor, placed_at))
        if tick is not None and i % step == step - 1:
            tick(step)
        if stop_at is not None and i >= stop_at:
            break
    return Outcome(count, rejected, first), cluster


def peak_state(cluster: ReplayCluster, types: Sequence[InstanceType]) -> PeakState:
    min_cpu = min(t.cpu_milli for t in types)
    min_mem = min(t.mem_mib for t in types)
    empty = cpu_free = mem_free = s_cpu = s_mem = cpu_all = mem_all = 0
    for n in cluster.nodes:
        f, a = n.free.resources, n.allocatable
        cpu_all += a.cpu_milli
        mem_all += a.mem_mib
        if f == a:
            empty += 1
            continue
        cpu_free += f.cpu_milli
        mem_free += f.mem_mib
        if f.mem_mib < min_mem:
            s_cpu += f.cpu_milli
        if f.cpu_milli < min_cpu:
            s_mem += f.mem_mib
    return PeakState(len(cluster.nodes), empty, cpu_free, mem_free, s_cpu, s_mem, cpu_all,
                     mem_all)


def lower_bound(peak: Peak, host: Resources) -> int:
    return max(
        1,
        math.ceil(peak.cpu_used_milli / host.cpu_milli),
        math.ceil(peak.mem_used_mib / host.mem_mib),
    )


@dataclass(frozen=True, slots=True)
class Search:
    min_hosts: int
    tried: tuple[Outcome, ...]


def min_hosts(
    served: Callable[[int], Outcome], *, lower: int, on_try: Callable[[Outcome], None] | None = None
) -> Search:
    """Binary search for the fewest hosts with zero rejections, given ``served(count)``."""
    tried: list[Outcome] = []

    def attempt(n: int) -> bool:
        out = served(n)
        tried.append(out)
        if on_try is not None:
            on_try(out)
        return out.rejected == 0

    lo = lower - 1  # the largest count known (or assumed, below the bound) to fail
    hi = max(lower, math.ceil(lower * 1.05))
    while not attempt(hi):
        lo, hi = hi, math.ceil(hi * 1.25)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if attempt(mid):
            hi = mid
        else:
            lo = mid
    return Search(hi, tuple(tried))
