"""The native orchestrator (pools as instances on roost's own nodes) against the shared
adapter contract, on a real cluster: nats-server, the SigV4 gateway and three sim-driver
nodes. The adapter reaches the gateway through a TCP proxy the test can cut."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import asyncpg
import httpx
import pytest

from roost.controller import enrollment
from roost.controller.adapters.native import (
    NativeOrchestrator,
    NativeSettings,
    load_settings,
    parse_ref,
    removal_order,
    user_data,
)
from roost.controller.config import ControllerConfig
from roost.controller.orchestrator import (
    PoolRef,
    PoolState,
    ScaleRejected,
    ScaleResult,
    UnknownPool,
)
from roost.controller.service import serve
from roost.embedded import PostgresServer
from roost.embedded.proc import free_port
from roost.store import pools as pools_q
from roost.store import tasks as tasks_q
from roost.store.migrations import migrate
from roost.store.roles import WORKER_ROLE, ensure_worker_role
from roost.up.cluster import ClusterSpec, new_credentials
from tests.conftest import fresh_postgres
from tests.e2e.conftest import ThreadedCluster, make_cluster
from tests.integration.test_controller_helpers import open_db, pool_spec
from tests.integration.worker_helpers import eventually, task_row
from tests.orchestrator_contract import ContractHarness, OrchestratorContract
from tests.pgproxy import PgProxy
from tests.polling import until

ROOT = Path(__file__).resolve().parents[2]
REF = "type=t3.small; target=tests.worker_tasks:slow; concurrency=2"


@pytest.fixture(scope="module")
def native_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedCluster]:
    c = make_cluster(tmp_path_factory.mktemp("native"), capacity="4vcpu,16GiB")
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[PostgresServer]:
    """A Postgres for this module's roost alone, asking every connection for a
    password, as `roost up`'s does."""
    with fresh_postgres(password=True) as server:
        yield server


def _settings(cluster: ThreadedCluster, endpoint: str) -> NativeSettings:
    return NativeSettings(endpoint=endpoint, region=cluster.spec.region,
                          access_key_id=cluster.key, secret_access_key=cluster.secret,
                          dsn="postgresql://postgres@127.0.0.1:1/unused",
                          controller_url="http://127.0.0.1:1", timeout=3.0)


async def _settle(orch: NativeOrchestrator, pool: PoolRef, timeout: float = 10.0) -> None:
    seen: dict[str, PoolState] = {}

    async def settled() -> bool:
        seen["state"] = await orch.pool_state(pool)
        return seen["state"].settled

    await until(f"pool {pool.pool_id} settled", settled, timeout, 0.05,
                detail=lambda: seen["state"])


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


async def test_the_same_decision_taken_again_later_launches_again(
        native: tuple[NativeOrchestrator, PgProxy]) -> None:
    """The controller's request id names a target ("p:2:e1"), so it comes back after
    the pool shrank; its old ClientToken must not swallow the new launch."""
    orch, _ = native
    pool = PoolRef(f"p-{uuid.uuid4().hex[:8]}", REF)
    try:
        await orch.scale_pool(pool, 1, request_id="to-1")
        await _settle(orch, pool)
        for _ in range(2):
            assert await orch.scale_pool(pool, 2, request_id="to-2") == ScaleResult(1, 2)
            await _settle(orch, pool)
            assert len((await orch.pool_state(pool)).instances) == 2
            await orch.scale_pool(pool, 1, request_id="back-to-1")  # the newest goes
            await _settle(orch, pool)
    finally:
        await orch.scale_pool(pool, 0, request_id="end")


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
                "type=t3.small;target=a:b;concurrency=0",
                "type=t3.small;target=a:b;concurrency=2147483648", "type=t3.small;target=a:b;x=1"):
        with pytest.raises(ValueError):
            parse_ref(bad)


