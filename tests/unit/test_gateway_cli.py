"""The gateway's and `roost up`'s command lines: options and refusals, no servers."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import roost.gateway as gateway_pkg
from roost.bench.launch import launch
from roost.gateway.cli import gateway, nodes_table, parse_credentials, status
from roost.up.cli import banner, load_or_make_credentials, up
from roost.up.cluster import ClusterSpec


def test_public_surface() -> None:
    assert set(gateway_pkg.__all__) == {"ACTIONS", "Gateway", "GatewayConfig", "SigV4Verifier"}
    assert "RunInstances" in gateway_pkg.ACTIONS


def test_credentials_option() -> None:
    assert parse_credentials(("A:x, B:y", "C:z")) == {"A": "x", "B": "y", "C": "z"}
    with pytest.raises(click.BadParameter):
        parse_credentials(("no-secret",))


def test_gateway_refuses_to_start_without_keys_or_no_auth() -> None:
    out = CliRunner().invoke(gateway, [], env={"ROOST_GATEWAY_CREDENTIALS": ""})
    assert out.exit_code == 2 and "--no-auth" in out.output


def test_gateway_refuses_an_unknown_policy() -> None:
    out = CliRunner().invoke(gateway, ["--no-auth", "--policy", "roulette"])
    assert out.exit_code == 2


@pytest.mark.parametrize(("text", "says"), [
    ("[workload]\n\"x9.huge\" = 1\n", "unknown instance type"),
    ("[workload]\n\"t3.micro\" = 0\n", "positive number"),
    ("[workload]\n\"t3.micro\" = \"lots\"\n", "positive number"),
    ("[workload]\n", "non-empty table"),
    ("[workload]\n\"t3.micro\" = inf\n", "positive number"),
    ("[workload]\n\"t3.micro\" = nan\n", "positive number"),
    ("[workload]\ng5.xlarge = 1\n", 'quote type names that hold a dot, as in "g5.xlarge"'),
    ("workload = [", "invalid TOML"),
])
def test_gateway_refuses_a_bad_workload_file(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "workload.toml"
    path.write_text(text)
    out = CliRunner().invoke(gateway, ["--no-auth", "--workload", str(path)])
    assert out.exit_code == 2 and "--workload" in out.output and says in out.output


def test_a_workload_for_a_policy_that_ignores_it_is_warned_about(tmp_path: Path) -> None:
    path = tmp_path / "workload.toml"
    path.write_text('[workload]\n"t3.micro" = 1\n')
    # No keys and no --no-auth: it warns, then refuses to start, without a server.
    out = CliRunner().invoke(gateway, ["--policy", "pack", "--workload", str(path)],
                             env={"ROOST_GATEWAY_CREDENTIALS": ""})
    assert out.exit_code == 2 and "--workload is not used by the pack policy" in out.output


def test_up_refuses_a_bad_capacity(tmp_path: Path) -> None:
    out = CliRunner().invoke(up, ["--node-capacity", "lots", "--data-dir", str(tmp_path)])
    assert out.exit_code == 2 and "--node-capacity" in out.output


def test_up_keeps_its_generated_keys(tmp_path: Path) -> None:
    first = load_or_make_credentials(tmp_path)
    assert first == load_or_make_credentials(tmp_path)
    assert first[0].startswith("AKIA") and len(first[0]) == 20 and len(first[1]) == 40
    saved = json.loads((tmp_path / "credentials.json").read_text())
    assert saved["access_key_id"] == first[0]
    assert (tmp_path / "credentials.json").stat().st_mode & 0o077 == 0


def test_banner_has_a_ready_to_paste_line(tmp_path: Path) -> None:
    spec = ClusterSpec(data_dir=tmp_path, credentials={"AKIAX": "s"})
    text = banner(spec, endpoint="http://127.0.0.1:8773", nats_url="nats://x", key="AKIAX",
                  secret="s")
    assert ("export AWS_ACCESS_KEY_ID=AKIAX AWS_SECRET_ACCESS_KEY=s "
            "AWS_DEFAULT_REGION=roost-1") in text
    assert ("aws ec2 run-instances --endpoint-url http://127.0.0.1:8773 "
            "--image-id ami-00000000000000001 --instance-type t3.micro --count 1") in text


def test_status_table_renders() -> None:
    node = {"node_id": "n1", "availability_zone": "roost-1a", "live": True, "draining": False,
            "free": {"cpu_milli": 6000, "mem_mib": 30720},
            "allocatable": {"cpu_milli": 8000, "mem_mib": 32768},
            "gpus": [], "instances": 1, "fit": {"t3.micro": 3, "t3.nano": 3}}
    table = nodes_table([node])
    assert table.row_count == 1
    assert list(table.columns[7].cells) == ["unknown"]  # a node from before isolation


def test_status_table_shows_isolation_and_why_it_is_lower() -> None:
    node = {"node_id": "n1", "availability_zone": "roost-1a", "live": True, "draining": False,
            "free": {"cpu_milli": 6000, "mem_mib": 30720},
            "allocatable": {"cpu_milli": 8000, "mem_mib": 32768}, "gpus": [], "instances": 0,
            "fit": {}, "isolation": "none", "isolation_note": "cgroups unavailable (EACCES)"}
    table = nodes_table([node])
    assert list(table.columns[7].cells) == ["none (!)"]
    assert table.caption == "(!) n1: cgroups unavailable (EACCES)"


def test_banner_names_the_isolation_level(tmp_path: Path) -> None:
    spec = ClusterSpec(data_dir=tmp_path, credentials={"AKIAX": "s"})
    text = banner(spec, endpoint="http://127.0.0.1:8773", nats_url="nats://x", key="AKIAX",
                  secret="s", isolation="cgroup")
    assert "3 nodes (process driver, 8vcpu,32GiB each, isolation cgroup)" in text


def test_status_reports_an_unreachable_gateway() -> None:
    out = CliRunner().invoke(status, ["--endpoint", "http://127.0.0.1:9"])
    assert out.exit_code == 1 and "cannot reach" in out.output


def test_bench_help() -> None:
    out = CliRunner().invoke(launch, ["--help"])
    assert out.exit_code == 0 and "--concurrency" in out.output
