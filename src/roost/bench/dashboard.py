"""``roost bench dashboard``: server time to render the dashboard at scale.

A cluster state of N nodes (every eighth with four A10Gs) and M instances, with a full
hour of history (720 samples) and a full event log, served by the real Starlette app
from a `StaticSource`. Each page is requested through Starlette's TestClient (in
process, no socket), so a figure is the app's own time plus a thin ASGI shim: server
time as an upper bound. The view functions alone and one recorder tick (sample + diff)
are timed too, and so is the one step a live source adds on a cold cache: listing the
instance mirror into a map. The issue's target: the overview under 300 ms with 1,000 nodes and
100,000 instances.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable
from typing import Any, cast

import click

from roost.bus.schemas import CapacitySnapshot, InstanceRecord
from roost.dashboard import views
from roost.dashboard.app import DashboardSettings, build_app
from roost.dashboard.history import History
from roost.dashboard.model import ClusterState, LaunchCounters, NodeState
from roost.dashboard.recorder import Recorder
from roost.dashboard.sources import StaticSource
from roost.gateway.index import InstanceIndex

_TYPES = ["t3.micro", "t3.small", "m7i.large", "c7i.xlarge", "r7i.large", "g5.xlarge",
          "gs1.quarter"]
_STATES = ["running"] * 8 + ["pending", "stopped", "terminated"]


def make_state(nodes: int, instances: int, *, seed: int = 1, at: float = 1.78e9
               ) -> ClusterState:
    rng = random.Random(seed)
    node_states = []
    for i in range(nodes):
        gpu = i % 8 == 0
        alloc_cpu, alloc_mem = (64000, 262144) if gpu else (32000, 131072)
        used = rng.random()
        snap = CapacitySnapshot(
            node_id=f"node-{i:04d}", boot_id="b", seq=1, availability_zone=f"roost-1{'abc'[i % 3]}",
            draining=i % 97 == 5, alloc_cpu_milli=alloc_cpu, alloc_mem_mib=alloc_mem,
            free_cpu_milli=int(alloc_cpu * (1 - used)), free_mem_mib=int(alloc_mem * (1 - used)),
            gpu_free=[rng.choice([0, 250, 500, 1000]) for _ in range(4)] if gpu else [],
            gpu_models=["A10G"] * 4 if gpu else [],
            fit={t: rng.randint(0, 8) for t in _TYPES}, instances=instances // max(nodes, 1),
            sent_at=at, isolation="cgroup")
        node_states.append(NodeState(snap, rng.random() * 2, i % 113 != 7))
    recs = {}
    for n in range(instances):
        iid = f"i-{n:017x}"
        recs[iid] = InstanceRecord(
            instance_id=iid, node_id=f"node-{rng.randrange(nodes):04d}",
            instance_type=rng.choice(_TYPES), image_id="ami-1", state=rng.choice(_STATES),
            launch_id=f"l-{n}", reservation_id=f"r-{n // 4}",
            launch_time=f"2026-06-01T{n // 3600 % 24:02d}:{n // 60 % 60:02d}:{n % 60:02d}Z",
            availability_zone="roost-1a", tags={"team": rng.choice(["ml", "web", "batch"])},
            private_ip=f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}", updated_at="x")
    controller = {
        "leader": True, "epoch": 3, "holder": "ctl-a", "shadow": False, "ready": True,
        "lastRunAt": "2026-06-01T10:00:00+00:00", "lastError": None,
        "queue": {f"pool-{p}": {"queued": 10 * p, "running": p} for p in range(20)},
        "plan": {"source": "leader", "at": "2026-06-01T10:00:00+00:00", "pools": {
            f"pool-{p}": {"desiredReplicas": p, "currentReplicas": p, "rawDesired": p,
                          "frozenReason": None, "reason": "demand", "action": "hold",
                          "cappedBy": [], "steps": ["hold"]} for p in range(20)},
                 "dbWorkerBudget": 400, "dbConnectionsUsed": 120},
        "scaleActions": [],
    }
    buckets = tuple((b, float(k * 10)) for k, b in enumerate((0.005, 0.01, 0.05, 0.1, 1.0)))
    return ClusterState(at, node_states, recs, controller, "",
                        LaunchCounters(1000.0, 5.0, 0.0, (*buckets, (float("inf"), 40.0))))


def _time(fn: Callable[[], object], repeat: int) -> dict[str, float]:
    fn()  # warm: templates compiled, caches filled
    ms = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t0) * 1000)
    ms.sort()
    return {"median_ms": statistics.median(ms), "p95_ms": ms[int(0.95 * (len(ms) - 1))],
            "max_ms": ms[-1]}


def run(nodes: int, instances: int, *, repeat: int = 20,
        progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    from starlette.testclient import TestClient

    progress(f"building a state of {nodes} nodes and {instances} instances")
    state = make_state(nodes, instances)
    source = StaticSource(state)
    history = History()
    tick_state = state
    for k in range(history.samples.maxlen or 720):
        tick_state = ClusterState(state.at - 5 * (720 - k), state.nodes, state.instances,
                                  state.controller, "", state.launches)
        if k < 2 or k == 719:
            history.record(tick_state)
        else:  # the same sample, without re-diffing 100,000 unchanged records each time
            history.samples.append(history.samples[-1])
    for k in range(history.events.maxlen or 0):
        history._log(state.at, "instance", f"i-{k:017x}", f"i-{k:017x} pending \u2192 running")
    app = build_app(source, Recorder(source, history), DashboardSettings())
    figures: dict[str, Any] = {"nodes": nodes, "instances": instances, "repeat": repeat}
    with TestClient(app) as client:
        pages = {
            "overview": "/", "nodes (page 1 of 50 rows)": "/nodes",
            "instances (page 1, newest first)": "/instances",
            "instances filtered (state+type+tag)":
                "/instances?state=running&type=g5.xlarge&tag=team%3Dml",
            "instances text search": "/instances?q=10.1.2",
            "placement": "/placement", "pools": "/pools", "events": "/events",
            "fragment: overview": "/fragment/overview", "history JSON (720 samples)":
                "/api/history",
        }
        for label, path in pages.items():
            progress(f"timing {label}")

            def get(path: str = path) -> None:
                r = client.get(path)
                assert r.status_code == 200, (path, r.status_code)
            figures[label] = _time(get, repeat)
        figures["overview bytes"] = len(client.get("/").content)
        figures["history JSON bytes"] = len(client.get("/api/history").content)
    progress("timing the state a live source builds from the instance index")
    # What `LiveSource.state` does on a cold cache (at most every half second): the
    # gateway's instance mirror, listed into a map. No KV is touched (upsert and all are
    # memory only), so the buckets are not needed.
    index = InstanceIndex(cast(Any, None), cast(Any, None), cast(Any, None))
    for r in state.instances.values():
        index.upsert(r, from_bucket=True)
    figures["state from the instance index"] = _time(
        lambda: {r.instance_id: r for r in index.all()}, max(3, repeat // 2))
    progress("timing the view functions and a tick")
    figures["views.overview alone"] = _time(lambda: views.overview(state, history), repeat)
    fresh = History()
    fresh.record(state)
    figures["tick (sample + diff of every record)"] = _time(lambda: fresh.record(state),
                                                           max(3, repeat // 4))
    return figures


@click.command("dashboard")
@click.option("--nodes", default=1000, show_default=True)
@click.option("--instances", default=100_000, show_default=True)
@click.option("--repeat", default=20, show_default=True, help="Requests per page timed.")
@click.option("--json", "as_json", is_flag=True)
def dashboard_bench(nodes: int, instances: int, repeat: int, as_json: bool) -> None:
    """Server time to render each dashboard page at scale (1,000 nodes, 100,000 instances)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    with console.status("benchmarking") as status:
        figures = run(nodes, instances, repeat=repeat, progress=lambda m: status.update(m))
    if as_json:
        click.echo(json.dumps(figures, indent=2))
        return
    table = Table("page", "median ms", "p95 ms", "max ms",
                  title=f"dashboard: {nodes} nodes, {instances} instances, "
                        f"{repeat} requests each")
    for key, f in figures.items():
        if isinstance(f, dict):
            table.add_row(key, f"{f['median_ms']:.1f}", f"{f['p95_ms']:.1f}",
                          f"{f['max_ms']:.1f}")
    Console().print(table)
    click.echo(f"overview page: {figures['overview bytes']:,} bytes; history JSON: "
               f"{figures['history JSON bytes']:,} bytes")
