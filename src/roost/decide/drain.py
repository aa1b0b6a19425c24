"""Drain-safe scale-down, as steps the reconcile loop applies.

A replica is removed only through a drained worker, one per pool at a time:

1. mark the least-busy active worker *draining* (it stops taking tasks);
2. once it reports no running tasks and no leases, *after* it saw the mark, commit the
   removal (record the replica count asked for), give its instance the lowest
   termination priority, and ask the orchestrator for one replica fewer;
3. a drain that outlasts its timeout, or that demand made pointless, re-activates the
   worker instead.

Steps are plain data, as Ray's autoscaler hands ``to_launch``/``to_terminate`` to its
reconciler: this module decides, the controller acts, and errors come back as data on
the next tick.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from roost.decide.snapshot import Infra, PlanSettings, WorkerStatus, WorkerView

REMOVE_PRIORITY = -1000
"""Termination priority of a drained worker's instance: the lowest goes first, like
Kubernetes' ``controller.kubernetes.io/pod-deletion-cost``."""


@dataclass(frozen=True, slots=True)
class ScaleUp:
    pool_id: str
    replicas: int
    kind = "scale_up"


@dataclass(frozen=True, slots=True)
class MarkDraining:
    pool_id: str
    worker_id: str
    kind = "drain"


@dataclass(frozen=True, slots=True)
class Reactivate:
    pool_id: str
    worker_id: str
    why: str
    kind = "reactivate"


@dataclass(frozen=True, slots=True)
class RemoveReplica:
    """Remove ``worker_id``'s replica: ``replicas`` is the absolute count to ask for (an
    idempotent request), or None when the orchestrator is already there and only the
    worker's record is left to close."""

    pool_id: str
    worker_id: str
    instance_ref: str
    replicas: int | None
    priority: int = REMOVE_PRIORITY
    kind = "remove"


Step = ScaleUp | MarkDraining | Reactivate | RemoveReplica


def fresh(worker: WorkerView, now: float, settings: PlanSettings) -> bool:
    return now - worker.heartbeat_at <= settings.heartbeat_timeout


def drained(worker: WorkerView, now: float, settings: PlanSettings) -> bool:
    """No tasks, no leases, in a fresh report made after the worker was marked.

    A report from before the mark could predate a task the worker claimed just before
    it saw the mark; only a later one proves it is empty.
    """
    return (
        worker.status is WorkerStatus.DRAINING
        and worker.running_tasks == 0
        and worker.active_leases == 0
        and worker.draining_since is not None
        and worker.heartbeat_at >= worker.draining_since
        and fresh(worker, now, settings)
    )


@dataclass(frozen=True, slots=True)
class DrainDecision:
    steps: tuple[Step, ...]
    note: str = ""
    """Why nothing further happens yet, for /status (e.g. "w-2 has 3 running tasks")."""


def decide_drain(
    pool_id: str,
    workers: Sequence[WorkerView],
    *,
    current: int,
    desired: int,
    infra: Infra | None,
    frozen: bool,
    now: float,
    settings: PlanSettings,
) -> DrainDecision:
    """The scale-down steps for one pool. ``desired`` is already windowed and capped."""
    draining = [w for w in workers if w.status is WorkerStatus.DRAINING]
    removing = [w for w in draining if w.removal_target is not None]
    if removing:
        return _finish_removal(pool_id, removing[0], infra, frozen)

    steps: list[Step] = []
    left: list[WorkerView] = []
    for w in draining:
        since = w.draining_since if w.draining_since is not None else now
        if now - since > settings.drain_timeout:
            steps.append(Reactivate(pool_id, w.worker_id, "drain_timeout"))
        elif not frozen and desired >= current:
            steps.append(Reactivate(pool_id, w.worker_id, "demand_returned"))
        else:
            left.append(w)
    if frozen:
        return DrainDecision(tuple(steps), "frozen" if left else "")
    if left:
        w = min(left, key=lambda x: x.worker_id)
        if not drained(w, now, settings):
            return DrainDecision(
                tuple(steps),
                f"draining {w.worker_id}: {w.running_tasks} running, {w.active_leases} leases",
            )
        wait = _removal_blocker(w, infra, current)
        if wait:
            return DrainDecision(tuple(steps), wait)
        steps.append(RemoveReplica(pool_id, w.worker_id, w.instance_ref, current - 1))
        return DrainDecision(tuple(steps))
    if desired < current:
        pick = _least_busy(workers, infra, now, settings)
        if pick is None:
            return DrainDecision(tuple(steps), "no active worker with a fresh heartbeat to drain")
        steps.append(MarkDraining(pool_id, pick.worker_id))
    return DrainDecision(tuple(steps))


def _finish_removal(
    pool_id: str, w: WorkerView, infra: Infra | None, frozen: bool
) -> DrainDecision:
    """A removal a leader committed to: re-ask for the same count (idempotent) until
    the orchestrator is there, then close the record. Never re-activated: its instance
    may already be going."""
    if frozen or infra is None:
        return DrainDecision((), f"removal of {w.worker_id} pending")
    target = w.removal_target if w.removal_target is not None else infra.target_replicas
    ask = target if infra.target_replicas > target else None
    return DrainDecision((RemoveReplica(pool_id, w.worker_id, w.instance_ref, ask),))


def _removal_blocker(w: WorkerView, infra: Infra | None, current: int) -> str:
    if infra is None:
        return "orchestrator state unknown"
    if not infra.settled:
        return "waiting for the orchestrator to settle before removing a replica"
    if w.instance_ref not in {i.ref for i in infra.instances}:
        return f"instance {w.instance_ref!r} of {w.worker_id} not found in the orchestrator"
    if current < 1:
        return "no replica to remove"
    return ""


def _least_busy(
    workers: Sequence[WorkerView], infra: Infra | None, now: float, settings: PlanSettings
) -> WorkerView | None:
    ready = {i.ref for i in infra.instances if i.ready} if infra is not None else set()
    pool = [
        w
        for w in workers
        if w.status is WorkerStatus.ACTIVE
        and fresh(w, now, settings)
        and w.instance_ref in ready
    ]
    if not pool:
        return None
    return min(pool, key=lambda w: (w.busy, w.running_tasks, w.worker_id))
