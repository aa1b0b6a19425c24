"""The FGD evaluation protocol (Weng et al., ATC'23), as the data README states it.

- The cluster is the openb GPU nodes, empty.
- Arrivals only: the pod list in trace order, then pods drawn uniformly at random
  (seeded) from the same list, appended while the requested GPU total stays within
  ``inflation`` x the cluster's GPU capacity.
- A pod that fits nowhere is rejected and the replay goes on.
- After every pod, record arrived GPU % (requested, placed or not) and allocated GPU %
  of cluster capacity. The curve's point k is the mean allocation over the pods whose
  arrived % rounds to k (or to k +/- 1 when none does), as the artifact's
  ``merge_alloc_discrete`` computes it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from roost.bench.replay import ReplayCluster
from roost.decide.placement import NodeView, Policy
from roost.decide.workload import Workload, WorkloadWindow
from roost.domain.catalog import InstanceType

CURVE_POINTS = 131  # arrived 0..130 %


def arrivals(
    pods: Sequence[InstanceType],
    *,
    cluster_gpu_milli: int,
    inflation: float,
    seed: int,
    shuffled: bool = False,
) -> list[InstanceType]:
    """The trace, then seeded uniform draws from it until the next draw would take the
    requested GPU total past ``inflation`` x capacity. A trace that already asks more
    is replayed whole.

    ``shuffled`` first shuffles the trace (seeded), as the artifact's run script did
    (``--shuffle-pod=true``); the data README's protocol keeps trace order.
    """
    out = list(pods)
    rng = random.Random(seed)
    if shuffled:
        rng.shuffle(out)
    total = sum(p.gpu_total_milli for p in out)
    target = inflation * cluster_gpu_milli
    while True:
        p = pods[rng.randrange(len(pods))]
        if total + p.gpu_total_milli > target:
            return out
        out.append(p)
        total += p.gpu_total_milli


@dataclass(frozen=True, slots=True)
class RunResult:
    policy: str
    seed: int
    pods: int
    placed: int
    curve: tuple[float | None, ...]  # allocation % at arrived % = index

    @property
    def at_100(self) -> float | None:
        return self.curve[100]


def discrete_curve(points: Sequence[tuple[float, float]]) -> tuple[float | None, ...]:
    """``(arrived %, allocated %)`` after each pod -> mean allocated % per arrived %."""
    sums = [0.0] * CURVE_POINTS
    counts = [0] * CURVE_POINTS
    for arrived, alloc in points:
        k = int(arrived + 0.5)
        if 0 <= k < CURVE_POINTS:
            sums[k] += alloc
            counts[k] += 1
    out: list[float | None] = []
    for k in range(CURVE_POINTS):
        if counts[k]:
            out.append(sums[k] / counts[k])
            continue
        near = [j for j in (k - 1, k, k + 1) if 0 <= j < CURVE_POINTS and counts[j]]
        n = sum(counts[j] for j in near)
        out.append(sum(sums[j] for j in near) / n if n else None)
    return tuple(out)


PolicyFactory = Callable[[Workload | None], Policy]

ONLINE_EVERY = 500  # arrivals between workload refreshes
ONLINE_WINDOW = 5000  # arrivals the online workload remembers


def run(
    nodes: Sequence[NodeView],
    pods: Sequence[InstanceType],
    make: PolicyFactory,
    *,
    seed: int,
    inflation: float = 1.3,
    shuffled: bool = False,
    online: bool = False,
    progress: Callable[[int], None] | None = None,
) -> RunResult:
    """One seed of the protocol under the policy ``make`` builds.

    The workload a policy measures against is the whole pod list, as the artifact
    computes its typical pods; with ``online`` it is instead what a gateway can know, a
    `WorkloadWindow` over the last `ONLINE_WINDOW` arrivals, refreshed every
    `ONLINE_EVERY` (none before the first refresh).
    """
    capacity = sum(n.gpu_total_milli for n in nodes)
    if capacity <= 0:
        raise ValueError("the cluster has no GPUs; the FGD protocol measures GPU allocation")
    seq = arrivals(
        pods, cluster_gpu_milli=capacity, inflation=inflation, seed=seed, shuffled=shuffled
    )
    window = WorkloadWindow(ONLINE_WINDOW, ONLINE_EVERY) if online else None
    policy = make(None if online else Workload.from_requests(pods))
    cluster = ReplayCluster(nodes, policy, rng=random.Random(seed))
    arrived = allocated = placed = 0
    points: list[tuple[float, float]] = []
    step = max(1, len(seq) // 100)
    for n, itype in enumerate(seq, 1):
        if window is not None:
            known = window.current()
            if known is not None and known is not cluster.policy_workload:
                cluster.set_policy(make(known), workload=known)
            window.observe(itype)
        arrived += itype.gpu_total_milli
        if cluster.place(itype) is not None:
            allocated += itype.gpu_total_milli
            placed += 1
        points.append((100.0 * arrived / capacity, 100.0 * allocated / capacity))
        if progress is not None and n % step == 0:
            progress(step)
    if progress is not None:
        progress(len(seq) % step)
    return RunResult(policy.name, seed, len(seq), placed, discrete_curve(points))
