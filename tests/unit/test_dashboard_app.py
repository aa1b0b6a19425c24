"""The dashboard without a browser: every page and fragment rendered by Starlette's
TestClient from a cluster state built by hand, with the numbers on the page asserted."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from roost.bus.schemas import CapacitySnapshot, InstanceRecord
from roost.dashboard import views
from roost.dashboard.access import BindRefused, check_bind
from roost.dashboard.app import PAGES, DashboardSettings, build_app
from roost.dashboard.history import History
from roost.dashboard.model import ClusterState, LaunchCounters, NodeState, quantile
from roost.dashboard.recorder import Recorder
from roost.dashboard.sources import StaticSource, console_text, counters_from_text

NOW = 1_780_000_000.0
KEY, SECRET = "AKIATESTTESTTESTTEST", "s3cret-s3cret"
TIMES, DASH = "\u00d7", "\u2013"  # as the pages print them


def snap(node_id: str, *, cpu: tuple[int, int], mem: tuple[int, int], gpu_free: list[int] = (),
         fit: dict[str, int] | None = None, draining: bool = False, **kw: Any
         ) -> CapacitySnapshot:
    return CapacitySnapshot(
        node_id=node_id, boot_id="b", seq=1, availability_zone="roost-1a", draining=draining,
        alloc_cpu_milli=cpu[0], free_cpu_milli=cpu[1], alloc_mem_mib=mem[0],
        free_mem_mib=mem[1], gpu_free=list(gpu_free), gpu_models=["A10G"] * len(gpu_free),
        fit=fit or {}, sent_at=NOW, **kw)


def rec(iid: str, state: str, *, node: str = "n1", itype: str = "t3.micro",
        tags: dict[str, str] | None = None, at: str = "2026-06-01T10:00:00Z", **kw: Any
        ) -> InstanceRecord:
    return InstanceRecord(instance_id=iid, node_id=node, instance_type=itype,
                          image_id="ami-1", state=state, launch_id=f"l-{iid}",
                          reservation_id="r-1", launch_time=at,
                          availability_zone="roost-1a", tags=tags or {}, **kw)


CONTROLLER = {
    "leader": True, "epoch": 7, "holder": "ctl-a", "shadow": False, "ready": True,
    "lastRunAt": "2026-06-01T10:00:00+00:00", "lastError": None,
    "queue": {"web": {"queued": 12, "running": 3}},
    "plan": {"source": "leader", "at": "2026-06-01T10:00:00+00:00",
             "pools": {"web": {"desiredReplicas": 4, "currentReplicas": 2, "rawDesired": 5,
                               "frozenReason": None, "reason": "15 tasks / 4 per replica",
                               "action": "scale_up", "cappedBy": ["max_replicas"],
                               "steps": ["launch 2 replicas"]}},
             "dbWorkerBudget": 40, "dbConnectionsUsed": 8},
    "scaleActions": [{"at": "2026-06-01T09:59:00+00:00", "pool": "web", "kind": "scale_up",
                      "outcome": "ok", "worker": None, "replicas": 2, "detail": ""}],
}


def known_state(**kw: Any) -> ClusterState:
    nodes = [
        # 6 of 8 vCPU and 24 of 32 GiB reserved.
        NodeState(snap("n1", cpu=(8000, 2000), mem=(32768, 8192), fit={"t3.micro": 1},
                       isolation="cgroup", isolation_note="cgroup v2, memory+cpu+pids"),
                  0.4, True),
        # Two A10Gs: one a quarter free, one whole. Only g5.xlarge (a whole GPU) still
        # fits, so the quarter is stranded.
        NodeState(snap("n2", cpu=(16000, 12000), mem=(65536, 49152), gpu_free=[250, 1000],
                       fit={"g5.xlarge": 1, "t3.micro": 6}), 1.0, True),
        NodeState(snap("n3", cpu=(4000, 4000), mem=(8192, 8192), draining=True), 0.5, True),
        NodeState(snap("n4", cpu=(4000, 4000), mem=(8192, 8192)), 30.0, False),
    ]
    instances = {r.instance_id: r for r in [
        rec("i-a", "running", tags={"team": "ml"}, at="2026-06-01T10:00:03Z"),
        rec("i-b", "running", node="n2", itype="g5.xlarge", gpus=[(0, 750)],
            at="2026-06-01T10:00:02Z"),
        rec("i-c", "pending", node="n2", at="2026-06-01T10:00:01Z"),
        rec("i-d", "terminated", state_transition_reason="User initiated",
            at="2026-06-01T09:00:00Z"),
    ]}
    return ClusterState(NOW, nodes, instances, kw.get("controller", CONTROLLER),
                        kw.get("controller_error", ""), kw.get("launches"))


@pytest.fixture
def board() -> Iterator[tuple[TestClient, StaticSource, History]]:
    source = StaticSource(known_state())
    history = History()
    recorder = Recorder(source, history)
    history.record(source.state())
    app = build_app(source, recorder, DashboardSettings(credentials={KEY: SECRET},
                                                        ec2_endpoint="http://gw:8773"))
    with TestClient(app) as client:
        yield client, source, history


def text(html: str) -> str:
    """The page as a reader sees it: tags gone, whitespace collapsed."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def by_id(html: str, ident: str) -> str:
    found = re.search(rf'id="{re.escape(ident)}"[^>]*>(.*?)</', html, re.S)
    assert found, f"no element #{ident}"
    return found.group(1).strip()


