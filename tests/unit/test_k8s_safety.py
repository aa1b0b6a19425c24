"""The removal rules (k8s.safety) on hand-made pods, and the fake API server's
ReplicaSet order that the integration tests rely on, rule by rule."""

from __future__ import annotations

from typing import Any

import pytest
from lightkube.models.core_v1 import Pod

from roost.controller.adapters.k8s.pods import DELETION_COST, TEMPLATE_HASH
from roost.controller.adapters.k8s.safety import RemovalCheck, removal_blockers, resolve
from tests.k8s_fake_api import FakeCluster, rank_for_deletion


def pod(name: str, *, ready: bool = True, cost: int | None = None, phase: str = "Running",
        node: str | None = "n1", hash_: str = "h1", deleting: bool = False) -> Pod:
    meta: dict[str, Any] = {"name": name, "labels": {TEMPLATE_HASH: hash_},
                            "annotations": {DELETION_COST: str(cost)} if cost is not None else {}}
    if deleting:
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    spec: dict[str, Any] = {"containers": [{"name": "c"}]}
    if node:
        spec["nodeName"] = node
    return Pod.from_dict({"metadata": meta, "spec": spec, "status": {
        "phase": phase, "conditions": [{"type": "Ready", "status": str(ready)}]}})


def test_a_settled_pool_with_the_lowest_cost_on_the_drained_pod_is_safe() -> None:
    pods = [pod("a"), pod("b", cost=-1000), pod("c", cost=5)]
    assert removal_blockers(pods, replicas=3, victims={"b": -1000}) == []
    # Naming no drained pod is allowed when every pod serves (any may go, as with kubectl).
    assert removal_blockers(pods, replicas=3, victims={}) == []


def test_the_drained_pod_itself_may_be_not_ready() -> None:
    pods = [pod("a"), pod("b", cost=-1000, ready=False)]
    assert removal_blockers(pods, replicas=2, victims={"b": -1000}) == []


@pytest.mark.parametrize(("pods", "replicas", "blocker"), [
    ([pod("a", ready=False), pod("b", cost=-1000)], 2, "pod a is not ready"),
    ([pod("a", node=None, phase="Pending", ready=False), pod("b", cost=-1000)], 2,
     "pod a is not scheduled"),
    ([pod("a", phase="Unknown"), pod("b", cost=-1000)], 2, "pod a is phase Unknown"),
    ([pod("a"), pod("b", cost=-1000)], 3, "2 active pods for 3 replicas"),
    ([pod("a", deleting=True), pod("b", cost=-1000), pod("c")], 3,
     "2 active pods for 3 replicas"),
    ([pod("a", hash_="h2"), pod("b", cost=-1000)], 2, "a rollout is in progress"),
    ([pod("a", cost=-1000), pod("b", cost=-1000)], 2, "a cost no more than b (-1000)"),
    ([pod("a", cost=-2000), pod("b", cost=-1000)], 2, "a cost no more than b"),
    ([pod("a"), pod("b")], 2, "reads None, not '-1000': the annotation has not landed"),
    ([pod("a"), pod("c")], 2, "drained pod b is not an active pod"),
])
def test_blockers(pods: list[Pod], replicas: int, blocker: str) -> None:
    found = removal_blockers(pods, replicas=replicas, victims={"b": -1000})
    assert any(blocker in b for b in found), found


def _check(expected: str | None = "b") -> RemovalCheck:
    names = tuple(expected.split(",")) if expected else ()
    return RemovalCheck("p", "ns/w", names, ("a", "b", "c"), 3 - max(1, len(names)),
                        requested_at=100.0)


@pytest.mark.parametrize(("expected", "left", "outcome", "detail"), [
    ("b", ["a", "b", "c"], "pending", ""),
    ("b", ["a", "c"], "ok", "removed drained b"),
    ("b", ["c"], "ok", "removed drained b (also gone: a)"),
    ("b", ["b", "c"], "mismatch", "removed a instead of drained b"),
    (None, ["b", "c"], "unverified", "removed a; no drained pod was named"),
    ("a,b", ["c"], "ok", "removed drained a, b"),
    ("a,b", ["b", "c"], "pending", ""),  # the rest of the batch is on its way
    ("a,b", ["a", "b"], "mismatch", "removed c instead of drained a, b"),
    ("a,b", ["b"], "mismatch", "removed c instead of drained a, b"),
])
def test_resolving_a_removal(expected: str | None, left: list[str], outcome: str,
                             detail: str) -> None:
    new = resolve(_check(expected), [pod(n) for n in [*left, "fresh"]], now=110.0,
                  patience=60)
    assert (new.outcome, new.detail) == (outcome, detail)
    assert new.open is (outcome == "pending")
    if not new.open:  # a resolved check stays as it is
        assert resolve(new, [], now=500.0, patience=60) == new