def test_user_data_runs_roost_worker_with_an_enrollment_token_not_the_dsn() -> None:
    settings = NativeSettings(endpoint="http://e", region="r", access_key_id="k",
                              secret_access_key="s", dsn="postgresql://x:pw@h:1/d",
                              controller_url="http://ctl:9180/", python="/opt/py 3/python")
    key = enrollment.derive_key("s")
    token = enrollment.issue(key, "pool-a", "abc123")
    script = user_data("pool-a", parse_ref("type=t3.small;target=m:f;concurrency=3"),
                       settings, token)
    assert "pw" not in script and "DSN" not in script
    assert f"export ROOST_WORKER_ENROLL_TOKEN={token}\n" in script
    assert "export ROOST_WORKER_ENROLL_URL=http://ctl:9180\n" in script
    assert enrollment.verify(key, token) == enrollment.Enrollment("pool-a", "abc123")
    for forged in (token[:-1] + ("0" if token[-1] != "0" else "1"),  # another MAC
                   token.replace("pool-a", "pool-b"),  # another pool, same MAC
                   enrollment.issue(enrollment.derive_key("other"), "pool-a", "abc123"),
                   "ret1.pool-a.abc123", ""):
        assert enrollment.verify(key, forged) is None, forged
    assert script.endswith(
        "exec '/opt/py 3/python' -m roost worker --pool pool-a m:f --concurrency 3\n")


def test_removal_order_is_not_ready_then_lowest_priority_then_newest() -> None:
    from roost.controller.adapters.native import _Instance

    a = _Instance("i-a", "running", "2026-01-01T00:00:01", 0)
    b = _Instance("i-b", "running", "2026-01-01T00:00:02", -1000)
    c = _Instance("i-c", "running", "2026-01-01T00:00:03", 0)
    d = _Instance("i-d", "pending", "2026-01-01T00:00:00", 5)
    assert [i.instance_id for i in removal_order([a, b, c, d])] == ["i-d", "i-b", "i-c", "i-a"]


async def test_a_replica_enrolls_and_is_a_real_worker_named_by_its_instance(
        tmp_path: Path, own_postgres: PostgresServer) -> None:
    """With the process driver, the user data runs `roost worker`. Its user data holds
    no credential: the worker exchanges its enrollment token with a running controller
    for the least-privilege role's DSN, once. It registers with its instance id as
    orchestrator ref, runs a task, and removing the replica drains it."""
    key, secret = new_credentials()
    spec = ClusterSpec(data_dir=tmp_path / "cluster", nodes=1, driver="process",
                       node_capacity="4vcpu,16GiB", heartbeat_seconds=0.5, port=0,
                       credentials={key: secret}, controller=False)
    cluster = ThreadedCluster(spec).start()
    admin = await asyncpg.connect(own_postgres.dsn)
    try:
        await migrate(admin)
        await ensure_worker_role(admin, "worker-s3cret")
    finally:
        await admin.close()
    db = await open_db(own_postgres.dsn)
    pool = PoolRef("real", f"type=t3.small; target=tests.worker_tasks:slow; app_dir={ROOT}")
    port = free_port()
    settings = replace(_settings(cluster, cluster.endpoint),
                       dsn=own_postgres.dsn_for(WORKER_ROLE, "worker-s3cret"),
                       controller_url=f"http://127.0.0.1:{port}")
    orch = NativeOrchestrator(settings, now=time.time)
    stop, started = asyncio.Event(), asyncio.Event()
    controller = asyncio.create_task(serve(
        ControllerConfig(dsn=own_postgres.dsn, http_port=port, shadow=True,
                         holder="enroll-test").validate(),
        orchestrators={"native": orch}, stop=stop, started=started))
    try:
        await asyncio.wait_for(started.wait(), 20)
        cluster.wait_nodes(1)
        await pools_q.create_pool(db, pool_spec("real", orchestrator="native",
                                                orchestrator_ref=pool.ref))
        await orch.scale_pool(pool, 1, request_id="real-1")
        await _settle(orch, pool)
        (instance,) = (await orch.pool_state(pool)).instances
        ud = base64.b64decode(cluster.client().describe_instance_attribute(
            InstanceId=instance.ref, Attribute="userData")["UserData"]["Value"]).decode()
        token = re.search(r"ROOST_WORKER_ENROLL_TOKEN=(\S+)", ud)
        assert token and "s3cret" not in ud and str(own_postgres.superuser_password()) not in ud

        async def registered() -> bool:
            return bool(await db.fetchval(
                "SELECT count(*) FROM workers WHERE instance_ref = $1 AND status = 'active'",
                instance.ref))
        await eventually(registered, timeout=20, what="the worker to register")
        # The adapter's own checks: its pool's fresh instance only.
        assert await orch.enroll(token.group(1), instance.ref) == "real"
        key = enrollment.derive_key(settings.secret_access_key)
        nonce = token.group(1).split(".")[2]
        assert await orch.enroll(enrollment.issue(key, "other", nonce), instance.ref) is None
        late = NativeOrchestrator(replace(settings, enroll_ttl=0.0), now=time.time)
        try:
            assert await late.enroll(token.group(1), instance.ref) is None  # too old
        finally:
            await late.close()
        async with httpx.AsyncClient(base_url=settings.controller_url) as http:
            for body in ({"token": token.group(1), "instanceId": instance.ref},  # replayed
                         {"token": token.group(1)[:-4] + "0000", "instanceId": "i-0"}):
                r = await http.post("/api/v1/worker-credentials", json=body)
                assert (r.status_code, "dsn" in r.text) == (403, False), r.text

        task = await tasks_q.submit(db, "real", {"seconds": 0, "log": str(tmp_path / "log")})
        async def done() -> bool:
            return (await task_row(db, task.task_id))["status"] == "done"
        await eventually(done, timeout=20, what="the task to succeed")

        await orch.scale_pool(pool, 0, request_id="real-0")
        async def left() -> bool:
            return not await db.fetchval(
                "SELECT count(*) FROM workers WHERE instance_ref = $1 AND status = 'active'",
                instance.ref)
        await eventually(left, timeout=20, what="the worker to leave on SIGTERM")
    finally:
        stop.set()
        await asyncio.wait_for(controller, 20)  # closes the adapter
        await db.close()
        cluster.stop()