def test_every_page_and_fragment_renders(board: Any) -> None:
    client, _, _ = board
    for name, (path, label) in PAGES.items():
        page = client.get(path)
        assert page.status_code == 200, (path, page.text)
        assert f"<title>{label} · roost</title>" in page.text
        assert 'aria-current="page"' in page.text and "htmx-2.0.11.min.js" in page.text
        frag = client.get(f"/fragment/{name}")
        assert frag.status_code == 200 and "<html" not in frag.text
    assert client.get("/fragment/nope").status_code == 404


def test_overview_numbers(board: Any) -> None:
    html = board[0].get("/").text
    # Live nodes n1, n2, n3 (n4 is stale); n3 drains, so its idle part is not free.
    assert by_id(html, "cpu-reserved") == "10 vCPU"  # 6 + 4 + 0
    assert "10 vCPU of 28 vCPU (36 %)" in html
    assert by_id(html, "cpu-free") == "14 vCPU"
    assert by_id(html, "mem-reserved") == "40 GiB"  # 24 + 16 + 0
    assert by_id(html, "mem-free") == "56 GiB"
    assert by_id(html, "gpu-reserved") == "0.75 GPU"
    assert by_id(html, "gpu-free") == "1.25 GPU"
    assert by_id(html, "gpu-stranded") == "0.25 GPU"
    assert (by_id(html, "nodes-live"), by_id(html, "nodes-draining"),
            by_id(html, "nodes-stale")) == ("2", "1", "1")
    assert by_id(html, "instances-total") == "4"
    assert (by_id(html, "instances-running"), by_id(html, "instances-pending"),
            by_id(html, "instances-terminated")) == ("2", "1", "1")
    assert by_id(html, "controller-role") == "leader"
    assert by_id(html, "controller-epoch") == "7"
    assert by_id(html, "controller-shadow") == "off"
    assert "Last error: none" in text(html)


def test_overview_launch_rates_from_two_samples() -> None:
    history = History()
    buckets0 = ((0.01, 0.0), (0.1, 0.0), (float("inf"), 0.0))
    buckets1 = ((0.01, 50.0), (0.1, 99.0), (float("inf"), 100.0))
    history.record(known_state(launches=LaunchCounters(10, 1, 0, buckets0)))
    later = known_state(launches=LaunchCounters(110, 4, 0, buckets1))
    history.record(ClusterState(NOW + 30, later.nodes, later.instances, later.controller,
                                launches=later.launches))
    v = views.overview(history and later, history)
    assert v["launches_per_min"] == pytest.approx(200.0)  # 100 in 30 s
    assert v["errors_per_min"] == pytest.approx(6.0)
    assert v["p99"] == pytest.approx(0.1)  # the 99th of 100 is the last in (0.01, 0.1]


def test_quantile_interpolates_like_promql() -> None:
    assert quantile([(1.0, 50.0), (2.0, 100.0), (float("inf"), 100.0)], 0.5) == 1.0
    assert quantile([(1.0, 0.0), (2.0, 100.0), (float("inf"), 100.0)], 0.5) == 1.5
    assert quantile([(1.0, 0.0)], 0.99) is None


