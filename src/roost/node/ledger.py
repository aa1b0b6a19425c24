"""The node's authoritative allocation: what is committed, and what fits now.

Every launch on this node goes through `Ledger.allocate`, which checks and commits
under one lock. The lock is a threading lock, not an asyncio one, so the check and
the commit can't be split by an ``await`` and stay atomic even if a driver thread
releases concurrently.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace

from roost.domain.catalog import Catalog, InstanceType
from roost.domain.fit import (
    FreeCapacity,
    GpuAssignment,
    assign_gpus,
    assignment_on,
    fit_count,
    give,
    take,
)
from roost.domain.host import HostCapacity


@dataclass(frozen=True, slots=True)
class Allocation:
    instance_id: str
    itype: InstanceType
    gpus: GpuAssignment


class Ledger:
    """``overhead_mib`` is memory the node spends per instance beyond its type (a VM's
    hypervisor process): each allocation takes it too, so the node never advertises
    room that its instances' overhead already uses."""

    def __init__(self, host: HostCapacity, catalog: Catalog, *, overhead_mib: int = 0) -> None:
        self.host = host
        self.catalog = catalog
        self.overhead_mib = overhead_mib
        self._lock = threading.Lock()
        self._free = host.empty()
        self._allocs: dict[str, Allocation] = {}
        self._fits: tuple[FreeCapacity, Catalog, dict[str, int]] | None = None
        """`fit_counts` as of the free capacity and catalog it was worked out for: every
        heartbeat asks twice, and most find nothing changed."""

    @property
    def free(self) -> FreeCapacity:
        return self._free

    @property
    def allocations(self) -> dict[str, Allocation]:
        with self._lock:
            return dict(self._allocs)

    @property
    def count(self) -> int:
        """How many instances hold an allocation (without copying them, as every
        heartbeat's snapshot asks)."""
        with self._lock:
            return len(self._allocs)

    def allocate(
        self, instance_id: str, itype: InstanceType, devices: Sequence[int] = ()
    ) -> Allocation | None:
        """Commit ``itype`` for ``instance_id`` if it fits; None if it doesn't.

        ``devices`` are the GPUs the gateway's placement chose: used if they still hold
        the ask, else the node picks its own (best fit). Allocating an id that already
        holds an allocation returns that allocation: a repeated launch must not take
        capacity twice.
        """
        with self._lock:
            if instance_id in self._allocs:
                return self._allocs[instance_id]
            cost = self._charged(itype)
            if not self._free.resources.covers(cost.resources):
                return None
            gpus = assignment_on(self._free, itype, devices) if devices else None
            if gpus is None:
                gpus = assign_gpus(self._free, itype)
            if gpus is None:
                return None
            alloc = Allocation(instance_id, itype, gpus)
            self._free = take(self._free, cost, gpus)
            self._allocs[instance_id] = alloc
            return alloc

    def _charged(self, itype: InstanceType) -> InstanceType:
        """What one instance of ``itype`` costs this node."""
        if not self.overhead_mib:
            return itype
        return replace(itype, mem_mib=itype.mem_mib + self.overhead_mib)

    def adopt(self, instance_id: str, itype: InstanceType, gpus: GpuAssignment) -> Allocation:
        """Re-enter an allocation that survived an agent restart, on the same devices.

        It is committed even if the node now looks over-full (say, its reserve grew):
        the instance is running, and the ledger must describe what is, so the node
        stops advertising until enough is released.
        """
        with self._lock:
            if instance_id in self._allocs:
                return self._allocs[instance_id]
            alloc = Allocation(instance_id, itype, gpus)
            self._free = take(self._free, self._charged(itype), gpus)
            self._allocs[instance_id] = alloc
            return alloc

    def release(self, instance_id: str) -> bool:
        """Free ``instance_id``'s allocation; False if it held none (already released)."""
        with self._lock:
            alloc = self._allocs.pop(instance_id, None)
            if alloc is None:
                return False
            self._free = give(self._free, self._charged(alloc.itype), alloc.gpus)
            return True

    def fit_counts(self) -> dict[str, int]:
        free, catalog, fits = self._free, self.catalog, self._fits
        if fits is None or fits[0] is not free or fits[1] is not catalog:
            fits = self._fits = (free, catalog, {
                name: fit_count(free, self._charged(t)) for name, t in catalog.items()})
        return dict(fits[2])

    def fitting_types(self) -> frozenset[str]:
        """The types of which one more fits now: the node's launch subscriptions."""
        return frozenset(name for name, n in self.fit_counts().items() if n > 0)
