"""The workload a cluster expects, and how fragmented a node is against it.

Fragmentation follows Weng et al., "Beware of Fragmentation" (USENIX ATC'23): a node's
free GPU capacity is fragmented, for one request shape, to the extent that the shape
cannot use it. A shape that cannot run on the node at all (short of CPU or of devices
that hold it) finds every free GPU milli unusable; a shape that runs finds unusable only
the devices whose free milli is below its per-device ask. Averaged over the shapes the
cluster expects (the workload), weighted by how often each arrives, this is the node's
expected fragmentation F_n(M). FGD places each request where F_n(M) grows least.
"""

from __future__ import annotations

import math
import tomllib
from bisect import bisect_right
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

from roost.domain.catalog import InstanceType
from roost.domain.fit import FreeCapacity, fit_count
from roost.domain.resources import GPU_MILLI


@dataclass(frozen=True, slots=True, order=True)
class Demand:
    """One request shape: CPU, memory, and ``gpu_count`` devices with ``gpu_milli`` each.

    A whole-GPU type asks ``gpu_milli == 1000``; a slice asks one device and less.
    """

    cpu_milli: int
    mem_mib: int
    gpu_count: int = 0
    gpu_milli: int = 0
    gpu_models: tuple[str, ...] = ()
    """Any of these models; empty for any model (as `InstanceType.gpu_models`)."""

    @classmethod
    def of(cls, itype: InstanceType) -> Demand:
        models = itype.gpu_models
        if itype.gpu_count:
            return cls(itype.cpu_milli, itype.mem_mib, itype.gpu_count, GPU_MILLI, models)
        if itype.gpu_milli:
            return cls(itype.cpu_milli, itype.mem_mib, 1, itype.gpu_milli, models)
        return cls(itype.cpu_milli, itype.mem_mib)

    @property
    def gpu_total_milli(self) -> int:
        return self.gpu_count * self.gpu_milli

    def as_type(self) -> InstanceType:
        """This shape as an instance type, for the fit rules. A zero CPU or memory ask
        (the traces have some) counts as 1, which the fit rules can divide by."""
        cpu, mem = max(1, self.cpu_milli), max(1, self.mem_mib)
        name = f"demand.c{cpu}-m{mem}-g{self.gpu_count}x{self.gpu_milli}"
        if self.gpu_count and self.gpu_milli >= GPU_MILLI:
            return InstanceType(name, cpu, mem, gpu_count=self.gpu_count,
                                gpu_models=self.gpu_models)
        if self.gpu_count:
            return InstanceType(name, cpu, mem, gpu_milli=self.gpu_milli,
                                gpu_models=self.gpu_models)
        return InstanceType(name, cpu, mem)


@dataclass(frozen=True, slots=True)
class Workload:
    """Request shapes and their shares of arrivals (shares sum to 1).

    Build it from what was asked recently (`from_requests`): the gateway feeds it recent
    launches, the benchmark the pod list. Hashable, so policies built on it can be cached.
    """

    mix: tuple[tuple[Demand, float], ...]

    @classmethod
    def from_requests(cls, requests: Iterable[InstanceType | Demand]) -> Workload:
        counts = Counter(r if isinstance(r, Demand) else Demand.of(r) for r in requests)
        return cls.from_counts(counts)

    @classmethod
    def from_counts(cls, counts: Counter[Demand] | dict[Demand, float]) -> Workload:
        total = float(sum(counts.values()))
        if total <= 0:
            raise ValueError("a workload needs at least one request")
        ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return cls(tuple((d, n / total) for d, n in ordered if n > 0))

    @classmethod
    def of(cls, itype: InstanceType) -> Workload:
        """The workload of one shape: "expect more requests like this one"."""
        return cls(((Demand.of(itype), 1.0),))

    def typical(self, coverage: float = 0.95, *, memory: bool = False) -> Workload:
        """The most frequent shapes that together cover ``coverage`` of arrivals, with
        shares renormalised; the FGD artifact keeps 95% so rare shapes don't dominate
        the cost of every score. Unless ``memory``, shapes are first merged on what FGD
        looks at (CPU and GPU, not memory)."""
        merged: dict[Demand, float] = {}
        for d, share in self.mix:
            mem = d.mem_mib if memory else 0
            key = Demand(d.cpu_milli, mem, d.gpu_count, d.gpu_milli, d.gpu_models)
            merged[key] = merged.get(key, 0.0) + share
        ordered = sorted(merged.items(), key=lambda kv: (-kv[1], kv[0]))
        kept: list[tuple[Demand, float]] = []
        covered = 0.0
        for d, share in ordered:
            if covered >= coverage - 1e-12:
                break
            kept.append((d, share))
            covered += share
        return Workload(tuple((d, s / covered) for d, s in kept))