def test_launch_counters_from_a_metrics_scrape() -> None:
    scrape = "\n".join([
        'roost_launches_total{outcome="launched"} 7.0',
        'roost_launches_total{outcome="insufficient_capacity"} 2.0',
        'roost_launch_seconds_bucket{le="0.01"} 3.0',
        'roost_launch_seconds_bucket{le="+Inf"} 7.0',
        'roost_placement_attempts_total{policy="fgd",route="view",outcome="ok"} 7.0',
    ]) + "\n"
    c = counters_from_text(scrape)
    assert (c.launched, c.insufficient_capacity) == (7.0, 2.0)
    assert c.latency_buckets == ((0.01, 3.0), (float("inf"), 7.0))
    assert c.attempts == {("view", "ok"): 7.0}


def test_nodes_page_bars_gpu_strips_fits_and_isolation(board: Any) -> None:
    html = board[0].get("/nodes").text
    n1 = html[html.index('id="node-n1"'):html.index('id="node-n2"')]
    assert "6 vCPU of 8 vCPU" in n1 and "24 GiB of 32 GiB" in n1
    assert 'style="width: 75.0%"' in n1
    assert "cgroup" in n1 and "cgroup v2, memory+cpu+pids" in n1
    assert f"t3.micro {TIMES}1" in n1
    n2 = html[html.index('id="node-n2"'):html.index('id="node-n3"')]
    assert "GPU 0 A10G: 750 of 1000 milli used, 250 stranded" in n2
    assert "GPU 1 A10G: 0 of 1000 milli used" in n2 and "GPU 1 A10G: 0 of 1000 milli used," \
        not in n2
    assert f"t3.micro {TIMES}6" in n2 and f"g5.xlarge {TIMES}1" in n2
    n3 = html[html.index('id="node-n3"'):html.index('id="node-n4"')]
    assert 'data-status="draining"' in n3 and "hx-post" not in n3  # no drain twice
    assert 'hx-confirm="Drain node n1?' in n1
    assert "unreported" in html[html.index('id="node-n4"'):]
    only = board[0].get("/nodes?status=stale").text
    assert 'id="node-n4"' in only and 'id="node-n1"' not in only


def test_instances_filters_and_cli_command(board: Any) -> None:
    client = board[0]
    html = client.get("/instances").text
    assert f"4 instances match; showing 1{DASH}4, newest first" in text(html)
    assert html.index("i-a") < html.index("i-b") < html.index("i-c")  # newest first
    cases = {"state=running": {"i-a", "i-b"}, "type=g5.xlarge": {"i-b"},
             "node=n2": {"i-b", "i-c"}, "tag=team=ml": {"i-a"}, "tag=team": {"i-a"},
             "q=ML": {"i-a"}, "state=running&node=n2": {"i-b"}}
    for query, want in cases.items():
        page = client.get(f"/fragment/instances?{query}").text
        shown = set(re.findall(r'href="/instances/(i-[a-z])"', page))
        assert shown == want, query
    page = client.get("/instances?state=running&type=g5.xlarge&tag=team=ml").text
    assert ("aws ec2 describe-instances --endpoint-url http://gw:8773 --filters "
            "Name=instance-state-name,Values=running Name=instance-type,Values=g5.xlarge "
            "Name=tag:team,Values=ml") in page


def test_instances_paginate() -> None:
    state = known_state()
    many = {f"i-{n:05d}": rec(f"i-{n:05d}", "running", at=f"2026-06-01T10:{n // 60:02d}:"
                              f"{n % 60:02d}Z") for n in range(120)}
    v = views.instances(ClusterState(NOW, state.nodes, many), {"page": "3"}, endpoint="x")
    assert (v["page"].number, v["page"].pages, v["page"].first, v["page"].last) == (3, 3, 101,
                                                                                     120)
    assert len(v["rows"]) == 20 and v["rows"][0].instance_id == "i-00019"
    v = views.instances(ClusterState(NOW, state.nodes, many), {"page": "99"}, endpoint="x")
    assert v["page"].number == 3  # past the end: the last page
    source = StaticSource(ClusterState(NOW, state.nodes, many))
    app = build_app(source, Recorder(source, History()), DashboardSettings())
    with TestClient(app) as client:
        html = client.get("/instances?state=running&page=2").text
    assert "page 2 of 3" in html and 'href="/instances?state=running&amp;page=3"' in html


