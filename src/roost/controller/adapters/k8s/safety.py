"""Removing exactly the drained pod.

A Deployment cannot be told *which* pod to remove; its ReplicaSet controller ranks the
active pods and deletes the first ones: unassigned before assigned, Pending before
Unknown before Running, not Ready before Ready, and only then the lower
``pod-deletion-cost`` (then pods doubled up on a node, shorter Ready time, more
restarts, newer). So the lowest cost decides only among pods that tie on the first
three rules. Before asking for k replicas fewer (k drained pods, one batch), the
adapter checks that every other pod is Ready, Running and scheduled, that no rollout is
mixing two ReplicaSets, and that every other pod's cost is strictly above every drained
pod's, read back from the API server. After asking, it compares the pods before and
after, and reports which ones actually went.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


def removal_blockers(pods: Sequence[Pod], *, replicas: int,
                     victims: Mapping[str, int | None]) -> list[str]:
    """Why removing ``len(victims)`` of ``replicas`` replicas now (one when ``victims``
    is empty: no drained pod was named) could take another pod than the drained ones.
    ``victims`` maps each drained pod to the deletion cost roost wrote on it (None: not
    checked). Empty: it is safe.

    The ReplicaSet removes the k pods it ranks first. The drained pods may rank first
    for being not ready, never later: so when every other pod is Ready, Running and
    scheduled, and costs strictly more to delete than every drained pod, the k that go
    are exactly the drained ones."""
    active = [p for p in pods if is_active(p)]
    blockers: list[str] = []
    if len(active) != replicas:
        blockers.append(f"{len(active)} active pods for {replicas} replicas")
    hashes = sorted({pod_labels(p).get(TEMPLATE_HASH, "") for p in active})
    if len(hashes) > 1:
        blockers.append(f"a rollout is in progress (template hashes {', '.join(hashes)})")
    for p in active:
        if name(p) not in victims and (why := why_not_serving(p)):
            blockers.append(f"pod {name(p)} is {why}")
    if not victims:
        return blockers
    by_name = {name(p): p for p in active}
    highest: int | None = None
    for victim, expected_cost in sorted(victims.items()):
        drained = by_name.get(victim)
        if drained is None:
            blockers.append(f"drained pod {victim} is not an active pod of the Deployment")
            continue
        found = pod_annotations(drained).get(DELETION_COST)
        if expected_cost is not None and found != str(expected_cost):
            blockers.append(f"{DELETION_COST} on {victim} reads {found!r}, not "
                            f"'{expected_cost}': the annotation has not landed")
        cost = deletion_cost(drained)
        highest = cost if highest is None else max(highest, cost)
    if highest is None:
        return blockers
    rivals = sorted(name(p) for p in active if name(p) not in victims
                    and deletion_cost(p) <= highest)
    if rivals:
        names = ", ".join(sorted(victims))
        blockers.append(f"{', '.join(rivals)} cost no more than {names} ({highest}) to delete")
    return blockers


PENDING, OK, MISMATCH, UNVERIFIED, STUCK = "pending", "ok", "mismatch", "unverified", "stuck"


@dataclass(frozen=True, slots=True)
class RemovalCheck:
    """One scale-down and what became of it, for ``/status``.

    outcome: ``pending`` (not every drained pod gone yet, and no other), ``ok`` (the
    drained pods went), ``mismatch`` (another pod went: its worker was killed while a
    drained one still runs),
    ``unverified`` (no drained pod was named, so any pod could go), ``stuck`` (still
    nothing gone after the patience).
    """

    pool_id: str
    deployment: str
    expected: tuple[str, ...]
    """The drained pods that should go (empty: none was named, any may go)."""
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
    if not gone or set(gone) < set(check.expected):  # a batch's rest is on its way
        if now - check.requested_at > patience:
            who = "no pod has" if not gone else "not every drained pod has"
            return replace(check, outcome=STUCK,
                           detail=f"{who} left {patience:g}s after asking for "
                                  f"{check.replicas} replicas")
        return check
    done = replace(check, removed=gone, resolved_at=now)
    drained = ", ".join(check.expected)
    if not check.expected:
        return replace(done, outcome=UNVERIFIED,
                       detail=f"removed {', '.join(gone)}; no drained pod was named")
    if set(check.expected) <= set(gone):
        others = [g for g in gone if g not in check.expected]
        extra = f" (also gone: {', '.join(others)})" if others else ""
        return replace(done, outcome=OK, detail=f"removed drained {drained}{extra}")
    wrong = [g for g in gone if g not in check.expected]
    return replace(done, outcome=MISMATCH,
                   detail=f"removed {', '.join(wrong)} instead of drained {drained}")