def parse_workload_toml(text: str, catalog: Mapping[str, InstanceType]) -> Workload:
    """An operator's declared launch mix, from TOML: instance type = relative weight::

        [workload]
        "g5.xlarge" = 40
        "gs1.quarter" = 25
        "m7i.large" = 35

    Every type must be in ``catalog``; weights are positive numbers. Raises ValueError
    naming what is wrong.
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"invalid TOML: {exc}") from None
    table = doc.get("workload")
    if not isinstance(table, dict) or not table:
        raise ValueError("[workload] must be a non-empty table of instance type = weight")
    counts: dict[Demand, float] = {}
    for name, weight in table.items():
        if isinstance(weight, dict):  # g5.xlarge = 1 unquoted is a table g5 in TOML
            raise ValueError(f"workload.{name}: quote type names that hold a dot, as in "
                             f'"{name}.{next(iter(weight), "")}" = ...')
        itype = catalog.get(name)
        if itype is None:
            raise ValueError(f"workload.{name}: unknown instance type")
        if (isinstance(weight, bool) or not isinstance(weight, int | float)
                or not math.isfinite(weight) or weight <= 0):
            raise ValueError(f"workload.{name}: the weight must be a positive number")
        demand = Demand.of(itype)
        counts[demand] = counts.get(demand, 0.0) + float(weight)
    return Workload.from_counts(counts)


_WEIGHT_SCALE = 1 << 24


class _Group:
    """Shapes that ask the same devices (count, milli, accepted models), by CPU ask.
    Shares are held as integer weights so that sums are exact and equal states score
    equal."""

    __slots__ = ("count", "cpus", "cum", "mems", "milli", "models", "weights")

    def __init__(
        self, count: int, milli: int, models: tuple[str, ...], shapes: list[tuple[Demand, int]]
    ):
        self.count, self.milli, self.models = count, milli, models
        shapes = sorted(shapes, key=lambda ds: (ds[0].cpu_milli, ds[0].mem_mib))
        self.cpus = [d.cpu_milli for d, _ in shapes]
        self.mems = [d.mem_mib for d, _ in shapes]
        self.weights = [w for _, w in shapes]
        self.cum = list(accumulate(self.weights))


class GpuFragmentation:
    """F_n(M): the GPU milli a node is expected to strand for a request drawn from M.

    Called with a node's free CPU, memory and per-device free milli and models. With
    ``memory=False`` (as published) a shape runs where CPU and devices suffice; with
    ``memory=True`` it must also fit in free memory, which is the fit rule nodes apply.
    Results are memoised by argument: they are a pure function of them.
    """

    def __init__(self, workload: Workload, *, memory: bool = False) -> None:
        self.workload = workload
        self.memory = memory
        groups: dict[tuple[int, int, tuple[str, ...]], list[tuple[Demand, int]]] = {}
        self._total_weight = 0
        for d, share in workload.mix:
            weight = round(share * _WEIGHT_SCALE)
            self._total_weight += weight
            if d.gpu_count:
                key = (d.gpu_count, d.gpu_milli, d.gpu_models)
                groups.setdefault(key, []).append((d, weight))
        # Larger per-device asks first: a node that can't serve 470 milli can't serve 810.
        self._groups = [
            _Group(c, m, models, shapes)
            for (c, m, models), shapes in sorted(groups.items(), key=lambda kv: -kv[0][1])
        ]
        self._memo: dict[tuple[int, int, tuple[int, ...], tuple[str, ...]], int] = {}

    def __call__(
        self, cpu_free: int, mem_free: int, gpu_free: Sequence[int], models: Sequence[str]
    ) -> float:
        """F_n(M) in GPU milli."""
        return self.weighted(cpu_free, mem_free, gpu_free, models) / self._total_weight

    def weighted(
        self, cpu_free: int, mem_free: int, gpu_free: Sequence[int], models: Sequence[str]
    ) -> int:
        """F_n(M) times the workload's total weight, exactly: differences of these are
        equal exactly when the fragmentation changes are, so ties stay ties."""
        key = (cpu_free, mem_free if self.memory else 0, tuple(gpu_free), tuple(models))
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        value = self._compute(cpu_free, mem_free, key[2], key[3])
        if len(self._memo) > 500_000:
            self._memo.clear()
        self._memo[key] = value
        return value

    @property
    def total_weight(self) -> int:
        return self._total_weight

    def _compute(
        self, cpu_free: int, mem_free: int, gpu_free: tuple[int, ...], models: tuple[str, ...]
    ) -> int:
        total = sum(gpu_free)
        if total == 0:
            return 0
        usable = 0  # over shapes that run: weight x milli they can use
        for g in self._groups:
            if g.cpus[0] > cpu_free:
                continue
            count = milli = 0
            for f, model in zip(gpu_free, models, strict=True):
                if f >= g.milli and (not g.models or model in g.models):
                    count += 1
                    milli += f
            if count < g.count:
                continue
            if self.memory:
                weight = sum(
                    w
                    for c, m, w in zip(g.cpus, g.mems, g.weights, strict=True)
                    if c <= cpu_free and m <= mem_free
                )
            else:
                weight = g.cum[bisect_right(g.cpus, cpu_free) - 1]
            usable += weight * milli
        return total * self._total_weight - usable


GpuInventory = tuple[tuple[str, int], ...]
"""``((model, devices), ...)``: how many GPU devices of each model a cluster has."""


def scarcity(demand: Demand, inventory: GpuInventory) -> float:
    """How many times scarcer the devices ``demand`` may use are than the cluster's GPUs:
    all devices over those of its models (1 for a shape that takes any model, or when
    the cluster has none of them: such a shape fits nowhere, so its weight is moot)."""
    total = sum(n for _, n in inventory)
    if not demand.gpu_models or not total:
        return 1.0
    reach = sum(n for m, n in inventory if m in demand.gpu_models)
    return total / reach if reach else 1.0


class UsableCapacity:
    """How much GPU a node can still give the workload, counted in whole requests.

    For each GPU shape of the workload, `roost.domain.fit.fit_count` says how many more
    such requests the node's free CPU, memory and devices hold; times the shape's GPU
    ask, that is the GPU milli the shape could still use there. The mean over shapes,
    weighted by share, is the node's usable capacity U_n(M). Where FGD asks "can one
    more request run here?", this asks "how many?": it sees a node whose CPU runs out
    before its GPUs do, and the remainder a slice leaves on a device. Memoised, and
    exact (integer weights), like `GpuFragmentation.weighted`.

    Given the cluster's ``inventory``, a shape limited to some GPU models weighs its
    share times its `scarcity` (the mean stays a mean: weights are renormalised): room
    for a shape that may use 4% of the cluster's GPUs is worth 25 times room for one
    that may use any, per request expected. So a request that could go anywhere leaves
    the scarce models to the requests that need them, which no one node can see: it is
    the cluster's device mix against the workload's. With no model sets in the workload
    every factor is 1 and U is exactly as without an inventory.
    """

    def __init__(self, workload: Workload, inventory: GpuInventory = ()) -> None:
        self.workload = workload
        self._shapes = [
            (d.as_type(),
             round(share * _WEIGHT_SCALE * scarcity(d, inventory)) * d.gpu_total_milli)
            for d, share in workload.mix
            if d.gpu_count
        ]
        self.total_weight = sum(round(share * _WEIGHT_SCALE * scarcity(d, inventory))
                                for d, share in workload.mix)
        self._memo: dict[tuple[int, int, tuple[int, ...], tuple[str, ...]], int] = {}

    def weighted(self, cap: FreeCapacity) -> int:
        """U_n(M) times the workload's total weight."""
        r = cap.resources
        key = (r.cpu_milli, r.mem_mib, cap.gpu_free, cap.gpu_models)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        value = 0
        if any(cap.gpu_free):
            value = sum(w * fit_count(cap, t) for t, w in self._shapes)
        if len(self._memo) > 500_000:
            self._memo.clear()
        self._memo[key] = value
        return value


