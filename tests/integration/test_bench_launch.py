"""`roost bench launch --quick`: roost, moto's server, the NATS floor and ICE in one run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from roost.bench.launch import bucket_percentile, launch

pytest.importorskip("moto.server")


@pytest.mark.timeout(60)
def test_quick_run_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "launch.json"
    result = CliRunner().invoke(launch, ["--quick", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    for name in ("roost", "moto", "nats_floor"):
        levels = report[name]
        assert [lv["concurrency"] for lv in levels] == [1, 8], name
        assert all(lv["errors"] == 0 and lv["pairs"] > 0 for lv in levels), name
        assert all(lv["launches_per_second"] > 0 for lv in levels), name
        assert all(0 < lv["run_p50_ms"] <= lv["run_p99_ms"] for lv in levels), name
    assert all(ice["ice"] == ice["requests"] > 0 and ice["errors"] == 0
               for ice in report["ice"])
    assert all(ice["server_p99_ms_le"] is not None and ice["server_mean_ms"] > 0
               and 0 <= ice["server_share_le_5ms"] <= 1 for ice in report["ice"])
    assert all("roost_over_moto" in r and "roost_over_nats_floor" in r
               for r in report["ratios"])
    assert {"throughput_vs_moto", "ice_server_p99_c1"} <= report["targets"].keys()
    assert all(isinstance(t["met"], bool) for t in report["targets"].values())
    assert report["machine"]["cpus"]
    assert "target throughput_vs_moto" in result.output


def test_bucket_percentile_reads_the_bucket_bound() -> None:
    cumulative = {0.001: 50.0, 0.0025: 98.0, 0.005: 100.0, float("inf"): 100.0}
    assert bucket_percentile(cumulative, 50) == 0.001
    assert bucket_percentile(cumulative, 99) == 0.005
    assert bucket_percentile({0.001: 0.0, float("inf"): 0.0}, 99) is None