def test_a_batch_is_safe_only_when_every_other_pod_costs_more() -> None:
    pods = [pod("a", cost=-1000), pod("b", cost=-1000, ready=False), pod("c", cost=5)]
    assert removal_blockers(pods, replicas=3, victims={"a": -1000, "b": -1000}) == []
    pods[2] = pod("c", cost=-1000)
    assert removal_blockers(pods, replicas=3, victims={"a": -1000, "b": -1000}) == [
        "c cost no more than a, b (-1000) to delete"]
    found = removal_blockers([pod("a", cost=-1000), pod("c")], replicas=2,
                             victims={"a": -1000, "b": -1000})
    assert found == ["drained pod b is not an active pod of the Deployment"]


def test_part_of_a_batch_gone_waits_then_is_stuck() -> None:
    check = _check("a,b")
    assert resolve(check, [pod("b"), pod("c")], now=161.0, patience=60).detail == (
        "not every drained pod has left 60s after asking for 1 replicas")


def test_a_terminating_pod_counts_as_gone_and_patience_runs_out() -> None:
    pods = [pod("a"), pod("b", deleting=True), pod("c")]
    assert resolve(_check(), pods, now=101.0, patience=60).outcome == "ok"
    stuck = resolve(_check(), [pod(n) for n in "abc"], now=161.0, patience=60)
    assert stuck.outcome == "stuck" and stuck.open
    assert resolve(stuck, [pod("a"), pod("c")], now=170.0, patience=60).outcome == "ok"


# ---- the fake ReplicaSet's order, one rule at a time ---------------------------------------


def _ranked(shape: dict[str, dict[str, Any]]) -> list[str]:
    fake = FakeCluster()
    fake.add_node("n1")
    fake.add_node("n2")
    pods = []
    for name, kw in shape.items():
        restarts = kw.pop("restarts", 0)
        annotations = {"controller.kubernetes.io/pod-deletion-cost": str(kw.pop("cost"))} if (
            "cost" in kw) else {}
        pods.append(fake.add_pod("ns", name, annotations=annotations, restarts=restarts,
                                 **{"node": "n1", **kw}))
    return [p["metadata"]["name"] for p in rank_for_deletion(pods)]


@pytest.mark.parametrize(("shape", "first"), [
    # 1. unassigned before assigned, whatever else
    ({"old": {}, "unassigned": {"node": None, "phase": "Pending", "ready": False}},
     "unassigned"),
    # 2. Pending < Unknown < Running
    ({"running": {}, "unknown": {"phase": "Unknown", "ready": False},
      "pending": {"phase": "Pending", "ready": False}}, "pending"),
    ({"running": {"ready": False}, "unknown": {"phase": "Unknown", "ready": False}}, "unknown"),
    # 3. not ready before ready, even with a lower deletion cost on the ready one
    ({"drained": {"cost": -1000}, "not-ready": {"ready": False}}, "not-ready"),
    # 4. lower deletion cost
    ({"a": {"cost": 10}, "b": {"cost": -5}, "c": {}}, "b"),
    # 5. doubled up on a node before alone
    ({"alone": {"node": "n2"}, "pair-1": {}, "pair-2": {}}, "pair-2"),
    # 6. ready more recently first: it decides before restarts do
    ({"crashy": {"restarts": 3}, "ready-later": {}}, "ready-later"),
    # 8. newer before older
    ({"older": {}, "newer": {}}, "newer"),
])
def test_the_fake_replicaset_order(shape: dict[str, dict[str, Any]], first: str) -> None:
    assert _ranked(shape)[0] == first


def test_restarts_break_ties_after_ready_time() -> None:
    fake = FakeCluster()
    a = fake.add_pod("ns", "a", node="n1", restarts=5)
    b = fake.add_pod("ns", "b", node="n1")
    ready = a["status"]["conditions"][0]["lastTransitionTime"]
    b["status"]["conditions"][0]["lastTransitionTime"] = ready
    b["metadata"]["creationTimestamp"] = a["metadata"]["creationTimestamp"]
    assert [p["metadata"]["name"] for p in rank_for_deletion([b, a])] == ["a", "b"]
