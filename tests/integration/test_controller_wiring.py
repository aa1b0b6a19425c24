"""The controller's wiring of finished pieces: the kubernetes adapter from
``--kubernetes-config`` (with its report in /status), the removal mark undone when a
drain is abandoned, and a drain mark that no earlier heartbeat can satisfy whatever the
controller's clock says."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from roost.controller import cli
from roost.controller import config as cfg
from roost.controller.clock import SystemClock
from roost.controller.orchestrator import OrchestratorUnavailable, PoolRef
from roost.controller.service import build_orchestrators, serve
from roost.decide.drain import drained
from roost.embedded.proc import free_port
from roost.store import fenced, lease, runtime, workers
from roost.store import pools as pools_q
from tests.integration.test_controller_cli import invoke
from tests.integration.test_controller_helpers import (
    Rig,
    add_worker,
    open_db,
    pool_spec,
    status_when,
    worker_rows,
)
from tests.k8s_fake_api import FakeApiServer, FakeCluster, controller_grants, write_kubeconfig

NS, DEP = "roost-workers", "roost-worker"


@pytest.fixture
async def rig(pg_dsn: str) -> AsyncIterator[Rig]:
    r = Rig(pg_dsn, await open_db(pg_dsn))
    try:
        yield r
    finally:
        await r.close()


@pytest.fixture
async def api_server() -> AsyncIterator[FakeApiServer]:
    cluster = FakeCluster(token="s3cret", grants=controller_grants())
    cluster.add_node("node-a", cpu="16", memory="64Gi")
    cluster.add_deployment(NS, DEP, replicas=2, requests={"cpu": "500m", "memory": "512Mi"})
    server = await FakeApiServer(cluster).start()
    try:
        yield server
    finally:
        await server.stop()


def write_settings(tmp_path: Path, url: str) -> Path:
    """controller.toml -> k8s/kubernetes.toml -> k8s/kubeconfig, every path relative."""
    (tmp_path / "k8s").mkdir()
    write_kubeconfig(tmp_path / "k8s" / "kubeconfig", url, token="s3cret")
    (tmp_path / "k8s" / "kubernetes.toml").write_text(
        '[kubernetes]\nkubeconfig = "kubeconfig"\ncluster_view_ttl = 0\n')
    path = tmp_path / "controller.toml"
    path.write_text('[controller]\nkubernetes_config = "k8s/kubernetes.toml"\n')
    return path


async def test_kubernetes_config_is_a_flag_an_env_var_and_a_relative_file_key(
        tmp_path: Path) -> None:
    path = write_settings(tmp_path, "http://127.0.0.1:1")
    res = await invoke(cli.controller, "--config", str(path), "--print-config")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["kubernetes_config"] == str(tmp_path / "k8s/kubernetes.toml")
    res = await invoke(cli.controller, "--kubernetes-config", "/etc/k.toml", "--print-config",
                       env={"ROOST_CONTROLLER_KUBERNETES_CONFIG": "/env/k.toml"})
    assert json.loads(res.output)["kubernetes_config"] == "/etc/k.toml"
    res = await invoke(cli.controller, "--print-config",
                       env={"ROOST_CONTROLLER_KUBERNETES_CONFIG": "/env/k.toml"})
    assert json.loads(res.output)["kubernetes_config"] == "/env/k.toml"


async def test_a_kubernetes_config_that_does_not_load_is_a_setting_error(
        tmp_path: Path) -> None:
    bad = tmp_path / "kubernetes.toml"
    bad.write_text("[kubernetes]\ncontxt = 'typo'\n")
    config = cfg.build({"kubernetes_config": str(bad)})
    with pytest.raises(cfg.SettingError, match=r"kubernetes_config: .*contxt"):
        build_orchestrators(config, SystemClock())
    res = await invoke(cli.controller, "--kubernetes-config", str(bad),
                       "--dsn", "postgresql://postgres@127.0.0.1:1/none")
    assert res.exit_code == 2 and "contxt" in res.output


async def test_serve_drives_a_deployment_and_reports_it_in_status(
        pg_dsn: str, tmp_path: Path, api_server: FakeApiServer) -> None:
    config = cfg.build(cfg.load_file(write_settings(tmp_path, api_server.url)),
                       {"dsn": pg_dsn, "interval": 0.2, "http_port": free_port(),
                        "holder": "k8s-served"})
    built = build_orchestrators(config, SystemClock())
    assert list(built) == ["kubernetes"]
    await built["kubernetes"].close()
    stop, started = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve(config, stop=stop, started=started))
    db = None
    try:
        await asyncio.wait_for(started.wait(), 10)
        db = await open_db(pg_dsn)
        await pools_q.create_pool(db, pool_spec("batch", orchestrator="kubernetes",
                                                orchestrator_ref=f"{NS}/{DEP}", min_replicas=2,
                                                worker_cpu_milli=500, worker_mem_mib=512))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{config.http_port}") as http:
            # The adapter's report changes as a tick reads the pools; the plan only when
            # the tick has planned: a read between the two shows the pool in one only.
            doc = await status_when(
                http, "the pool shows in both the adapter's report and the plan",
                lambda d: "batch" in d["orchestrators"].get("kubernetes", {}).get("pools", {})
                and "batch" in (d["plan"] or {}).get("pools", {}))
        pools = doc["orchestrators"]["kubernetes"]["pools"]
        assert doc["leader"] and doc["orchestrators"]["kubernetes"]["adapter"] == "kubernetes"
        batch = pools["batch"]
        assert (batch["deployment"], batch["mismatches"], batch["removals"]) == (
            f"{NS}/{DEP}", 0, [])
        assert doc["plan"]["pools"]["batch"]["currentReplicas"] == 2
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        if db is not None:
            await db.close()


async def test_an_abandoned_drain_resets_its_instances_removal_mark(rig: Rig) -> None:
    rig.controller(scale_down_window=0, drain_timeout=30)
    await rig.add_pool(replicas=1)
    (only,) = rig.fake.instances("p")
    rig.running = {only: 1}  # a task that never ends
    await rig.tick()
    assert (await worker_rows(rig.db, "p"))[only]["status"] == "draining"
    # A mark that outlived its removal (another leader's, or a hand-made one).
    await rig.fake.set_instance_termination_priority(PoolRef("p", "p"), only, priority=-1000)
    for _ in range(3):
        assert (await rig.tick()).actions == []
    res = await rig.tick()
    assert [(r.kind, r.outcome, r.detail) for r in res.actions] == [
        ("reactivate", "ok", f"drain_timeout; priority of {only} reset to 0")]
    assert [i.priority for i in rig.fake.snapshot("p")] == [0]


async def test_a_reset_that_fails_does_not_fail_the_reactivation(rig: Rig) -> None:
    rig.controller(scale_down_window=0, drain_timeout=30)
    await rig.add_pool(replicas=1)
    (only,) = rig.fake.instances("p")
    rig.running = {only: 1}
    await rig.tick()
    await rig.fake.set_instance_termination_priority(PoolRef("p", "p"), only, priority=-1000)
    for _ in range(3):
        await rig.tick()
    rig.fake.fail("set_instance_termination_priority", OrchestratorUnavailable("down"))
    res = await rig.tick()
    assert [(r.kind, r.outcome) for r in res.actions] == [("reactivate", "ok")]
    assert "not reset: OrchestratorUnavailable" in res.actions[0].detail
    assert (await worker_rows(rig.db, "p"))[only]["status"] == "active"


async def test_a_heartbeat_from_before_the_mark_never_proves_a_worker_empty(
        rig: Rig) -> None:
    """The controller's clock an hour behind the database's: the mark still lands after
    the worker's last heartbeat, and only the next heartbeat counts."""
    await pools_q.create_pool(rig.db, pool_spec("p"))
    async with rig.db.acquire() as conn:
        epoch = await lease.bump_epoch(conn, "skewed")
    await workers.register(rig.db, "w", pool_id="p", revision="r1", instance_ref="i-w")
    await workers.heartbeat(rig.db, "w", held={}, running=0, lease=30)
    behind = time.time() - 3600
    assert await fenced.mark_draining(rig.db, epoch, "p", "w", now=behind)
    settings = rig.controller().settings
    (w,) = (await runtime.read_workers(rig.db))["p"]
    assert w.draining_since is not None and w.draining_since > w.heartbeat_at
    assert not drained(w, w.heartbeat_at, settings)
    await workers.heartbeat(rig.db, "w", held={}, running=0, lease=30)
    (w,) = (await runtime.read_workers(rig.db))["p"]
    assert drained(w, w.heartbeat_at, settings)


async def test_the_mark_keeps_the_controllers_time_when_that_is_later(rig: Rig) -> None:
    """Fake-clock tests and a controller clock ahead: ``now`` stands (the drain timeout
    is measured on the controller's clock)."""
    await pools_q.create_pool(rig.db, pool_spec("p"))
    async with rig.db.acquire() as conn:
        epoch = await lease.bump_epoch(conn, "ahead")
    now = time.time() + 3600
    await add_worker(rig.db, "p", "w", at=time.time())
    assert await fenced.mark_draining(rig.db, epoch, "p", "w", now=now)
    (w,) = (await runtime.read_workers(rig.db))["p"]
    assert w.draining_since == pytest.approx(now, abs=1e-5)
