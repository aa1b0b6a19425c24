"""The RBAC in deploy/kubernetes is enough and no more: the fake API server answers the
adapter with only what those Roles grant the controller's ServiceAccount; a whole cycle
(read, mark, scale up, scale down) uses every rule, and taking any required rule away
breaks it (the metrics rule is optional: without it the adapter plans on requests)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from roost.controller.adapters.kubernetes import KubernetesOrchestrator, KubernetesSettings
from roost.controller.clock import FakeClock
from roost.controller.orchestrator import OrchestratorError, PoolRef
from tests.k8s_fake_api import (
    FakeApiServer,
    FakeCluster,
    Grant,
    controller_grants,
    write_kubeconfig,
)

NS, DEP = "roost-workers", "roost-worker"
POOL = PoolRef("batch", f"{NS}/{DEP}")
GRANTS = controller_grants()


async def cycle(orch: KubernetesOrchestrator, cluster: FakeCluster) -> str:
    """Everything the controller asks of the adapter; the metrics source it saw."""
    await orch.pool_state(POOL)
    await orch.scale_pool(POOL, 3, request_id="up")
    victim = cluster.names(NS, DEP)[1]
    await orch.set_instance_termination_priority(POOL, victim, priority=-1000)
    await orch.scale_pool(POOL, 2, request_id="down")
    assert victim not in cluster.names(NS, DEP)
    details = orch.details("batch")
    assert details is not None
    return details.usage


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[FakeCluster, KubernetesOrchestrator]]:
    cluster = FakeCluster(grants=list(GRANTS), metrics={"node-a": ("100m", "100Mi")})
    cluster.add_node("node-a")
    cluster.add_deployment(NS, DEP, replicas=2)
    server = await FakeApiServer(cluster).start()
    orch = KubernetesOrchestrator.from_settings(
        KubernetesSettings(kubeconfig=str(write_kubeconfig(tmp_path / "kc", server.url,
                                                           token=None)),
                           cluster_view_ttl=0),
        now=FakeClock().time)
    yield cluster, orch
    await orch.close()
    await server.stop()


def test_what_the_manifests_grant_the_service_account() -> None:
    assert sorted((g.namespace or "*", *sorted(g.groups), *sorted(g.resources),
                   *sorted(g.verbs)) for g in GRANTS) == [
        ("*", "", "nodes", "list"),
        ("*", "", "pods", "list"),
        ("*", "metrics.k8s.io", "nodes", "list"),
        (NS, "", "pods", "patch"),
        (NS, "apps", "deployments/scale", "get", "patch"),
    ]


async def test_a_whole_cycle_uses_every_rule(served: tuple[FakeCluster, KubernetesOrchestrator]
                                             ) -> None:
    cluster, orch = served
    assert await cycle(orch, cluster) == "metrics.k8s.io"
    assert cluster.used_grants == set(GRANTS)


@pytest.mark.parametrize("dropped", GRANTS, ids=lambda g: f"{sorted(g.groups)}"
                         f"{sorted(g.resources)}{sorted(g.verbs)}@{g.namespace or '*'}")
async def test_each_rule_is_needed(served: tuple[FakeCluster, KubernetesOrchestrator],
                                   dropped: Grant) -> None:
    cluster, orch = served
    cluster.grants = [g for g in GRANTS if g != dropped]
    if "metrics.k8s.io" in dropped.groups:
        assert await cycle(orch, cluster) == "metrics.k8s.io unavailable"
        return
    with pytest.raises(OrchestratorError, match="403"):
        await cycle(orch, cluster)
