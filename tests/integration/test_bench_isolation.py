"""`roost bench isolation` runs end to end on real node agents and writes its figures."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from roost.bench.isolation import isolation


def test_isolation_bench_smoke(tmp_path: Path) -> None:
    out = CliRunner().invoke(isolation, ["--rounds", "2", "--levels", "none,cgroup",
                                         "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    got = json.loads((tmp_path / "isolation.json").read_text())
    assert set(got["levels"]) == {"none", "cgroup"} and got["rounds"] == 2
    assert got["levels"]["none"]["launch_ratio"] == 1.0
    assert got["levels"]["cgroup"]["launch_p50_ms"] > 0


def test_isolation_bench_refuses_an_unknown_level(tmp_path: Path) -> None:
    out = CliRunner().invoke(isolation, ["--levels", "none,vm", "--out", str(tmp_path)])
    assert out.exit_code == 2 and "unknown level 'vm'" in out.output
