"""Removing exactly the drained pod.

A Deployment cannot be told *which* pod to remove; its ReplicaSet controller ranks the
active pods and deletes the first ones: unassigned before assigned, Pending before
Unknown before Running, not Ready before Ready, and only then the lower
``pod-deletion-cost`` (then pods doubled up on a node, shorter Ready time, more
restarts, newer). So the lowest cost decides only among pods that tie on the first
three rules. Before asking for one replica fewer, the adapter checks that every other
pod is Ready, Running and scheduled, that no rollout is mixing two ReplicaSets, and that
the drained pod's cost is strictly the lowest, read back from the API server. After
asking, it compares the pods before and after, and reports which one actually went.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from lightkube.models.core_v1 import Pod

from roost.controller.adapters.k8s.pods import (
    DELETION_COST,
    TEMPLATE_HASH,
    deletion_cost,
    is_active,
    name,
    pod_annotations,
    pod_labels,
    why_not_serving,
)


def removal_blockers(pods: Sequence[Pod], *, replicas: int, victim: str | None,
                     expected_cost: int | None) -> list[str]:
    """Why removing one of ``replicas`` replicas now could take another pod than
    ``victim`` (the drained one; None when none was named). Empty: it is safe."""
    active = [p for p in pods if is_active(p)]
    blockers: list[str] = []
    if len(active) != replicas:
        blockers.append(f"{len(active)} active pods for {replicas} replicas")
    hashes = sorted({pod_labels(p).get(TEMPLATE_HASH, "") for p in active})
    if len(hashes) > 1:
        blockers.append(f"a rollout is in progress (template hashes {', '.join(hashes)})")
    for p in active:
        if name(p) != victim and (why := why_not_serving(p)):
            blockers.append(f"pod {name(p)} is {why}")
    if victim is None:
        return blockers
    drained = next((p for p in active if name(p) == victim), None)
    if drained is None:
        blockers.append(f"drained pod {victim} is not an active pod of the Deployment")
        return blockers
    found = pod_annotations(drained).get(DELETION_COST)
    if expected_cost is not None and found != str(expected_cost):
        blockers.append(f"{DELETION_COST} on {victim} reads {found!r}, not "
                        f"'{expected_cost}': the annotation has not landed")
    cost = deletion_cost(drained)
    rivals = sorted(name(p) for p in active if p is not drained and deletion_cost(p) <= cost)
    if rivals:
        blockers.append(f"{', '.join(rivals)} cost no more than {victim} ({cost}) to delete")
    return blockers


PENDING, OK, MISMATCH, UNVERIFIED, STUCK = "pending", "ok", "mismatch", "unverified", "stuck"


@dataclass(frozen=True, slots=True)
class RemovalCheck:
    """One scale-down and what became of it, for ``/status``.

    outcome: ``pending`` (nothing gone yet), ``ok`` (the drained pod went), ``mismatch``
    (another pod went: its worker was killed while the drained one still runs),
    ``unverified`` (no drained pod was named, so any pod could go), ``stuck`` (still
    nothing gone after the patience).
    """

    pool_id: str
    deployment: str
    expected: str | None
    before: tuple[str, ...]
    replicas: int
    requested_at: float
    outcome: str = PENDING
    removed: tuple[str, ...] = ()
    resolved_at: float | None = None
    detail: str = ""

    @property
    def open(self) -> bool:
        return self.outcome in (PENDING, STUCK)


def resolve(check: RemovalCheck, pods: Sequence[Pod], *, now: float,
            patience: float) -> RemovalCheck:
    """``check`` brought up to date with the Deployment's pods as they are now.

    A pod counts as gone once it is no longer active: the ReplicaSet controller marks
    its choice for deletion at once, though the pod may take its grace period to exit.
    """
    if not check.open:
        return check
    active = {name(p) for p in pods if is_active(p)}
    gone = tuple(sorted(set(check.before) - active))
    if not gone:
        if now - check.requested_at > patience:
            return replace(check, outcome=STUCK,
                           detail=f"no pod has left {patience:g}s after asking for "
                                  f"{check.replicas} replicas")
        return check
    done = replace(check, removed=gone, resolved_at=now)
    if check.expected is None:
        return replace(done, outcome=UNVERIFIED,
                       detail=f"removed {', '.join(gone)}; no drained pod was named")
    if check.expected in gone:
        others = [g for g in gone if g != check.expected]
        extra = f" (also gone: {', '.join(others)})" if others else ""
        return replace(done, outcome=OK, detail=f"removed drained {check.expected}{extra}")
    return replace(done, outcome=MISMATCH,
                   detail=f"removed {', '.join(gone)} instead of drained {check.expected}")