def test_instance_detail(board: Any) -> None:
    client, _, _ = board
    html = client.get("/instances/i-b").text
    assert "Instance i-b" in html and by_id(html, "instance-gpus") == "GPU 0: 750 milli"
    assert ("aws ec2 describe-instances --endpoint-url http://gw:8773 --instance-ids i-b"
            in html)
    assert "User initiated" in client.get("/instances/i-d").text
    assert client.get("/instances/i-zzz").status_code == 404


def test_placement_page(board: Any) -> None:
    html = board[0].get("/placement").text
    assert by_id(html, "stranded-share") == "12 %"  # 250 of 2000 milli
    row = html[html.index('id="fit-t3-micro"'):]
    assert re.search(r'class="num">7<', row[:400])  # 1 on n1 + 6 on n2; n3 drains
    assert 'id="fit-g5-xlarge"' in html


def test_pools_page(board: Any) -> None:
    html = board[0].get("/pools").text
    pool = text(html[html.index('id="pool-web"'):])
    assert "queued + running 15 (12 + 3)" in pool
    assert "desired 4" in pool and "current 2" in pool and "before caps 5" in pool
    assert "capped by max_replicas" in pool and "launch 2 replicas" in pool
    assert by_id(html, "db-budget") == "8 of 40"
    assert "leader ctl-a, epoch 7" in text(html)


def test_controller_unreachable_is_shown(board: Any) -> None:
    client, source, _ = board
    source.set(known_state(controller=None, controller_error="ConnectError: refused"))
    assert "Unreachable: ConnectError: refused" in text(client.get("/").text)
    assert "No pools." in client.get("/pools").text


def test_events_log_and_filters(board: Any) -> None:
    client, source, history = board
    before = known_state()
    instances = dict(before.instances)
    instances["i-c"] = rec("i-c", "running", node="n2", updated_at="x")
    instances["i-e"] = rec("i-e", "pending", node="n1")
    source.set(ClusterState(NOW + 5, before.nodes, instances, before.controller))
    history.record(source.state())
    page = text(client.get("/events").text)
    assert "i-c pending → running" in page and "i-e (t3.micro) pending on n1" in page
    assert "pool web: scale_up to 2 → ok" in page
    assert "controller ctl-a: leader, epoch 7" in page
    only = text(client.get("/events?kind=instance").text)
    assert "i-c pending → running" in only and "pool web" not in only
    assert "i-e" not in text(client.get("/events?q=i-c").text)
    assert "i-c pending → running" in text(client.get("/instances/i-c").text)


def test_history_json_for_charts(board: Any) -> None:
    doc = board[0].get("/api/history").json()
    assert doc["t"] == [NOW]
    assert doc["cpu"] == [pytest.approx(35.7)]
    assert doc["gpu"] == [37.5] and doc["stranded"] == [12.5]
    assert doc["pools"]["web"] == {"demand": [15], "desired": [4], "current": [2]}


def _basic(key: str, secret: str) -> dict[str, str]:
    token = base64.b64encode(f"{key}:{secret}".encode()).decode()
    return {"Authorization": f"Basic {token}", "HX-Request": "true"}


def test_drain_needs_credentials_and_the_dashboards_own_page(board: Any) -> None:
    client, source, _ = board
    r = client.post("/nodes/n1/drain", headers={"HX-Request": "true"})
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic")
    assert client.post("/nodes/n1/drain", headers=_basic(KEY, "wrong")).status_code == 401
    cross_site = _basic(KEY, SECRET)
    del cross_site["HX-Request"]
    assert client.post("/nodes/n1/drain", headers=cross_site).status_code == 403
    assert source.drained == []
    r = client.post("/nodes/n1/drain", headers=_basic(KEY, SECRET))
    assert r.status_code == 200 and "Node n1 is draining" in r.text
    assert source.drained == ["n1"]
    assert 'data-status="draining"' in client.get("/nodes").text.split('id="node-n1"')[1][:80]
    assert client.post("/nodes/nope/drain", headers=_basic(KEY, SECRET)).status_code == 502


