"""Quotas under concurrency: two gateways in two processes (the test's own cluster's,
and a ``roost gateway`` process beside it, sharing only NATS) launching at once for one account
never take it past its vCPU quota, not by one vCPU; a terminated instance gives its
vCPUs back, and so does a launch that fails; a stopped one holds none until started."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from click.testing import CliRunner

from roost.cli import main
from roost.embedded.proc import free_port
from roost.gateway.accounts import OPERATOR_KEY_ENV
from tests.e2e.conftest import IMAGE, ThreadedCluster, make_cluster
from tests.polling import wait_until

LIMIT = 9  # vCPUs of the standard class; t3.micro has 2, so 4 fit and a 5th would not
LAUNCHES = 12


def _cli(env: dict[str, str], url: str, *args: str) -> str:
    res = CliRunner().invoke(main, [*args, "--nats", url], env=env)
    assert res.exit_code == 0, res.output
    return res.output


@pytest.fixture
def two_gateways(tmp_path: Path) -> Iterator[tuple[ThreadedCluster, list[str], dict[str, str]]]:
    operator_key = os.urandom(32)
    key_file = tmp_path / "operator.key"
    key_file.write_text(base64.urlsafe_b64encode(operator_key).decode())
    key_file.chmod(0o600)
    cluster = make_cluster(tmp_path / "c", nodes=2, capacity="16vcpu,64GiB",
                           operator_key=operator_key)
    env = {OPERATOR_KEY_ENV: key_file.read_text()}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        port = free_port()
        with (tmp_path / "gw.log").open("wb") as out:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "roost", "gateway", "--nats", cluster.nats.url,
                 "--port", str(port), "--operator-key-file", str(key_file),
                 "--log-level", "WARNING"], stdout=out, stderr=subprocess.STDOUT))
        other = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            assert procs[0].poll() is None, (tmp_path / "gw.log").read_text()
            assert time.monotonic() < deadline, "the gateway process did not come up"
            try:
                if httpx.get(other + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        yield cluster, [cluster.endpoint, other], env
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        cluster.stop()


def _client(endpoint: str, key: dict[str, str]) -> Any:
    """Retrying 5xx as boto3 does by default (a node slow to answer on a loaded host is a
    503): RunInstances carries a ClientToken boto3 makes, so a retry never launches
    twice. A quota refusal is a 400, never retried."""
    return boto3.client(
        "ec2", endpoint_url=endpoint, region_name="roost-1",
        aws_access_key_id=key["access_key_id"], aws_secret_access_key=key["secret_access_key"],
        config=Config(retries={"total_max_attempts": 4, "mode": "standard"}))


def _set_quota(env: dict[str, str], cluster: ThreadedCluster, account: str, vcpus: int) -> None:
    """Set the standard class's quota, then wait until the cluster's own gateway (the one
    ``clients[0]`` launches through) applies it: its copy of the accounts follows the
    bucket a moment after the CLI writes it."""
    _cli(env, cluster.nats.url, "accounts", "set-quota", account, "--vcpus",
         f"standard={vcpus}")
    keys = cluster.cluster.gateway.keys

    def applied() -> int | None:
        quotas = keys.quotas(account)
        return None if quotas is None else quotas.vcpus.get("standard")

    wait_until(f"the gateway applies a quota of {vcpus}",
               lambda: cluster.read(applied) == vcpus,
               detail=lambda: f"it holds {cluster.read(applied)}")


def _usage(env: dict[str, str], url: str, account: str) -> dict[str, Any]:
    return dict(json.loads(_cli(env, url, "accounts", "show", account, "--json"))["usage"])


def test_two_gateways_racing_never_exceed_the_vcpu_quota(two_gateways: Any) -> None:
    cluster, endpoints, env = two_gateways
    url = cluster.nats.url
    account = json.loads(_cli(env, url, "accounts", "create", "racers", "--json"))["account_id"]
    _cli(env, url, "accounts", "set-quota", account, "--vcpus", f"standard={LIMIT}")
    key = json.loads(_cli(env, url, "keys", "create", account, "--json"))
    clients = [_client(endpoints[i % 2], key) for i in range(LAUNCHES)]
    deadline = time.monotonic() + 10
    for c in clients[:2]:  # until both gateways' key books have the key
        while True:
            try:
                c.describe_regions()
                break
            except ClientError:
                assert time.monotonic() < deadline
                time.sleep(0.05)

    results: list[str] = []
    barrier = threading.Barrier(LAUNCHES)

    def launch(ec2: Any) -> None:
        barrier.wait()
        try:
            out = ec2.run_instances(ImageId=IMAGE, InstanceType="t3.micro", MinCount=1,
                                    MaxCount=1)
            results.append(out["Instances"][0]["InstanceId"])
        except ClientError as err:
            results.append(err.response["Error"]["Code"])

    threads = [threading.Thread(target=launch, args=(c,)) for c in clients]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    launched = [r for r in results if r.startswith("i-")]
    refused = [r for r in results if not r.startswith("i-")]
    assert len(launched) == LIMIT // 2, results  # ample room: only the quota refuses
    assert set(refused) == {"VcpuLimitExceeded"}, results
    assert _usage(env, url, account)["vcpus"] == {"standard": 2 * len(launched)}

    # A terminated instance gives its vCPUs back (released as the gateways see it end).
    ec2 = clients[0]
    ec2.terminate_instances(InstanceIds=[launched[0]])
    wait_until("the quota released", lambda: _usage(env, url, account)["vcpus"]["standard"]
               == 2 * (len(launched) - 1), 30, 0.1)
    again = ec2.run_instances(ImageId=IMAGE, InstanceType="t3.micro", MinCount=1, MaxCount=1)
    launched = [*launched[1:], again["Instances"][0]["InstanceId"]]

    # A launch that fails for want of room holds nothing afterwards.
    _set_quota(env, cluster, account, 200)
    with pytest.raises(ClientError) as err:
        ec2.run_instances(ImageId=IMAGE, InstanceType="m7i.8xlarge", MinCount=1, MaxCount=1)
    assert err.value.response["Error"]["Code"] == "InsufficientInstanceCapacity"
    usage = _usage(env, url, account)
    assert usage["vcpus"] == {"standard": 2 * len(launched)}
    assert usage["launches_in_flight"] == 0

    # Quotas count running instances: a stop gives back, a start must fit again.
    ec2.stop_instances(InstanceIds=[launched[0]])
    ec2.get_waiter("instance_stopped").wait(InstanceIds=[launched[0]],
                                            WaiterConfig={"Delay": 0.2, "MaxAttempts": 100})
    running = 2 * (len(launched) - 1)
    assert _usage(env, url, account)["vcpus"] == {"standard": running}
    _set_quota(env, cluster, account, running + 1)
    with pytest.raises(ClientError) as err:
        ec2.start_instances(InstanceIds=[launched[0]])
    assert err.value.response["Error"]["Code"] == "VcpuLimitExceeded"
    _set_quota(env, cluster, account, running + 2)
    ec2.start_instances(InstanceIds=[launched[0]])
    assert _usage(env, url, account)["vcpus"] == {"standard": running + 2}
    ec2.terminate_instances(InstanceIds=launched)
