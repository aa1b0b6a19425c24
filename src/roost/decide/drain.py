"""Drain-safe scale-down, as steps the reconcile loop applies.

A replica is removed only through a drained worker; several drain at once:

1. when the plan is k below current, mark up to k of the least-busy active workers
   *draining* (they stop taking tasks), no more than the pool's disruption budget lets
   start in its period;
2. once some report no running tasks and no leases, *after* they saw the mark, commit
   their removal together (record the replica count asked for on each), give their
   instances the lowest termination priority, and ask the orchestrator once for
   ``current - (number drained)`` replicas: one removal for the batch;
3. a drain that outlasts its timeout, or that demand made pointless, re-activates the
   worker instead (when demand returns only part of the way, only the drains it no
   longer needs are kept).

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
    """Remove the replicas of ``worker_id`` and of the drained workers in ``also``
    (``(worker_id, instance_ref)`` pairs) in one batch: ``replicas`` is the absolute
    count to ask for (an idempotent request), or None when the orchestrator is already
    there and only the workers' records are left to close."""

    pool_id: str
    worker_id: str
    instance_ref: str
    replicas: int | None
    priority: int = REMOVE_PRIORITY
    also: tuple[tuple[str, str], ...] = ()
    kind = "remove"

    @property
    def victims(self) -> tuple[tuple[str, str], ...]:
        return ((self.worker_id, self.instance_ref), *self.also)


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
    budget: int = 1,
) -> DrainDecision:
    """The scale-down steps for one pool. ``desired`` is already windowed and capped;
    ``budget`` is how many new drains the pool's disruption budget still allows."""
    draining = [w for w in workers if w.status is WorkerStatus.DRAINING]
    removing = [w for w in draining if w.removal_target is not None]
    if removing:
        return _finish_removal(pool_id, removing, infra, frozen)

    steps: list[Step] = []
    left: list[WorkerView] = []
    for w in draining:
        since = w.draining_since if w.draining_since is not None else now
        if now - since > settings.drain_timeout:
            steps.append(Reactivate(pool_id, w.worker_id, "drain_timeout"))
        else:
            left.append(w)
    if frozen:
        return DrainDecision(tuple(steps), "frozen" if left else "")
    excess = max(0, current - desired)
    if len(left) > excess:  # demand returned: keep only the drains still needed
        order = sorted(left, key=lambda w: (not drained(w, now, settings), w.busy, w.worker_id))
        steps += [Reactivate(pool_id, w.worker_id, "demand_returned") for w in order[excess:]]
        left = order[:excess]
    notes: list[str] = []
    done = sorted((w for w in left if drained(w, now, settings)), key=lambda w: w.worker_id)
    if infra is not None and infra.removal_batch is not None:
        done = done[:max(1, infra.removal_batch)]
    if done:
        wait = _removal_blocker(done, infra, current)
        if wait:
            notes.append(wait)
        else:
            first, *rest = done
            steps.append(RemoveReplica(pool_id, first.worker_id, first.instance_ref,
                                       current - len(done),
                                       also=tuple((w.worker_id, w.instance_ref) for w in rest)))
    busy = sorted((w for w in left if not drained(w, now, settings)), key=lambda w: w.worker_id)
    if busy:
        w = busy[0]
        more = f" (+{len(busy) - 1} more)" if len(busy) > 1 else ""
        notes.append(f"draining {w.worker_id}: {w.running_tasks} running, "
                     f"{w.active_leases} leases{more}")
    # Never drain below `desired` serving workers (active, fresh, on a ready instance:
    # the ones `_least_busy` may pick). Replicas still starting count in `current` but
    # serve nothing, and neither does a silent worker: draining for them would leave
    # the pool fewer serving workers than it wants. A starting replica is drained once
    # it serves, if still in excess.
    candidates = _least_busy(workers, infra, now, settings)
    serving = len(candidates)
    wanted = excess - len(left)
    if wanted > 0 and wanted > serving - desired:
        notes.append(f"{wanted - max(0, serving - desired)} to drain once more workers "
                     f"serve ({serving} serving, {desired} wanted)")
        wanted = serving - desired
    if wanted > 0:
        if budget <= 0:
            notes.append(f"disruption budget spent: {wanted} more to drain later")
        else:
            picks = candidates[:min(wanted, budget)]
            if not picks:
                notes.append("no active worker with a fresh heartbeat to drain")
            steps += [MarkDraining(pool_id, w.worker_id) for w in picks]
            if 0 < len(picks) < wanted:
                notes.append(f"drained {len(picks)} of {wanted} now (disruption budget)")
    return DrainDecision(tuple(steps), "; ".join(notes))


def _finish_removal(
    pool_id: str, removing: Sequence[WorkerView], infra: Infra | None, frozen: bool
) -> DrainDecision:
    """A removal a leader committed to: re-ask for the same count (idempotent) until
    the orchestrator is there, then close the records. Never re-activated: their
    instances may already be going. A batch shares one count."""
    first, *rest = sorted(removing, key=lambda w: w.worker_id)
    if frozen or infra is None:
        return DrainDecision((), f"removal of {first.worker_id} pending")
    targets = [w.removal_target for w in removing if w.removal_target is not None]
    target = min(targets) if targets else infra.target_replicas
    ask = target if infra.target_replicas > target else None
    also = tuple((w.worker_id, w.instance_ref) for w in rest)
    return DrainDecision((RemoveReplica(pool_id, first.worker_id, first.instance_ref, ask,
                                        also=also),))


def _removal_blocker(done: Sequence[WorkerView], infra: Infra | None, current: int) -> str:
    if infra is None:
        return "orchestrator state unknown"
    if not infra.settled:
        return "waiting for the orchestrator to settle before removing a replica"
    refs = {i.ref for i in infra.instances}
    for w in done:
        if w.instance_ref not in refs:
            return f"instance {w.instance_ref!r} of {w.worker_id} not found in the orchestrator"
    if current < len(done):
        return "no replica to remove"
    return ""


def _least_busy(
    workers: Sequence[WorkerView], infra: Infra | None, now: float, settings: PlanSettings,
) -> list[WorkerView]:
    """The workers a drain may pick (active, fresh, on a ready instance), least busy
    first: they are also the ones that serve."""
    ready = {i.ref for i in infra.instances if i.ready} if infra is not None else set()
    pool = [
        w
        for w in workers
        if w.status is WorkerStatus.ACTIVE
        and fresh(w, now, settings)
        and w.instance_ref in ready
    ]
    return sorted(pool, key=lambda w: (w.busy, w.running_tasks, w.worker_id))
