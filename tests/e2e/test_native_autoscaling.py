"""The whole loop on one machine: tasks arrive, the controller scales a ``native`` pool,
the gateway places its workers (real `roost worker` processes) on the nodes, they run
every task once, and the pool drains back to zero."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from roost.controller.adapters import NativeOrchestrator, NativeSettings
from roost.controller.config import ControllerConfig
from roost.controller.orchestrator import PoolRef
from roost.controller.service import serve
from roost.embedded.proc import free_port
from roost.store import pools as pools_q
from roost.store import tasks as tasks_q
from roost.up.cluster import ClusterSpec, new_credentials
from tests.conftest import fresh_postgres
from tests.e2e.conftest import ThreadedCluster
from tests.integration.test_controller_helpers import open_db, pool_spec
from tests.integration.worker_helpers import eventually

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def own_postgres() -> Iterator[str]:
    """A Postgres for this module's roost alone."""
    with fresh_postgres() as server:
        yield server.dsn


async def test_a_native_pool_scales_up_runs_every_task_once_and_drains(
        tmp_path: Path, own_postgres: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Worker processes inherit the nodes' environment: short leases and heartbeats.
    for k, v in {"ROOST_WORKER_LEASE": "3", "ROOST_WORKER_HEARTBEAT": "0.3",
                 "ROOST_WORKER_POLL": "0.1"}.items():
        monkeypatch.setenv(k, v)
    key, secret = new_credentials()
    cluster = ThreadedCluster(ClusterSpec(
        data_dir=tmp_path / "cluster", nodes=3, driver="process", node_capacity="4vcpu,16GiB",
        heartbeat_seconds=0.5, port=0, credentials={key: secret}, controller=False)).start()
    dsn = own_postgres
    db = await open_db(dsn)
    port = free_port()  # the workers enroll there for their DSN
    orch = NativeOrchestrator(NativeSettings(
        endpoint=cluster.endpoint, region=cluster.spec.region, access_key_id=key,
        secret_access_key=secret, dsn=dsn, controller_url=f"http://127.0.0.1:{port}",
        timeout=5.0), now=time.time)
    ref = f"type=t3.small; target=tests.worker_tasks:slow; concurrency=2; app_dir={ROOT}"
    pool = PoolRef("auto", ref)
    config = ControllerConfig(dsn=dsn, interval=0.5, scale_up_window=1.0,
                              scale_down_window=2.0, http_port=port,
                              holder="e2e").validate()
    stop, started = asyncio.Event(), asyncio.Event()
    serving: asyncio.Task[None] | None = None
    try:
        cluster.wait_nodes(3)
        await pools_q.create_pool(db, pool_spec(
            "auto", min_replicas=0, max_replicas=6, target_per_replica=2,
            worker_cpu_milli=2000, worker_mem_mib=2048, orchestrator="native",
            orchestrator_ref=ref))
        serving = asyncio.create_task(serve(config, orchestrators={"native": orch},
                                            stop=stop, started=started))
        await asyncio.wait_for(started.wait(), 20)
        log = tmp_path / "tasks.log"
        # 150 worker-seconds at once: the demand model (arrival rate x service time, plus
        # the backlog to clear within its 5 s horizon) asks for several replicas, so the
        # pool spreads over nodes; tiny tasks would be served by one.
        ids = [(await tasks_q.submit(db, "auto", {"seconds": 0.5, "log": str(log)},
                                     idempotency_key=f"k{i}")).task_id for i in range(300)]

        peak, nodes_used, sized = 0, set(), []

        async def all_done() -> bool:
            nonlocal peak
            async with httpx.AsyncClient() as http:
                doc = (await http.get(f"http://127.0.0.1:{port}/status")).json()
            plan = (doc.get("plan") or {}).get("pools", {}).get("auto") or {}
            sized.extend(line for line in plan.get("sizing", ())  # none before a plan
                         if line.startswith("carried"))
            state = await orch.pool_state(pool)
            peak = max(peak, len(state.instances))
            for inst in state.instances:
                rec = cluster.record(inst.ref)
                if rec is not None:
                    nodes_used.add(rec.node_id)
            done = await db.fetchval(
                "SELECT count(*) FROM tasks WHERE pool_id = 'auto' AND status = 'done'")
            return bool(done == len(ids))
        await eventually(all_done, timeout=60, every=0.2, what="every task to finish")
        print(f"peak replicas {peak} on nodes {sorted(nodes_used)}")
        assert peak >= 3 and len(nodes_used) >= 2, (peak, nodes_used)
        # each worker registered its concurrency, and the plan sized with it
        rows = await db.fetch("SELECT DISTINCT slots FROM workers WHERE pool_id = 'auto'")
        assert [r["slots"] for r in rows] == [2]
        assert any("(2 slots each)" in line for line in sized), sized[-3:]

        starts = [line for line in log.read_text().splitlines() if line.startswith("start")]
        assert sorted(int(s.split()[1].split("=")[1]) for s in starts) == sorted(ids)

        async def drained() -> bool:
            return not (await orch.pool_state(pool)).instances
        await eventually(drained, timeout=60, every=0.2, what="the pool to drain to 0")
        killed = await db.fetchval(
            "SELECT count(*) FROM tasks WHERE pool_id = 'auto' AND attempts > 1")
        assert killed == 0
    finally:
        stop.set()
        if serving is not None:
            await asyncio.wait_for(serving, 30)
        else:
            await orch.close()
        await db.close()
        cluster.stop()


async def test_a_full_cluster_is_reported_and_retried_not_fatal(
        tmp_path: Path, own_postgres: str) -> None:
    """GPU workers on nodes without GPUs: CPU and memory say there is room, the gateway
    answers InsufficientInstanceCapacity. The controller records the refusal in /status,
    keeps leading and ticking, and tries again on later ticks."""
    key, secret = new_credentials()
    cluster = ThreadedCluster(ClusterSpec(
        data_dir=tmp_path / "cluster", nodes=2, driver="sim", node_capacity="8vcpu,32GiB",
        heartbeat_seconds=0.5, port=0, credentials={key: secret}, controller=False)).start()
    dsn = own_postgres
    db = await open_db(dsn)
    orch = NativeOrchestrator(NativeSettings(
        endpoint=cluster.endpoint, region=cluster.spec.region, access_key_id=key,
        secret_access_key=secret, dsn=dsn, controller_url="http://127.0.0.1:1",
        timeout=5.0), now=time.time)
    ref = "type=g5.xlarge; target=tests.worker_tasks:slow"
    port = free_port()
    config = ControllerConfig(dsn=dsn, interval=0.3, scale_up_window=0.0, http_port=port,
                              holder="e2e-full").validate()
    stop, started = asyncio.Event(), asyncio.Event()
    serving: asyncio.Task[None] | None = None
    try:
        cluster.wait_nodes(2)
        await pools_q.create_pool(db, pool_spec(
            "gpu", min_replicas=0, max_replicas=2, target_per_replica=1,
            worker_cpu_milli=4000, worker_mem_mib=16384, orchestrator="native",
            orchestrator_ref=ref))
        serving = asyncio.create_task(serve(config, orchestrators={"native": orch},
                                            stop=stop, started=started))
        await asyncio.wait_for(started.wait(), 20)
        await tasks_q.submit(db, "gpu", {"seconds": 0})
        doc: dict[str, Any] = {}

        async def refused_twice() -> bool:
            nonlocal doc
            async with httpx.AsyncClient() as http:
                doc = (await http.get(f"http://127.0.0.1:{port}/status")).json()
            refusals = [a for a in doc["scaleActions"] if a["outcome"] == "failed"
                        and "InsufficientInstanceCapacity" in a["detail"]]
            return len(refusals) >= 2
        await eventually(refused_twice, timeout=30, every=0.2, what="two refused scale-ups")
        assert doc["leader"] is True and not serving.done()
        assert not (await orch.pool_state(PoolRef("gpu", ref))).instances
    finally:
        stop.set()
        if serving is not None:
            await asyncio.wait_for(serving, 30)
        else:
            await orch.close()
        await db.close()
        cluster.stop()
