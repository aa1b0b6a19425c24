"""`roost bench scale --quick` on a generated Azure-format trace: every phase and figure,
against a 3-server NATS cluster, sim nodes in a process of their own and 1 then 2
gateway processes."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from roost.bench.scale import at_rest, batches, scale, schedule, still_falling
from roost.bench.traces import load_azure
from roost.bench.vm_sim import flavor_types
from tests.traces import write_azure_v1


@pytest.fixture
def data(tmp_path: Path) -> Path:
    write_azure_v1(tmp_path / "data", random.Random(11), bins=200)
    return tmp_path / "data"


def test_the_schedule_keeps_the_rate_and_littles_law(data: Path) -> None:
    trace = load_azure(data)
    source = batches(trace, flavor_types(trace))
    assert sum(len(b.lifetimes) for b in source) == len(trace.arrivals)
    assert all(a.time <= b.time for a, b in itertools.pairwise(source))
    sched = schedule(source, rate=50.0, live=1000, seconds=60.0)
    vms = sum(len(b.lifetimes) for _, b in sched.items)
    assert 0.5 * 50 * 60 < vms < 1.5 * 50 * 60  # about rate x seconds
    mean_life = sum(sum(b.lifetimes) for b in source) / len(trace.arrivals)
    assert sched.life_scale * mean_life * 50.0 == pytest.approx(1000)


@pytest.mark.timeout(120)
def test_a_cluster_is_at_rest_once_its_cpu_stops_falling() -> None:
    assert still_falling(60.0, 30.0)  # agents still catching up after their start
    assert not still_falling(30.0, 28.0)  # within a tenth and a point: at rest
    assert not still_falling(1.5, 0.8)  # a point of a core is the readings' grain
    assert not still_falling(20.0, 35.0)  # rising is not falling: a busier rest
    # At rest takes two steps in a row that do not fall: after a fill, one step fell a
    # hair short of falling while the catch-up still had half its way to go.
    assert not at_rest([46.4, 41.6])
    assert not at_rest([46.4, 41.6, 28.4])
    assert not at_rest([41.6, 28.4, 20.2, 19.5])
    assert at_rest([28.4, 20.2, 19.5, 19.9])
    assert at_rest([12.8, 12.8, 13.5])


def test_quick_run_reports_every_figure(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(scale, ["--quick", "--data-dir", str(data),
                                        "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "scale.json").read_text())
    (step,) = report["steps"]
    assert step["live_after_fill"] == report["settings"]["live"]
    for ph in (step["fill"], step["steady"], *step["bursts"]):
        assert ph["launched"] > 0 and ph["errors"] == {}, ph
        assert ph["false_ice"] == 0, ph  # a cluster with room never says it is full
    assert [b["gateway_processes"] for b in step["bursts"]] == [1, 2]
    assert all(b["retries_per_launch"] is not None for b in step["bursts"])
    for b in step["bursts"]:  # what the attempts were, read from /metrics by route
        assert b["attempts"].get("node ok", 0) + b["attempts"].get("anycast ok", 0) > 0, b
    assert step["probe_at_0"]["errors"] == step["probe_at_live"]["errors"] == 0
    assert 0 < step["probe_at_0"]["run_p50_ms"] and step["latency_ratio"] > 0
    assert step["probe_at_live"]["mirror_lag_max_ms"] < float("inf")
    for at in ("probe_at_0", "probe_at_live"):  # every role's CPU was found and read
        assert set(step[at]["cpu_ms_per_probe"]) == {"client", "gateway", "nats", "nodes"}
        assert step[at]["cpu_ms_per_probe"]["gateway"] > 0
        assert all(v >= 0 for v in step[at]["idle_cpu_percent"].values())
        assert 2 <= len(step[at]["settle_windows_cpu_percent"]) <= 3  # at most 3 s in --quick
    for ph in (step["probe_at_0"], step["probe_at_live"], step["fill"], step["steady"]):
        assert set(ph["gateway_gc"]) == {"full_collections", "seconds"}  # read from /metrics
    for ph in (step["fill"], step["steady"], *step["bursts"]):  # each phase's CPU, by role
        assert set(ph["cpu_percent"]) == set(ph["cpu_ms_per_launch"]) >= {"gateway", "nodes"}
        assert ph["cpu_ms_per_launch"]["gateway"] > 0 and ph["cpu_percent"]["nodes"] > 0
    assert step["gateway_rss_mib"]["after_fill"] > 0
    turns = step["probe_in_turns"]  # with an empty twin of the cluster, started after
    assert turns["empty_instances_before"] == 0 and turns["probes"] == 4
    assert turns["empty"]["errors"] == turns["live"]["errors"] == 0
    assert turns["empty"]["run_p50_ms"] > 0 and turns["live"]["run_p50_ms"] > 0
    assert turns["ratio"] == round(turns["live"]["run_p50_ms"]
                                   / turns["empty"]["run_p50_ms"], 2)
    assert all(d["ok"] > 0 for d in step["describe_at_live"].values())
    assert (out / "scale.png").stat().st_size > 0
    assert "| 8 | 200 | fill | 1 |" in (out / "scale.md").read_text()
    assert "| 8 | 4 | " in (out / "scale.md").read_text()  # the probe in turns' row
