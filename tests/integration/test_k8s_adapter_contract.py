"""The kubernetes orchestrator against the shared adapter contract
(tests/orchestrator_contract.py), through lightkube over real HTTP to the fake API server
(tests/k8s_fake_api.py), authenticated by a kubeconfig token and limited to the RBAC in
deploy/kubernetes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from roost.controller.adapters.kubernetes import KubernetesOrchestrator, KubernetesSettings
from roost.controller.clock import FakeClock
from roost.controller.orchestrator import PoolRef
from tests.k8s_fake_api import (
    FakeApiServer,
    FakeCluster,
    controller_grants,
    write_kubeconfig,
)
from tests.orchestrator_contract import ContractHarness, OrchestratorContract

NS, DEP = "roost-workers", "roost-worker"


class TestKubernetesOrchestratorContract(OrchestratorContract):
    @pytest.fixture
    async def harness(self, tmp_path: Path) -> AsyncIterator[ContractHarness]:
        cluster = FakeCluster(token="s3cret", grants=controller_grants())
        cluster.add_node("node-a", cpu="4", memory="16Gi")
        cluster.add_node("node-b", cpu="4", memory="16Gi")
        cluster.add_pod("kube-system", "coredns-1", node="node-a")
        cluster.add_deployment(NS, DEP, replicas=3)
        server = await FakeApiServer(cluster).start()
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server.url, token="s3cret")
        orch = KubernetesOrchestrator.from_settings(
            KubernetesSettings(kubeconfig=str(kubeconfig), namespace=NS, cluster_view_ttl=0),
            now=FakeClock().time)
        yield ContractHarness(orch, PoolRef("p", f"{NS}/{DEP}"), actuates=True,
                              unavailable=server.partitioned)
        await orch.close()
        await server.stop()