def test_read_only_without_credentials() -> None:
    source = StaticSource(known_state())
    app = build_app(source, Recorder(source, History()), DashboardSettings())
    with TestClient(app) as client:
        assert "disabled" in client.get("/nodes").text.split('id="node-n1"')[1]
        r = client.post("/nodes/n1/drain", headers=_basic(KEY, SECRET))
    assert r.status_code == 403 and "read-only" in r.text and source.drained == []


def test_off_loopback_needs_credentials_for_every_page() -> None:
    with pytest.raises(BindRefused, match="without credentials"):
        check_bind("0.0.0.0", {})
    check_bind("127.0.0.1", {})
    check_bind("::1", {})
    check_bind("0.0.0.0", {KEY: SECRET})
    source = StaticSource(known_state())
    app = build_app(source, Recorder(source, History()),
                    DashboardSettings(host="0.0.0.0", credentials={KEY: SECRET}))
    with TestClient(app) as client:
        assert client.get("/").status_code == 401
        assert client.get("/", headers=_basic(KEY, SECRET)).status_code == 200
        assert client.get("/healthz").status_code == 200
        assert client.get("/static/dashboard.css").status_code == 200


def test_event_stream_sends_a_tick_per_sample() -> None:
    async def go() -> list[str]:
        source = StaticSource(known_state())
        recorder = Recorder(source, History(), interval=0.05)
        recorder.start()
        try:
            app = build_app(source, recorder, DashboardSettings())
            route = next(r for r in app.routes if getattr(r, "path", "") == "/stream")
            from starlette.requests import Request
            scope = {"type": "http", "method": "GET", "path": "/stream", "headers": [],
                     "query_string": b""}
            response = await route.endpoint(Request(scope))  # type: ignore[attr-defined]
            chunks = []
            async for chunk in response.body_iterator:
                chunks.append(chunk if isinstance(chunk, str) else chunk.decode())
                if len(chunks) == 3:
                    break
            return chunks
        finally:
            await recorder.stop()

    chunks = asyncio.run(go())
    assert chunks[0].startswith("retry: 2000\nevent: hello")
    assert chunks[1].startswith("event: tick\ndata: {\"seq\": ")
    assert chunks[2].startswith("event: tick")


def test_vendored_files_match_their_recorded_hashes() -> None:
    static = Path(__file__).parents[2] / "src/roost/dashboard/static"
    table = (static / "VENDORED.md").read_text()
    rows = re.findall(r"\| `(vendor/[^`]+)` \|.*\| `([0-9a-f]{64})` \|", table)
    assert len(rows) == 3
    for name, digest in rows:
        assert hashlib.sha256((static / name).read_bytes()).hexdigest() == digest, name


def test_roost_dashboard_refuses_a_public_bind_without_credentials() -> None:
    from click.testing import CliRunner

    from roost.cli import main

    result = CliRunner().invoke(main, ["dashboard", "--host", "0.0.0.0", "--nats",
                                       "nats://127.0.0.1:1"])
    assert result.exit_code == 2
    assert "refusing to serve the dashboard on '0.0.0.0' without credentials" in result.output


def test_console_tail_needs_credentials() -> None:
    lines = "\n".join(f"line {i}" for i in range(100))
    source = StaticSource(known_state(), consoles={"i-a": lines})
    app = build_app(source, Recorder(source, History()), DashboardSettings(
        credentials={KEY: SECRET}))
    with TestClient(app) as client:
        assert 'hx-get="/instances/i-a/console"' in client.get("/instances/i-a").text
        assert client.get("/instances/i-a/console").status_code == 401
        shown = client.get("/instances/i-a/console", headers=_basic(KEY, SECRET))
        assert shown.status_code == 200 and "The last 100 lines" in shown.text
        assert "line 99" in shown.text
        empty = client.get("/instances/i-b/console", headers=_basic(KEY, SECRET)).text
        assert "No console output." in empty
        assert client.get("/instances/i-zz/console",
                          headers=_basic(KEY, SECRET)).status_code == 404
    app = build_app(source, Recorder(source, History()), DashboardSettings())
    with TestClient(app) as client:
        r = client.get("/instances/i-a/console", headers=_basic(KEY, SECRET))
    assert r.status_code == 403 and "line 99" not in r.text


def test_console_text_keeps_the_last_lines() -> None:
    raw = base64.b64encode("\n".join(f"l{i}" for i in range(100)).encode()).decode()
    assert console_text(raw, 3) == "l97\nl98\nl99"
    assert console_text("") == ""
