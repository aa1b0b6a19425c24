"""The dashboard in a real browser: Debian's headless Chromium driven by Playwright,
against a real cluster (NATS, the gateway, three sim nodes, one with four A10Gs,
Postgres and the controller with a pool under load) with instances launched through
boto3. It loads every page, follows a live update, drains a node from the UI and sees it
in `roost status`, and saves a PNG of each page under the test's output directory
(and, when ROOST_SCREENSHOTS names a directory, there too: docs/img is made that way).

A missing browser fails the suite with how to install it; it never skips.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from roost.controller.adapters import FakeOrchestrator
from roost.controller.clock import SystemClock
from roost.controller.config import ControllerConfig
from roost.controller.orchestrator import Orchestrator
from roost.decide.snapshot import NodeFigures, PoolSpec
from roost.domain.host import HostCapacity, parse_gpus
from roost.domain.resources import parse_quantity
from roost.embedded.proc import free_port
from roost.gateway.server import GatewayConfig
from roost.node.agent import NodeConfig
from roost.up.cluster import (
    ClusterSpec,
    ControllerComponent,
    DashboardComponent,
    GatewayComponent,
    NodesComponent,
    PostgresComponent,
    new_credentials,
)
from tests.e2e.conftest import IMAGE, ThreadedCluster

CHROMIUM = os.environ.get("ROOST_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
HOW = ("install it with `apt-get install -y chromium` (Debian's package; `make test` and "
       ".ci/run do this) and `pip install -e '.[dev]'` for Playwright")


def browser_or_fail() -> Any:
    """Playwright's sync API and the Chromium path, or a failure that says what to do."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(f"Playwright for Python is not installed: {HOW}", pytrace=False)
    if not (os.path.exists(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.fail(f"no Chromium at {CHROMIUM}: {HOW}", pytrace=False)
    return sync_playwright


class _Controller(ControllerComponent):
    """The controller with a ``fake`` pool "batch" on two roomy nodes."""

    def orchestrators(self, clock: SystemClock) -> dict[str, Orchestrator]:
        out = super().orchestrators(clock)
        fake = out["fake"]
        assert isinstance(fake, FakeOrchestrator)
        fake.add_pool("batch", nodes=[NodeFigures(f"w{i}", 16000, 65536, 2000, 4096)
                                      for i in range(2)])
        return out


class BoardCluster(ThreadedCluster):
    """The e2e cluster plus GPUs, Postgres, the controller and the dashboard."""

    def __init__(self, tmp: Path) -> None:
        key, secret = new_credentials()
        spec = ClusterSpec(data_dir=tmp, nodes=3, driver="sim", heartbeat_seconds=0.5,
                           port=0, credentials={key: secret})
        super().__init__(spec)
        nats = self.nats
        zero = parse_quantity("0vcpu,0MiB")
        hosts = {"cpu-1": HostCapacity(parse_quantity("8vcpu,32GiB"), reserve=zero),
                 "cpu-2": HostCapacity(parse_quantity("8vcpu,32GiB"), reserve=zero),
                 "gpu-1": HostCapacity(parse_quantity("12vcpu,128GiB"),
                                       gpus=parse_gpus("4xA10G"), reserve=zero)}
        nodes = NodesComponent([
            NodeConfig(node_id=nid, nats_urls=[nats.url], data_dir=tmp / nid, host=host,
                       driver="sim", heartbeat_seconds=0.5, stop_grace_seconds=2.0)
            for nid, host in hosts.items()])
        gateway = GatewayComponent(GatewayConfig(nats_urls=[nats.url], port=0,
                                                 credentials=spec.credentials,
                                                 launch_timeout=5.0))
        self.postgres = PostgresComponent(tmp / "postgres", port=free_port())
        config = ControllerConfig(dsn=self.postgres.dsn, http_port=free_port())
        config = msgspec.structs.replace(config, interval=1.0, scale_up_window=1.0,
                                         scale_down_window=5.0).validate()
        self.controller = _Controller(config, postgres=self.postgres,
                                              gateway=gateway, region=spec.region,
                                              credentials=spec.credentials)
        self.board = DashboardComponent(nats=nats, gateway=gateway, host="127.0.0.1", port=0,
                                        controller_url=self.controller.url,
                                        credentials=spec.credentials, interval=0.5)
        self.cluster.components = [self.postgres, nats, gateway, nodes, self.controller,
                                   self.board]

    def pool_under_load(self) -> None:
        """A ``fake``-orchestrator pool with 22 tasks queued that nobody runs: the
        controller plans 5 replicas (22 / 5 per replica, capped by max 5)."""
        import asyncpg

        from roost.store import pools as pools_q
        from roost.store import tasks as tasks_q
        from roost.store.migrations import migrate

        async def go() -> None:
            db = await asyncpg.create_pool(self.postgres.dsn, min_size=1, max_size=2)
            try:
                async with db.acquire() as conn:
                    await migrate(conn)
                await pools_q.create_pool(db, PoolSpec(
                    pool_id="batch", min_replicas=0, max_replicas=5, target_per_replica=5,
                    worker_cpu_milli=1000, worker_mem_mib=1024, worker_db_pool_size=2,
                    orchestrator="fake", orchestrator_ref="batch"))
                for i in range(22):
                    await tasks_q.submit(db, "batch", {"i": i}, idempotency_key=f"b-{i}")
            finally:
                await db.close()
        self.run(go())


@pytest.fixture(scope="module")
def board_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BoardCluster]:
    import tempfile
    # Postgres may run as another user: a directory outside pytest's 0700 basetemp.
    tmp = Path(tempfile.mkdtemp(prefix="roost-dash-"))
    c = BoardCluster(tmp).start()
    try:
        c.wait_nodes(3)
        yield c
    finally:
        c.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _shots_dirs(tmp_path: Path) -> list[Path]:
    out = [tmp_path / "screenshots"]
    extra = os.environ.get("ROOST_SCREENSHOTS")
    if extra:
        out.append(Path(extra))
    for d in out:
        d.mkdir(parents=True, exist_ok=True)
    return out


def _shot(page: Any, dirs: list[Path], name: str) -> None:
    first = dirs[0] / f"{name}.png"
    page.screenshot(path=str(first), full_page=True)
    for d in dirs[1:]:
        shutil.copyfile(first, d / f"{name}.png")


def _roost_status(c: BoardCluster) -> dict[str, Any]:
    env = {**os.environ, "AWS_ACCESS_KEY_ID": c.key, "AWS_SECRET_ACCESS_KEY": c.secret}
    out = subprocess.run([sys.executable, "-m", "roost", "status", "--endpoint", c.endpoint,
                          "--json"], env=env, capture_output=True, text=True, timeout=60,
                         check=True)
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


@pytest.mark.timeout(300)  # a cluster with Postgres, and a browser, on a busy 2-core machine
def test_dashboard_in_a_real_browser(board_cluster: BoardCluster, tmp_path: Path) -> None:
    sync_playwright = browser_or_fail()
    c = board_cluster
    ec2 = c.client()
    # The GPU launches first: they fit only on gpu-1 and take 10 of its 12 vCPU.
    ec2.run_instances(ImageId=IMAGE, InstanceType="g5.xlarge", MinCount=2, MaxCount=2)
    ec2.run_instances(ImageId=IMAGE, InstanceType="gs1.quarter", MinCount=1, MaxCount=1)
    launched = ec2.run_instances(ImageId=IMAGE, InstanceType="t3.micro", MinCount=3,
                                 MaxCount=3, TagSpecifications=[{
                                     "ResourceType": "instance",
                                     "Tags": [{"Key": "team", "Value": "web"}]}])
    ec2.terminate_instances(InstanceIds=[launched["Instances"][0]["InstanceId"]])
    c.pool_under_load()
    base = c.board.url
    dirs = _shots_dirs(tmp_path)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            context = browser.new_context(
                viewport={"width": 1280, "height": 900},
                http_credentials={"username": c.key, "password": c.secret})
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))

            # Overview: the numbers the cluster has (6 launched, 1 of them terminated;
            # 2 g5.xlarge and a gs1.quarter hold 2.25 of 4 GPUs) once the view settles.
            page.goto(base + "/")
            page.wait_for_function(
                "document.getElementById('instances-total').textContent.trim() === '6'")
            page.wait_for_function(
                "document.getElementById('gpu-reserved').textContent.trim() === '2.25 GPU'")
            assert page.locator("#nodes-live").inner_text() == "3"
            assert page.locator("#conn").inner_text() == "live"
            page.wait_for_function("Number(document.body.dataset.charted || 0) >= 2")
            assert page.locator("[data-chart=capacity] canvas").count() == 1

            # A live update, without reloading: two more launches show up.
            seq = int(page.evaluate("document.body.dataset.seq"))
            ec2.run_instances(ImageId=IMAGE, InstanceType="t3.small", MinCount=2, MaxCount=2)
            page.wait_for_function(
                "document.getElementById('instances-total').textContent.trim() === '8'")
            assert int(page.evaluate("document.body.dataset.seq")) > seq
            _shot(page, dirs, "overview")

            # Keyboard: the first Tab reaches the skip link, Enter moves to the content.
            page.keyboard.press("Tab")
            assert page.evaluate("document.activeElement.className") == "skip"
            page.keyboard.press("Enter")
            assert page.evaluate("document.activeElement.id") == "main"

            page.goto(base + "/nodes")
            gpu = page.locator("#node-gpu-1 .gpu")
            assert gpu.count() == 4
            _shot(page, dirs, "nodes")

            # Drain cpu-2 from the UI: a confirmation, then the row turns draining, and
            # `roost status` says so too.
            dialogs: list[str] = []

            def accept(dialog: Any) -> None:
                dialogs.append(dialog.message)
                dialog.accept()
            page.on("dialog", accept)
            page.locator("#node-cpu-2 button.drain").click()
            page.wait_for_selector("#notice .ok")
            assert "Node cpu-2 is draining" in page.locator("#notice").inner_text()
            assert dialogs and dialogs[0].startswith("Drain node cpu-2?")
            page.wait_for_selector("#node-cpu-2[data-status=draining]")
            deadline = time.monotonic() + 10
            while True:
                nodes = {n["node_id"]: n for n in _roost_status(c)["nodes"]}
                if nodes["cpu-2"]["draining"] or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert nodes["cpu-2"]["draining"] is True and not nodes["cpu-1"]["draining"]
            page.goto(base + "/")
            page.wait_for_function(
                "document.getElementById('nodes-draining').textContent.trim() === '1'")

            page.goto(base + "/instances?tag=team%3Dweb&state=running")  # one was terminated
            assert "2 instances match" in page.locator("#instances-count").inner_text()
            page.goto(base + "/instances")
            _shot(page, dirs, "instances")
            first = page.locator("table.instances tbody th a").first
            iid = first.inner_text()
            first.click()
            page.wait_for_url(f"**/instances/{iid}")
            assert f"--instance-ids {iid}" in page.content()
            page.get_by_role("button", name="Show the console's tail").click()
            page.wait_for_selector("#console p.muted")  # the sim driver keeps none
            _shot(page, dirs, "instance")

            page.goto(base + "/placement")
            assert page.locator("#fit-t3-micro .num").inner_text() != "0"
            page.wait_for_function("Number(document.body.dataset.charted || 0) >= 1")
            _shot(page, dirs, "placement")

            page.goto(base + "/pools")
            page.wait_for_selector("#pool-batch .desired")
            page.wait_for_function(
                "document.querySelector('#pool-batch .desired').textContent.trim() === '5'",
                timeout=30_000)
            page.wait_for_selector("#pool-chart-batch canvas")
            assert "queued + running 22" in " ".join(
                page.locator("#pool-batch").inner_text().split())
            _shot(page, dirs, "pools")

            page.goto(base + "/events")
            assert "cpu-2: live \u2192 draining" in page.locator("table.events").inner_text()
            _shot(page, dirs, "events")

            # A phone's width: nothing wider than the screen but the tables' own scroll.
            phone = browser.new_context(viewport={"width": 390, "height": 844},
                                        http_credentials={"username": c.key,
                                                          "password": c.secret})
            small = phone.new_page()
            small.goto(base + "/")
            assert small.evaluate("document.documentElement.scrollWidth") <= 390
            _shot(small, dirs, "overview-phone")
            small.goto(base + "/nodes")
            assert small.evaluate("document.documentElement.scrollWidth") <= 390
            phone.close()
            assert errors == [], errors
        finally:
            browser.close()
    for name in ("overview", "nodes", "instances", "instance", "placement", "pools",
                 "events", "overview-phone"):
        assert (dirs[0] / f"{name}.png").stat().st_size > 5000, name


def test_a_missing_browser_fails_and_says_how_to_install_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", "/nonexistent/chromium")
    with pytest.raises(pytest.fail.Exception, match="apt-get install -y chromium"):
        browser_or_fail()