def test_settings_load_from_toml_with_keys_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "native.toml"
    path.write_text('endpoint = "http://gw:8773"\nregion = "roost-1"\ntimeout = 4\n')
    got = load_settings(path, dsn="postgresql://c@h/d", controller_url="http://ctl:9180",
                        environ={"AWS_ACCESS_KEY_ID": "AKIAX", "AWS_SECRET_ACCESS_KEY": "s"})
    assert (got.endpoint, got.region, got.access_key_id, got.secret_access_key, got.dsn,
            got.controller_url, got.timeout) == (
        "http://gw:8773", "roost-1", "AKIAX", "s", "postgresql://c@h/d", "http://ctl:9180", 4)
    path.write_text('endpoint = "http://gw:8773"\n')
    with pytest.raises(ValueError, match=r"native\.toml"):
        load_settings(path, dsn="x", environ={})
    with pytest.raises(ValueError, match="cannot read"):
        load_settings(tmp_path / "missing.toml", dsn="x", environ={})


async def test_workers_on_a_lost_node_are_replaced_not_double_counted(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """A node that goes silent takes its workers with it: they stop being replicas, so
    the plan launches replacements, and their termination waits for the node, so a
    returning node does not bring them back on top of the replacements."""
    cluster = make_cluster(tmp_path_factory.mktemp("lost"), capacity="4vcpu,16GiB")
    orch = NativeOrchestrator(_settings(cluster, cluster.endpoint), now=time.time)
    pool = PoolRef(f"p-{uuid.uuid4().hex[:8]}", REF)
    try:
        await orch.scale_pool(pool, 3, request_id="three")
        await _settle(orch, pool)
        homes = {i.ref: cluster.record(i.ref).node_id  # type: ignore[union-attr]
                 for i in (await orch.pool_state(pool)).instances}
        gone = next(iter(homes.values()))
        agent = next(a for a in cluster.cluster.nodes if a.node_id == gone)
        cluster.run(agent.stop())  # silent from now on; its (sim) instances live on
        lost = {ref for ref, node in homes.items() if node == gone}

        async def replaced() -> bool:
            return not await _replicas(orch, pool) & lost

        await eventually(replaced, timeout=10, what="the lost node's workers dropped")
        for ref in lost:  # terminated, deferred until the node is back
            rec = cluster.record(ref)
            assert rec is not None and rec.state == "shutting-down"
        assert await orch.scale_pool(pool, 3, request_id="three-again") == ScaleResult(
            3 - len(lost), 3)
        await _settle(orch, pool)
        refs = await _replicas(orch, pool)
        assert len(refs) == 3 and not refs & lost
        assert gone not in {cluster.record(r).node_id for r in refs}  # type: ignore[union-attr]
    finally:
        await orch.close()
        cluster.stop()


async def _replicas(orch: NativeOrchestrator, pool: PoolRef) -> set[str]:
    return {i.ref for i in (await orch.pool_state(pool)).instances}
