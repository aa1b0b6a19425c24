"""The Orchestrator protocol: how the controller sees and sizes a pool's replicas.

Adapters: ``fake`` (in memory, for tests and demos), ``static`` (a host list from a
config file; it records targets for an operator), and later roost's own nodes (instances
launched through the EC2 gateway) and Kubernetes (a Deployment's replicas and
``controller.kubernetes.io/pod-deletion-cost``). All of them pass the same contract
suite (tests/orchestrator_contract.py).

Rules every adapter keeps:

- Methods are async and return plain frozen data, never client objects.
- ``scale_pool`` takes an *absolute* replica count: asking twice for the same count is
  a no-op, so a retry or a new leader finishing a removal cannot remove twice.
  ``request_id`` is stable for one decision; an adapter that launches instances uses it
  as the idempotency key of those launches (ClientToken on the native adapter).
- When asked for fewer replicas, remove instances with the lowest termination priority
  first (not-ready instances may go even before them, as Kubernetes does; the controller
  only shrinks a settled pool, so that never happens to it).
- Failures are exceptions from the tree below, never bare client errors:

  OrchestratorError            (a `roost.domain.errors.RoostError`: permanent unless
   │                            its kind says transient)
   ├── OrchestratorUnavailable  transient: could not reach it or it timed out; retry
   ├── UnknownPool              the pool's reference names nothing there
   ├── UnknownInstance          no such instance in that pool
   └── ScaleRejected            it answered and refused (quota, invalid count)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from roost.decide.snapshot import Infra, InstanceView, NodeFigures
from roost.domain.errors import RoostError

PoolState = Infra
"""What an adapter reports for a pool: the replica count it is trying to run
(``target_replicas``), its instances with readiness and termination priority, the nodes
that can run the pool's workers with their allocatable and used CPU/memory and memory
pressure, and when it observed all that. The plan consumes it as is."""

__all__ = [
    "InstanceView",
    "NodeFigures",
    "Orchestrator",
    "OrchestratorError",
    "OrchestratorUnavailable",
    "PoolRef",
    "PoolState",
    "ScaleRejected",
    "ScaleResult",
    "UnknownInstance",
    "UnknownPool",
]


class OrchestratorError(RoostError):
    pass


class OrchestratorUnavailable(OrchestratorError):
    kind = "transient"


class UnknownPool(OrchestratorError):
    pass


class UnknownInstance(OrchestratorError):
    pass


class ScaleRejected(OrchestratorError):
    pass


@dataclass(frozen=True, slots=True)
class PoolRef:
    """Which pool: roost's pool id and the adapter's own reference for it (a Deployment
    name, a launch template, a section of the static config)."""

    pool_id: str
    ref: str


@dataclass(frozen=True, slots=True)
class ScaleResult:
    previous: int
    target: int


@runtime_checkable
class Orchestrator(Protocol):
    name: str

    async def pool_state(self, pool: PoolRef) -> PoolState: ...

    async def scale_pool(self, pool: PoolRef, replicas: int, *, request_id: str) -> ScaleResult:
        """Ask for exactly ``replicas`` replicas (absolute, idempotent)."""
        ...

    async def set_instance_termination_priority(
        self, pool: PoolRef, instance_ref: str, *, priority: int
    ) -> None:
        """Lower goes first on scale-down; the controller sets -1000 on a drained one."""
        ...

    async def close(self) -> None: ...


def check_replicas(replicas: int) -> None:
    if replicas < 0:
        raise ValueError(f"replicas must be >= 0, got {replicas}")
