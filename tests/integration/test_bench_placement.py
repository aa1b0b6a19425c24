"""Smoke runs of ``roost bench placement`` and ``roost bench vm-trace``.

The ``--quick`` runs replay traces generated in the upstream formats (tests/traces.py),
so they pass on a fresh clone; when the real traces sit in ../shared/data beside the
project they run on those too (docs/benchmarks.md), and are skipped otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from roost.bench.placement import placement_command
from roost.bench.traces import AZURE_V1, OPENB, default_data_dir
from roost.bench.vm_trace import vm_trace_command
from roost.decide.placement import POLICIES
from tests.traces import write_traces


@pytest.fixture(scope="module", params=["generated", "shared"])
def trace_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generated traces, then the real ones when they are beside the project."""
    if request.param == "generated":
        return write_traces(tmp_path_factory.mktemp("traces"))
    data = default_data_dir()
    if not (data / OPENB).is_dir() or not (data / AZURE_V1).is_dir():
        pytest.skip(f"no real traces at {data} (docs/benchmarks.md says where to get them)")
    return data


def test_quick_placement_on_the_openb_trace(trace_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "placement.json"
    result = CliRunner().invoke(placement_command, ["--data-dir", str(trace_dir), "--quick",
                                                    "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    by_policy = {r["policy"]: r for r in doc["results"]}
    assert list(by_policy) == list(POLICIES)
    for r in by_policy.values():
        assert 50 < r["gpu_alloc_pct_at_100_arrived"] <= 100
        assert len(r["curve"]) == 131 and r["seeds"] == [42]
    assert out.with_suffix(".md").read_text().startswith("### openb_pod_list_default.csv")
    assert out.with_suffix(".png").stat().st_size > 10_000


def test_quick_placement_reads_gpu_model_sets(trace_dir: Path, tmp_path: Path) -> None:
    """``openb_pod_list_gpuspec20``: some pods take any of several GPU models (``A|B``)."""
    out = tmp_path / "gpuspec.json"
    result = CliRunner().invoke(placement_command, [
        "--data-dir", str(trace_dir), "--pods", "openb_pod_list_gpuspec20.csv", "--quick",
        "--order", "shuffled", "--policy", "roost", "--policy", "fgd", "--json", str(out),
    ])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert [r["policy"] for r in doc["results"]] == ["roost", "fgd"]
    for r in doc["results"]:
        assert 50 < r["gpu_alloc_pct_at_100_arrived"] <= 100


def test_quick_vm_trace_on_the_azure_trace(trace_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "vm.json"
    result = CliRunner().invoke(vm_trace_command, [
        "--data-dir", str(trace_dir), "--quick", "--policy", "pack", "--policy", "anycast",
        "--json", str(out),
    ])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert [r["policy"] for r in doc["results"]] == ["pack", "anycast"]
    for r in doc["results"]:
        assert r["host"] == "64vcpu,512GiB"
        assert r["min_hosts_zero_rejections"] >= r["lower_bound_hosts"] > 0
    assert out.with_suffix(".png").exists()


# -- synthetic traces: no data needed ---------------------------------------------------


def write_synthetic(root: Path) -> Path:
    openb = root / "alibaba-openb"
    openb.mkdir(parents=True)
    nodes = ["sn,cpu_milli,memory_mib,gpu,model"]
    nodes += [f"node-{i:02d},32000,131072,4,A10" for i in range(6)]
    nodes += [f"node-{i:02d},64000,262144,0," for i in range(6, 8)]
    (openb / "tiny_nodes.csv").write_text("\n".join(nodes) + "\n")
    head = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
            "creation_time,deletion_time,scheduled_time")
    shapes = ["4000,8192,1,1000", "2000,4096,1,500", "8000,8192,0,0", "3000,4096,1,300",
              "16000,32768,4,1000", "4000,8192,2,1000"]
    pods = [head] + [f"pod-{i:03d},{shapes[i % len(shapes)]},,LS,Running,{i},,{i}"
                     for i in range(30)]
    (openb / "tiny_pods.csv").write_text("\n".join(pods) + "\n")
    published = root / "fgd-published"
    published.mkdir()
    cols = ",".join(str(k) for k in range(131))
    row = ",".join(str(min(k, 90)) for k in range(131))
    (published / "analysis_allo_discrete.csv").write_text(
        f"workload,sc_policy,tune,seed,total_gpus,{cols}\n"
        f"tiny_pods,06-FGD,1.3,42,24,{row}\n"
    )
    azure = root / "azure-v1"
    azure.mkdir()
    (azure / "flav_map.txt").write_text("1,2 a\n4,8 b\n")
    (azure / "v1.interval_map.txt").write_text("0 0\n300 1\n600 2\n900 2\n")
    (azure / "v1.test.txt").write_text("2100000 a,b,|,b\n2100300 a,|,a,a\n2100600 b\n")
    (azure / "v1.test.c2591400.txt").write_text(
        "2100000 U0,U1,|,C2\n2100300 U2,|,U0,U1\n2100600 U0\n"
    )
    return root


def test_placement_on_a_synthetic_trace(tmp_path: Path) -> None:
    data = write_synthetic(tmp_path / "data")
    out = tmp_path / "out" / "tiny.json"
    result = CliRunner().invoke(placement_command, [
        "--data-dir", str(data), "--nodes", "tiny_nodes.csv", "--pods", "tiny_pods.csv",
        "--policy", "all", "--seeds", "42-43", "--json", str(out),
    ])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["cluster_gpus"] == 24
    assert {r["policy"] for r in doc["results"]} == set(POLICIES)
    assert all(r["seeds"] == [42, 43] for r in doc["results"])
    assert doc["published"][0]["policy"] == "FGD"
    assert doc["published"][0]["gpu_alloc_pct_at_100_arrived"] == 90
    md = out.with_suffix(".md").read_text()
    assert "| fgd |" in md and "FGD 90.00" in md


def test_vm_trace_on_a_synthetic_trace(tmp_path: Path) -> None:
    data = write_synthetic(tmp_path / "data")
    out = tmp_path / "vm.json"
    result = CliRunner().invoke(vm_trace_command, [
        "--data-dir", str(data), "--host", "4vcpu,8GiB", "--policy", "all", "--json", str(out),
    ])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["vms"] == 7
    for r in doc["results"]:
        assert r["min_hosts_zero_rejections"] >= r["lower_bound_hosts"]
        assert r["peak"]["empty_hosts"] >= 0


def test_missing_data_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(placement_command, ["--data-dir", str(tmp_path), "--quick"])
    assert result.exit_code == 1
    assert "openb_node_list_gpu_node.csv not found" in result.output
    result = CliRunner().invoke(vm_trace_command, ["--data-dir", str(tmp_path), "--quick"])
    assert result.exit_code == 1
    assert "flav_map.txt not found" in result.output


def test_a_flavor_bigger_than_the_host_is_refused(tmp_path: Path) -> None:
    data = write_synthetic(tmp_path / "data")
    result = CliRunner().invoke(vm_trace_command, ["--data-dir", str(data), "--host",
                                                   "2vcpu,4GiB"])
    assert result.exit_code == 1
    assert "does not fit an empty 2vcpu,4GiB host" in result.output
