"""The native orchestrator (pools as instances on roost's own nodes) against the shared
adapter contract, on a real cluster: nats-server, the SigV4 gateway and three sim-driver
nodes. The adapter reaches the gateway through a TCP proxy the test can cut."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from roost.controller.adapters.native import (
    NativeOrchestrator,
    NativeSettings,
    parse_ref,
    removal_order,
    user_data,
)
from roost.controller.orchestrator import (
    PoolRef,
    ScaleRejected,
    UnknownPool,
)
from tests.e2e.conftest import ThreadedCluster, make_cluster
from tests.orchestrator_contract import ContractHarness, OrchestratorContract
from tests.pgproxy import PgProxy

REF = "type=t3.small; target=tests.worker_tasks:slow; concurrency=2"


@pytest.fixture(scope="module")
def native_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedCluster]:
    c = make_cluster(tmp_path_factory.mktemp("native"), capacity="4vcpu,16GiB")
    try:
        yield c
    finally:
        c.stop()


def _settings(cluster: ThreadedCluster, endpoint: str) -> NativeSettings:
    return NativeSettings(endpoint=endpoint, region=cluster.spec.region,
                          access_key_id=cluster.key, secret_access_key=cluster.secret,
                          dsn="postgresql://postgres@127.0.0.1:1/unused", timeout=3.0)


async def _settle(orch: NativeOrchestrator, pool: PoolRef, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        state = await orch.pool_state(pool)
        if state.settled:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"pool {pool.pool_id} did not settle: {state}")
        await asyncio.sleep(0.05)


@pytest.fixture
async def native(native_cluster: ThreadedCluster) -> AsyncIterator[
        tuple[NativeOrchestrator, PgProxy]]:
    host, port = native_cluster.endpoint.removeprefix("http://").rsplit(":", 1)
    proxy = await PgProxy(int(port), host=host).start()
    orch = NativeOrchestrator(_settings(native_cluster, f"http://127.0.0.1:{proxy.port}"),
                              now=time.time)
    try:
        yield orch, proxy
    finally:
        await orch.close()
        await proxy.close()


class TestNativeOrchestratorContract(OrchestratorContract):
    @pytest.fixture
    async def harness(self, native: tuple[NativeOrchestrator, PgProxy]
                      ) -> AsyncIterator[ContractHarness]:
        orch, proxy = native
        pool = PoolRef(f"p-{uuid.uuid4().hex[:8]}", REF)
        await orch.scale_pool(pool, 3, request_id="harness-start")
        await _settle(orch, pool)

        @contextlib.asynccontextmanager
        async def unavailable() -> AsyncIterator[None]:
            proxy.go_dark()
            try:
                yield
            finally:
                proxy.refuse = False

        yield ContractHarness(orch, pool, actuates=True, settle=lambda: _settle(orch, pool),
                              unavailable=unavailable)
        await orch.scale_pool(pool, 0, request_id="harness-end")


async def test_instances_are_tagged_and_run_the_worker(
        native: tuple[NativeOrchestrator, PgProxy], native_cluster: ThreadedCluster) -> None:
    orch, _ = native
    pool = PoolRef(f"p-{uuid.uuid4().hex[:8]}", REF)
    try:
        await orch.scale_pool(pool, 2, request_id="r1")
        await orch.scale_pool(pool, 2, request_id="r1")  # a retried decision: no more
        await _settle(orch, pool)
        state = await orch.pool_state(pool)
        assert len(state.instances) == 2
        for inst in state.instances:
            rec = native_cluster.record(inst.ref)
            assert rec is not None and rec.instance_type == "t3.small"
            assert rec.tags["roost:pool"] == pool.pool_id
        # Node figures come from the gateway's capacity view and count the workers.
        assert {n.node_id for n in state.nodes} == {"n1", "n2", "n3"}
        assert sum(n.used_cpu_milli for n in state.nodes) >= 2 * 2000
    finally:
        await orch.scale_pool(pool, 0, request_id="r-end")


async def test_a_full_cluster_is_scale_rejected(
        native: tuple[NativeOrchestrator, PgProxy]) -> None:
    orch, _ = native
    big = PoolRef(f"p-{uuid.uuid4().hex[:8]}", "type=m7i.8xlarge; target=m:f")
    with pytest.raises(ScaleRejected, match="InsufficientInstanceCapacity"):
        await orch.scale_pool(big, 1, request_id="too-big")
    unknown = PoolRef("p-x", "type=zz9.huge; target=m:f")
    with pytest.raises(UnknownPool):
        await orch.scale_pool(unknown, 1, request_id="unknown-type")


def test_pool_refs_parse_or_say_why() -> None:
    spec = parse_ref(" type=t3.small ;target=a.b:c; app_dir=/srv/app; revision=r1 ")
    assert (spec.instance_type, spec.target, spec.app_dir, spec.revision) == (
        "t3.small", "a.b:c", "/srv/app", "r1")
    for bad in ("", "type=t3.small", "target=a:b", "type=t3.small;target=nocolon",
                "type=t3.small;target=a:b;concurrency=0", "type=t3.small;target=a:b;x=1"):
        with pytest.raises(ValueError):
            parse_ref(bad)


def test_user_data_runs_roost_worker_with_the_dsn(tmp_path: Path) -> None:
    settings = NativeSettings(endpoint="http://e", region="r", access_key_id="k",
                              secret_access_key="s", dsn="postgresql://x@h:1/d",
                              python="/opt/py 3/python")
    script = user_data("pool-a", parse_ref("type=t3.small;target=m:f;concurrency=3"),
                       settings)
    assert "export ROOST_WORKER_DSN=postgresql://x@h:1/d\n" in script
    assert script.endswith(
        "exec '/opt/py 3/python' -m roost worker --pool pool-a m:f --concurrency 3\n")


def test_removal_order_is_not_ready_then_lowest_priority_then_newest() -> None:
    from roost.controller.adapters.native import _Instance

    a = _Instance("i-a", "running", "2026-01-01T00:00:01", 0)
    b = _Instance("i-b", "running", "2026-01-01T00:00:02", -1000)
    c = _Instance("i-c", "running", "2026-01-01T00:00:03", 0)
    d = _Instance("i-d", "pending", "2026-01-01T00:00:00", 5)
    assert [i.instance_id for i in removal_order([a, b, c, d])] == ["i-d", "i-b", "i-c", "i-a"]
