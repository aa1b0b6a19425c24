"""The kubernetes orchestrator's safety rules, against the fake API server whose
ReplicaSet controller removes pods in Kubernetes' order: the trap (a not-ready pod goes
before the drained one), the refusals that avoid it, conflicts, annotations that do not
land, and the report of which pod actually went."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from roost.controller.adapters.kubernetes import (
    REMOVAL_MARK,
    KubernetesOrchestrator,
    KubernetesSettings,
    ScaleConflict,
    UnsafeScaleDown,
)
from roost.controller.clock import FakeClock
from roost.controller.orchestrator import OrchestratorError, PoolRef, UnknownInstance
from tests.k8s_fake_api import (
    COST,
    FakeApiServer,
    FakeCluster,
    controller_grants,
    write_kubeconfig,
)

NS, DEP = "roost-workers", "roost-worker"
POOL = PoolRef("batch", f"{NS}/{DEP}")


@dataclass
class Rig:
    cluster: FakeCluster
    server: FakeApiServer
    orch: KubernetesOrchestrator
    clock: FakeClock

    def names(self) -> list[str]:
        return self.cluster.names(NS, DEP)

    def patches(self, what: str) -> int:
        return sum(1 for m, p, _ in self.cluster.requests if m == "PATCH" and p.endswith(what))


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    cluster = FakeCluster(token="s3cret", grants=controller_grants())
    cluster.add_node("node-a", cpu="8", memory="32Gi")
    cluster.add_node("node-b", cpu="8", memory="32Gi")
    cluster.add_deployment(NS, DEP, replicas=3)
    server = await FakeApiServer(cluster).start()
    clock = FakeClock()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server.url, token="s3cret")
    orch = KubernetesOrchestrator.from_settings(
        KubernetesSettings(kubeconfig=str(kubeconfig), cluster_view_ttl=0,
                           removal_patience=60),
        now=clock.time)
    yield Rig(cluster, server, orch, clock)
    await orch.close()
    await server.stop()


async def test_the_trap_a_not_ready_pod_goes_before_the_drained_one(rig: Rig) -> None:
    """What the rules guard against, shown on the fake ReplicaSet controller directly (as
    an HPA or `kubectl scale` would shrink the Deployment)."""
    _a, drained, c = rig.names()
    await rig.orch.set_instance_termination_priority(POOL, drained, priority=-1000)
    rig.cluster.set_ready(NS, c, False)
    rig.cluster.scale(NS, DEP, 2)
    assert rig.cluster.deleted == [c]
    assert drained in rig.names()


async def test_with_a_not_ready_pod_the_adapter_refuses_to_scale_down(rig: Rig) -> None:
    a, drained, c = rig.names()
    await rig.orch.set_instance_termination_priority(POOL, drained, priority=-1000)
    rig.cluster.set_ready(NS, c, False)
    with pytest.raises(UnsafeScaleDown, match=f"pod {c} is not ready"):
        await rig.orch.scale_pool(POOL, 2, request_id="r1")
    assert rig.patches("/scale") == 0
    assert rig.names() == [a, drained, c]
    # Once the pod is ready again, the drained one is the one that goes.
    rig.cluster.set_ready(NS, c, True)
    await rig.orch.scale_pool(POOL, 2, request_id="r1")
    assert rig.cluster.deleted == [drained]
    await rig.orch.pool_state(POOL)
    (check,) = rig.orch.removal_checks("batch")
    assert (check.outcome, check.expected, check.removed) == ("ok", (drained,), (drained,))


@pytest.mark.parametrize("shape", ["unscheduled", "pending", "terminating-extra"])
async def test_unscheduled_pending_or_unsettled_pools_are_not_shrunk(rig: Rig, shape: str
                                                                     ) -> None:
    _a, drained, c = rig.names()
    await rig.orch.set_instance_termination_priority(POOL, drained, priority=-1000)
    if shape == "unscheduled":
        rig.cluster.unschedule(NS, c)
        why = f"pod {c} is not scheduled"
    elif shape == "pending":
        rig.cluster.set_phase(NS, c, "Pending")
        why = f"pod {c} is phase Pending"
    else:  # a pod the ReplicaSet has not replaced yet: 2 active pods for 3 replicas
        rig.cluster.graceful = True
        rig.cluster.pod(NS, c)["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
        why = "2 active pods for 3 replicas"
    with pytest.raises(UnsafeScaleDown, match=why):
        await rig.orch.scale_pool(POOL, 2, request_id="r1")
    assert rig.patches("/scale") == 0


async def test_a_rollout_in_progress_blocks_scale_down(rig: Rig) -> None:
    rig.cluster.rollout(NS, DEP, "7a6b5c4d3")
    rig.cluster.scale(NS, DEP, 4)  # the new pod has the new template hash
    with pytest.raises(UnsafeScaleDown, match="rollout is in progress"):
        await rig.orch.scale_pool(POOL, 3, request_id="r1")


async def test_a_batch_of_marked_pods_goes_in_one_scale_down(rig: Rig) -> None:
    rig.cluster.scale(NS, DEP, 5)
    a, b, c, d, e = rig.names()
    for pod in (b, d):
        await rig.orch.set_instance_termination_priority(POOL, pod, priority=-1000)
    await rig.orch.scale_pool(POOL, 3, request_id="r1")
    assert sorted(rig.cluster.deleted) == [b, d]
    assert rig.names() == [a, c, e]
    await rig.orch.pool_state(POOL)
    (check,) = rig.orch.removal_checks("batch")
    assert (check.outcome, check.expected, check.removed) == ("ok", (b, d), (b, d))


async def test_removing_other_than_the_marked_count_is_refused(rig: Rig) -> None:
    with pytest.raises(UnsafeScaleDown, match="with no marked pod"):
        await rig.orch.scale_pool(POOL, 1, request_id="r1")
    a, b, _c = rig.names()
    for pod in (a, b):
        await rig.orch.set_instance_termination_priority(POOL, pod, priority=-1000)
    with pytest.raises(UnsafeScaleDown, match="with 2 marked pods"):
        await rig.orch.scale_pool(POOL, 2, request_id="r1")
    assert rig.patches("/scale") == 0


async def test_a_batch_waits_for_every_other_pod_to_serve(rig: Rig) -> None:
    rig.cluster.scale(NS, DEP, 4)
    a, b, c, _d = rig.names()
    for pod in (a, b):
        await rig.orch.set_instance_termination_priority(POOL, pod, priority=-1000)
    rig.cluster.set_ready(NS, c, False)
    with pytest.raises(UnsafeScaleDown, match=f"not removing 2 .*pod {c} is not ready"):
        await rig.orch.scale_pool(POOL, 2, request_id="r1")
    assert rig.patches("/scale") == 0


async def test_tied_deletion_costs_are_refused(rig: Rig) -> None:
    a, drained, _c = rig.names()
    rig.cluster.pod(NS, a)["metadata"]["annotations"][COST] = "-1000"  # someone else's
    await rig.orch.set_instance_termination_priority(POOL, drained, priority=-1000)
    with pytest.raises(UnsafeScaleDown, match=f"{a} cost no more than {drained}"):
        await rig.orch.scale_pool(POOL, 2, request_id="r1")


async def test_a_conflict_is_reported_for_the_next_tick_not_retried(rig: Rig) -> None:
    rig.cluster.before_scale_patch.append(lambda: rig.cluster.touch(NS, DEP))
    with pytest.raises(ScaleConflict, match="409"):
        await rig.orch.scale_pool(POOL, 4, request_id="r1")
    assert rig.patches("/scale") == 1
    assert len(rig.names()) == 3
    assert ScaleConflict.temporary
    # The next tick reads the new resourceVersion and succeeds.
    await rig.orch.scale_pool(POOL, 4, request_id="r1")
    assert len(rig.names()) == 4


async def test_an_annotation_a_webhook_drops_is_an_error(rig: Rig) -> None:
    rig.cluster.strip_annotations = {COST}
    with pytest.raises(OrchestratorError, match="webhook"):
        await rig.orch.set_instance_termination_priority(POOL, rig.names()[1], priority=-1000)


async def test_an_annotation_removed_after_it_landed_blocks_scale_down(rig: Rig) -> None:
    drained = rig.names()[1]
    await rig.orch.set_instance_termination_priority(POOL, drained, priority=-1000)
    del rig.cluster.pod(NS, drained)["metadata"]["annotations"][COST]
    with pytest.raises(UnsafeScaleDown, match="has not landed"):
        await rig.orch.scale_pool(POOL, 2, request_id="r1")


async def test_a_pod_that_went_instead_of_the_drained_one_is_reported(rig: Rig) -> None:
    """The ReplicaSet acts after the adapter's check: a pod turning not-ready in between
    is removed instead. The adapter cannot prevent that race; it reports it."""
    rig.cluster.auto_reconcile = False
    a, drained, c = rig.names()
    await rig.orch.set_instance_termination_priority(POOL, drained, priority=-1000)
    await rig.orch.scale_pool(POOL, 2, request_id="r1")
    assert rig.orch.removal_checks()[0].outcome == "pending"
    rig.cluster.set_ready(NS, a, False)
    rig.cluster.reconcile()
    rig.clock.advance(10)
    state = await rig.orch.pool_state(POOL)
    assert {i.ref for i in state.instances} == {drained, c}
    (check,) = rig.orch.removal_checks("batch")
    assert check.outcome == "mismatch"
    assert check.detail == f"removed {a} instead of drained {drained}"
    report = json.loads(json.dumps(rig.orch.report()))["pools"]["batch"]  # JSON as is
    assert report["mismatches"] == 1
    assert any("instead of drained" in n for n in report["notes"])


async def test_a_removal_nobody_carries_out_is_reported_stuck(rig: Rig) -> None:
    rig.cluster.auto_reconcile = False
    await rig.orch.set_instance_termination_priority(POOL, rig.names()[0], priority=-1000)
    await rig.orch.scale_pool(POOL, 2, request_id="r1")
    rig.clock.advance(61)
    await rig.orch.pool_state(POOL)
    assert rig.orch.removal_checks()[0].outcome == "stuck"
    rig.cluster.reconcile()
    await rig.orch.pool_state(POOL)
    assert rig.orch.removal_checks()[0].outcome == "ok"


async def test_terminating_pods_are_not_instances_and_count_as_removed(rig: Rig) -> None:
    rig.cluster.graceful = True
    drained = rig.names()[2]
    await rig.orch.set_instance_termination_priority(POOL, drained, priority=-1000)
    await rig.orch.scale_pool(POOL, 2, request_id="r1")
    state = await rig.orch.pool_state(POOL)
    assert drained not in {i.ref for i in state.instances}
    assert state.settled
    assert rig.orch.removal_checks()[0].outcome == "ok"
    # Annotating a pod on its way out is a no-op, not an error (a re-asked removal).
    await rig.orch.set_instance_termination_priority(POOL, drained, priority=-1000)


async def test_priority_zero_clears_the_annotation(rig: Rig) -> None:
    pod = rig.names()[0]
    await rig.orch.set_instance_termination_priority(POOL, pod, priority=-1000)
    meta = rig.cluster.pod(NS, pod)["metadata"]
    assert meta["annotations"][COST] == "-1000" and REMOVAL_MARK in meta["annotations"]
    await rig.orch.abort_drain(POOL, pod)
    assert COST not in meta["annotations"] and REMOVAL_MARK not in meta["annotations"]
    # With the mark gone, the adapter names no drained pod any more.
    await rig.orch.scale_pool(POOL, 2, request_id="r1")
    assert rig.orch.removal_checks()[0].expected == ()


async def test_a_new_mark_clears_roosts_stale_one_but_not_other_costs(rig: Rig) -> None:
    """A mark outside the batch being prepared (left by an earlier leader) is stale;
    marks of the same batch stay, and so do costs roost did not write."""
    rig.cluster.scale(NS, DEP, 4)
    a, b, c, d = rig.names()
    rig.cluster.pod(NS, c)["metadata"]["annotations"][COST] = "500"  # the user's own
    rig.cluster.pod(NS, a)["metadata"]["annotations"].update(
        {COST: "-1000", REMOVAL_MARK: "2024-01-01T00:00:00+00:00"})  # an earlier leader's
    await rig.orch.set_instance_termination_priority(POOL, b, priority=-1000)
    await rig.orch.set_instance_termination_priority(POOL, d, priority=-1000)
    assert COST not in rig.cluster.pod(NS, a)["metadata"]["annotations"]
    assert rig.cluster.pod(NS, c)["metadata"]["annotations"][COST] == "500"
    state = await rig.orch.pool_state(POOL)
    assert {i.ref: i.termination_priority for i in state.instances} == {
        a: 0, b: -1000, c: 500, d: -1000}


async def test_a_new_leader_finds_the_drained_pod_by_roosts_mark(rig: Rig, tmp_path: Path
                                                                 ) -> None:
    drained = rig.names()[1]
    await rig.orch.set_instance_termination_priority(POOL, drained, priority=-1000)
    kubeconfig = write_kubeconfig(tmp_path / "k2", rig.server.url, token="s3cret")
    other = KubernetesOrchestrator.from_settings(
        KubernetesSettings(kubeconfig=str(kubeconfig), cluster_view_ttl=0), now=rig.clock.time)
    try:
        await other.scale_pool(POOL, 2, request_id="r1")
        assert other.removal_checks()[0].expected == (drained,)
        assert rig.cluster.deleted == [drained]
    finally:
        await other.close()


async def test_a_priority_outside_int32_or_an_unknown_pod_is_refused(rig: Rig) -> None:
    with pytest.raises(ValueError, match="int32"):
        await rig.orch.set_instance_termination_priority(POOL, rig.names()[0], priority=2**31)
    with pytest.raises(UnknownInstance):
        await rig.orch.set_instance_termination_priority(POOL, "roost-worker-nope",
                                                         priority=-1)