class UsableResources:
    """`UsableCapacity` for hosts without GPUs: what the node can still give the
    workload in CPU and memory, counted in whole requests.

    Each shape's `fit_count` on the node, times what one such request is worth there
    (its share of the node's allocatable CPU plus its share of memory), weighted by the
    shape's share of arrivals. Exact: the value is kept as an integer over the common
    denominator ``alloc_cpu x alloc_mem``.
    """

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self._shapes = [
            (d.as_type(), round(share * _WEIGHT_SCALE)) for d, share in workload.mix
        ]
        self.total_weight = sum(w for _, w in self._shapes)
        self._memo: dict[tuple[int, int, int, int], int] = {}

    def weighted(self, cap: FreeCapacity, alloc_cpu: int, alloc_mem: int) -> int:
        """U_n(M) x total weight x alloc_cpu x alloc_mem."""
        r = cap.resources
        key = (r.cpu_milli, r.mem_mib, alloc_cpu, alloc_mem)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        value = sum(
            w * fit_count(cap, t) * (t.cpu_milli * alloc_mem + t.mem_mib * alloc_cpu)
            for t, w in self._shapes
        )
        if len(self._memo) > 500_000:
            self._memo.clear()
        self._memo[key] = value
        return value


class WorkloadWindow:
    """The workload a gateway can know: the last ``size`` instances asked of it.

    `observe` each request; `current` is a `Workload` over the window, rebuilt only
    every ``refresh`` requests so that policies built on it (and their memoised
    measures) live long enough to pay off. None until the first rebuild.
    """

    def __init__(self, size: int = 5000, refresh: int = 500) -> None:
        if size <= 0 or refresh <= 0:
            raise ValueError("window size and refresh must be positive")
        self.size, self.refresh = size, refresh
        self._recent: deque[Demand] = deque(maxlen=size)
        self._since = 0
        self._current: Workload | None = None

    def observe(self, request: InstanceType | Demand) -> None:
        self._recent.append(request if isinstance(request, Demand) else Demand.of(request))
        self._since += 1
        if self._since >= self.refresh:
            self._since = 0
            self._current = Workload.from_requests(self._recent)

    def current(self) -> Workload | None:
        return self._current

    def __len__(self) -> int:
        """Requests remembered now (at most ``size``)."""
        return len(self._recent)
