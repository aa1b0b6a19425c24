"""What the kubernetes orchestrator reads: replicas, pods, node figures (allocatable, what
every pod on a node requests, usage from metrics.k8s.io when it answers, memory
pressure), which nodes count, revisions; and how failures reach the controller
(unknown pools, timeouts, authentication, RBAC, a partitioned API server)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from roost.controller.adapters.kubernetes import KubernetesOrchestrator, KubernetesSettings
from roost.controller.clock import FakeClock
from roost.controller.orchestrator import (
    NodeFigures,
    OrchestratorError,
    OrchestratorUnavailable,
    PoolRef,
    UnknownPool,
)
from tests.k8s_fake_api import FakeApiServer, FakeCluster, controller_grants, write_kubeconfig

NS, DEP = "roost-workers", "roost-worker"
POOL = PoolRef("batch", f"{NS}/{DEP}")
GIB = 1024
Connect = Callable[..., KubernetesOrchestrator]


@pytest.fixture
async def cluster() -> AsyncIterator[FakeCluster]:
    yield FakeCluster(token="s3cret", grants=controller_grants())


@pytest.fixture
async def server(cluster: FakeCluster) -> AsyncIterator[FakeApiServer]:
    srv = await FakeApiServer(cluster).start()
    yield srv
    await srv.stop()


@pytest.fixture
async def connect(server: FakeApiServer, tmp_path: Path) -> AsyncIterator[Connect]:
    made: list[KubernetesOrchestrator] = []

    def make(token: str = "s3cret", **settings: object) -> KubernetesOrchestrator:
        path = write_kubeconfig(tmp_path / f"kubeconfig-{len(made)}", server.url, token=token)
        opts: dict[str, object] = {"cluster_view_ttl": 0, **settings}
        orch = KubernetesOrchestrator.from_settings(
            KubernetesSettings(kubeconfig=str(path), **opts),  # type: ignore[arg-type]
            now=FakeClock().time)
        made.append(orch)
        return orch

    yield make
    for orch in made:
        await orch.close()


async def test_node_figures_count_every_pod_on_the_node(cluster: FakeCluster,
                                                        connect: Connect) -> None:
    cluster.add_node("node-a", cpu="8", memory="32Gi", memory_pressure=True)
    cluster.add_node("node-b", cpu="4", memory="16Gi")
    cluster.add_deployment(NS, DEP, replicas=2,
                           requests={"cpu": "500m", "memory": "1Gi"})
    placed = {p["spec"]["nodeName"] for p in cluster.pods_of(NS, DEP)}
    # Another tenant's pod counts; a finished one does not.
    cluster.add_pod("other", "db-0", node="node-b", requests={"cpu": "1500m", "memory": "4Gi"})
    cluster.add_pod("other", "job-1", node="node-b", phase="Succeeded",
                    requests={"cpu": "2", "memory": "8Gi"})
    state = await connect().pool_state(POOL)
    assert state.target_replicas == 2 and len(state.instances) == 2 and state.settled
    used = {n: cluster.requested_on(n) for n in ("node-a", "node-b")}
    assert placed <= {"node-a", "node-b"}
    assert sorted(state.nodes, key=lambda n: n.node_id) == [
        NodeFigures("node-a", 8000, 32 * GIB, used["node-a"][0], used["node-a"][1] // 2**20,
                    memory_pressure=True),
        NodeFigures("node-b", 4000, 16 * GIB, used["node-b"][0], used["node-b"][1] // 2**20),
    ]
    assert used["node-b"][0] >= 1500


async def test_usage_from_the_metrics_api_when_it_answers(cluster: FakeCluster,
                                                          connect: Connect) -> None:
    cluster.add_node("node-a", cpu="8", memory="32Gi")
    cluster.add_deployment(NS, DEP, replicas=1, requests={"cpu": "1", "memory": "1Gi"})
    orch = connect()
    state = await orch.pool_state(POOL)
    assert (state.nodes[0].used_cpu_milli, state.nodes[0].used_mem_mib) == (1000, 1024)
    details = orch.details("batch")
    assert details is not None and details.usage == "metrics.k8s.io unavailable"

    cluster.metrics = {"node-a": ("2500m", "3Gi")}  # more than requested: usage counts
    fresh = connect()
    state = await fresh.pool_state(POOL)
    assert (state.nodes[0].used_cpu_milli, state.nodes[0].used_mem_mib) == (2500, 3 * GIB)
    cluster.metrics = {"node-a": ("10m", "10Mi")}  # less than requested: requests count
    state = await fresh.pool_state(POOL)
    assert (state.nodes[0].used_cpu_milli, state.nodes[0].used_mem_mib) == (1000, 1024)
    off = connect(use_metrics=False)
    await off.pool_state(POOL)
    assert not any(p.startswith("/apis/metrics") for _, p, _ in cluster.requests[-3:])


async def test_which_nodes_count_as_the_pools_capacity(cluster: FakeCluster,
                                                       connect: Connect) -> None:
    cluster.add_node("gpu", labels={"pool": "gpu"})
    cluster.add_node("cpu-1", labels={"pool": "cpu"})
    cluster.add_node("cpu-cordoned", labels={"pool": "cpu"}, unschedulable=True)
    cluster.add_node("cpu-down", labels={"pool": "cpu"}, ready=False)
    cluster.add_node("cpu-tainted", labels={"pool": "cpu"},
                     taints=[{"key": "dedicated", "value": "db", "effect": "NoSchedule"}])
    cluster.add_node("cpu-tolerated", labels={"pool": "cpu"},
                     taints=[{"key": "batch", "effect": "NoSchedule"}])
    cluster.add_deployment(NS, DEP, replicas=2, node_selector={"pool": "cpu"},
                           tolerations=[{"key": "batch", "operator": "Exists"}])
    state = await connect().pool_state(POOL)
    assert sorted(n.node_id for n in state.nodes) == ["cpu-1", "cpu-tolerated"]
    # A pool with no pod yet learns nothing from a template: the reference narrows it.
    cluster.add_deployment(NS, "empty", replicas=0)
    orch = connect()
    state = await orch.pool_state(PoolRef("e", f"{NS}/empty?nodeSelector=pool=gpu"))
    assert [n.node_id for n in state.nodes] == ["gpu"] and state.instances == ()


async def test_nodes_the_pool_runs_on_but_cannot_grow_on_are_explained(
        cluster: FakeCluster, connect: Connect) -> None:
    cluster.add_node("node-a")
    cluster.add_deployment(NS, DEP, replicas=1)
    cluster.nodes["node-a"]["spec"]["unschedulable"] = True  # cordoned after placement
    orch = connect()
    state = await orch.pool_state(POOL)
    assert state.nodes == ()
    details = orch.details("batch")
    assert details is not None and details.excluded_nodes == (("node-a", "cordoned"),)


async def test_revision_and_pod_size_are_reported(cluster: FakeCluster,
                                                  connect: Connect) -> None:
    cluster.add_node("node-a")
    cluster.add_deployment(NS, DEP, replicas=2, requests={"cpu": "750m", "memory": "768Mi"},
                           labels={"app.kubernetes.io/version": "v7"})
    cluster.add_deployment(NS, "plain", replicas=1, template_hash="abc123")
    orch = connect()
    await orch.pool_state(POOL)
    await orch.pool_state(PoolRef("plain", f"{NS}/plain"))
    d, plain = orch.details("batch"), orch.details("plain")
    assert d is not None and plain is not None
    assert (d.revisions, d.pod_cpu_milli, d.pod_mem_mib) == (("v7",), 750, 768)
    assert plain.revisions == ("abc123",)  # no release label: the template hash


async def test_replicas_changed_by_someone_else_are_noted(cluster: FakeCluster,
                                                          connect: Connect) -> None:
    cluster.add_node("node-a")
    cluster.add_deployment(NS, DEP, replicas=2)
    orch = connect()
    await orch.scale_pool(POOL, 3, request_id="r1")
    cluster.scale(NS, DEP, 5)  # an HPA still running next to roost
    await orch.pool_state(POOL)
    d = orch.details("batch")
    assert d is not None and any("changed outside roost" in n for n in d.notes)


async def test_unknown_pools(cluster: FakeCluster, connect: Connect) -> None:
    orch = connect(namespace=NS)
    for ref in ("no-such", f"{NS}/no-such", "Bad_Name", "a/b/c", f"{NS}/x?zone=a"):
        with pytest.raises(UnknownPool):
            await orch.pool_state(PoolRef("p", ref))


async def test_timeouts_partitions_and_server_errors_are_unavailable(
        cluster: FakeCluster, server: FakeApiServer, connect: Connect) -> None:
    cluster.add_node("node-a")
    cluster.add_deployment(NS, DEP, replicas=1)
    orch = connect(timeout=0.2)
    cluster.delay = 0.5
    with pytest.raises(OrchestratorUnavailable):
        await orch.pool_state(POOL)
    cluster.delay = 0
    async with server.partitioned():
        with pytest.raises(OrchestratorUnavailable):
            await orch.scale_pool(POOL, 2, request_id="r1")
    await orch.pool_state(POOL)


async def test_bad_credentials_and_missing_rbac_say_so(cluster: FakeCluster,
                                                       connect: Connect) -> None:
    cluster.add_node("node-a")
    cluster.add_deployment(NS, DEP, replicas=1)
    cluster.add_deployment("elsewhere", DEP, replicas=1)
    with pytest.raises(OrchestratorError, match="401") as info:
        await connect(token="wrong").pool_state(POOL)
    assert not isinstance(info.value, OrchestratorUnavailable)
    with pytest.raises(OrchestratorError, match=r"403.*check the controller's RBAC"):
        await connect().pool_state(PoolRef("p", f"elsewhere/{DEP}"))


async def test_the_cluster_view_is_shared_between_pools_for_its_ttl(
        cluster: FakeCluster, connect: Connect) -> None:
    cluster.add_node("node-a")
    cluster.add_deployment(NS, DEP, replicas=1)
    cluster.add_deployment(NS, "second", replicas=1)
    orch = connect(cluster_view_ttl=60)
    await orch.pool_state(POOL)
    await orch.pool_state(PoolRef("second", f"{NS}/second"))
    node_lists = [p for m, p, _ in cluster.requests if p == "/api/v1/nodes"]
    assert len(node_lists) == 1


async def test_long_lists_are_read_in_pages(cluster: FakeCluster, connect: Connect) -> None:
    for i in range(3):
        cluster.add_node(f"node-{i}")
    for i in range(1203):
        cluster.add_pod("crowd", f"p-{i}", node=f"node-{i % 3}",
                        requests={"cpu": "1m", "memory": "1Mi"})
    cluster.add_deployment(NS, DEP, replicas=1, requests={"cpu": "1m", "memory": "1Mi"})
    state = await connect().pool_state(POOL)
    assert sum(n.used_cpu_milli for n in state.nodes) == 1204
    pages = [q for m, p, q in cluster.requests if p == "/api/v1/pods"]
    assert len(pages) == 3 and "continue=" in pages[-1]
