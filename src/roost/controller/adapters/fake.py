"""An in-memory orchestrator that behaves like a Kubernetes ReplicaSet, for tests and
demos: it ships next to the protocol the way httpx ships MockTransport.

On scale-down it removes not-ready instances first, then the lowest termination
priority, then the newest: the order in which Kubernetes picks pods, including the trap
that a pending pod goes before the drained one. Faults are injected per operation with
`fail()`; every call is recorded in `calls`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from roost.controller.orchestrator import (
    InstanceView,
    NodeFigures,
    OrchestratorError,
    PoolRef,
    PoolState,
    ScaleResult,
    UnknownInstance,
    UnknownPool,
    check_replicas,
)


@dataclass(slots=True)
class _Instance:
    ref: str
    seq: int
    ready: bool
    priority: int = 0


@dataclass(slots=True)
class _Pool:
    target: int
    instances: list[_Instance]
    nodes: tuple[NodeFigures, ...]
    ready_on_start: bool


class FakeOrchestrator:
    name = "fake"

    def __init__(self, *, now: Callable[[], float]) -> None:
        self._now = now
        self._pools: dict[str, _Pool] = {}
        self._seq = itertools.count(1)
        self._faults: dict[str, list[OrchestratorError]] = {}
        self.calls: list[tuple[str, str, object]] = []

    # ---- test and demo controls -----------------------------------------------------

    def add_pool(self, ref: str, *, replicas: int = 0, nodes: Iterable[NodeFigures] = (),
                 ready_on_start: bool = True) -> list[str]:
        """Create a pool with ``replicas`` instances; return their refs."""
        pool = _Pool(0, [], tuple(nodes), ready_on_start)
        self._pools[ref] = pool
        self._resize(ref, pool, replicas)
        return [i.ref for i in pool.instances]

    def set_nodes(self, ref: str, nodes: Iterable[NodeFigures]) -> None:
        self._pool(ref).nodes = tuple(nodes)

    def set_ready(self, ref: str, instance_ref: str, ready: bool = True) -> None:
        self._instance(ref, instance_ref).ready = ready

    def instances(self, ref: str) -> list[str]:
        return [i.ref for i in self._pool(ref).instances]

    def fail(self, op: str, error: OrchestratorError, *, times: int = 1) -> None:
        """Make the next ``times`` calls of ``op`` ("pool_state", "scale_pool",
        "set_instance_termination_priority", or "*" for any) raise ``error``."""
        self._faults.setdefault(op, []).extend([error] * times)

    def heal(self) -> None:
        self._faults.clear()

    # ---- the protocol -----------------------------------------------------------------

    async def pool_state(self, pool: PoolRef) -> PoolState:
        self._enter("pool_state", pool, None)
        p = self._pool(pool.ref)
        await asyncio.sleep(0)
        return PoolState(
            target_replicas=p.target,
            instances=tuple(InstanceView(i.ref, i.ready, i.priority) for i in p.instances),
            nodes=p.nodes,
            observed_at=self._now(),
        )

    async def scale_pool(self, pool: PoolRef, replicas: int, *, request_id: str) -> ScaleResult:
        check_replicas(replicas)
        self._enter("scale_pool", pool, replicas)
        p = self._pool(pool.ref)
        previous = p.target
        self._resize(pool.ref, p, replicas)
        await asyncio.sleep(0)
        return ScaleResult(previous, replicas)

    async def set_instance_termination_priority(
        self, pool: PoolRef, instance_ref: str, *, priority: int
    ) -> None:
        self._enter("set_instance_termination_priority", pool, (instance_ref, priority))
        self._instance(pool.ref, instance_ref).priority = priority
        await asyncio.sleep(0)

    async def close(self) -> None:
        return None

    # ---- internals ----------------------------------------------------------------------

    def _enter(self, op: str, pool: PoolRef, arg: object) -> None:
        self.calls.append((op, pool.ref, arg))
        for key in (op, "*"):
            queue = self._faults.get(key)
            if queue:
                raise queue.pop(0)

    def _pool(self, ref: str) -> _Pool:
        try:
            return self._pools[ref]
        except KeyError:
            raise UnknownPool(f"fake orchestrator has no pool {ref!r}") from None

    def _instance(self, ref: str, instance_ref: str) -> _Instance:
        for i in self._pool(ref).instances:
            if i.ref == instance_ref:
                return i
        raise UnknownInstance(f"pool {ref!r} has no instance {instance_ref!r}")

    def _resize(self, ref: str, p: _Pool, replicas: int) -> None:
        while len(p.instances) < replicas:
            seq = next(self._seq)
            p.instances.append(_Instance(f"{ref}-{seq}", seq, p.ready_on_start))
        if len(p.instances) > replicas:
            # Kubernetes' order: not ready first, then lowest deletion cost, then newest.
            doomed = sorted(p.instances, key=lambda i: (i.ready, i.priority, -i.seq))
            gone = {i.ref for i in doomed[: len(p.instances) - replicas]}
            p.instances = [i for i in p.instances if i.ref not in gone]
        p.target = replicas

    def snapshot(self, ref: str) -> list[_Instance]:
        """A copy of a pool's instances, for assertions."""
        return [replace(i) for i in self._pool(ref).instances]
