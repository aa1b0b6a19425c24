"""SigV4 negatives, the admin API, /healthz, /metrics, `roost status`, and a lost bus."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from click.testing import CliRunner

from roost.bench.launch import Signer, bench, percentile
from roost.embedded.proc import free_port
from roost.gateway.cli import fetch_signed, status
from tests.e2e.conftest import IMAGE, ThreadedCluster, make_cluster

BODY = b"Action=DescribeInstances&Version=2016-11-15"


def signed(cluster: ThreadedCluster, body: bytes = BODY, *, secret: str | None = None
           ) -> dict[str, str]:
    req = AWSRequest(method="POST", url=cluster.endpoint + "/", data=body,
                     headers={"Content-Type": "application/x-www-form-urlencoded"})
    SigV4Auth(Credentials(cluster.key, secret or cluster.secret), "ec2", "roost-1").add_auth(req)
    return dict(req.headers.items())


def error_code(resp: httpx.Response) -> str:
    return resp.text.split("<Code>", 1)[1].split("</Code>", 1)[0]


def test_signed_request_passes(cluster: ThreadedCluster) -> None:
    resp = httpx.post(cluster.endpoint + "/", content=BODY, headers=signed(cluster))
    assert resp.status_code == 200 and "<DescribeInstancesResponse" in resp.text


def test_tampered_body_is_refused(cluster: ThreadedCluster) -> None:
    headers = signed(cluster)
    tampered = BODY.replace(b"DescribeInstances", b"DescribeRegions")
    resp = httpx.post(cluster.endpoint + "/", content=tampered, headers=headers)
    assert (resp.status_code, error_code(resp)) == (401, "AuthFailure")


def test_wrong_secret_is_refused(cluster: ThreadedCluster) -> None:
    with pytest.raises(ClientError) as exc:
        cluster.client(secret="not-the-secret").describe_instances()
    assert exc.value.response["Error"]["Code"] == "AuthFailure"
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 401


def test_unsigned_request_is_refused(cluster: ThreadedCluster) -> None:
    resp = httpx.post(cluster.endpoint + "/", content=BODY)
    assert (resp.status_code, error_code(resp)) == (401, "AuthFailure")


def test_old_date_is_expired(cluster: ThreadedCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    old = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=20)
    monkeypatch.setattr("botocore.auth.get_current_datetime", lambda: old.replace(tzinfo=None))
    with pytest.raises(ClientError) as exc:
        cluster.client().describe_instances()
    assert exc.value.response["Error"]["Code"] == "RequestExpired"


def test_admin_api_healthz_metrics_and_status(cluster: ThreadedCluster) -> None:
    ec2 = cluster.client()
    (inst,) = ec2.run_instances(ImageId=IMAGE, InstanceType="t3.large", MinCount=1,
                                MaxCount=1)["Instances"]
    iid = inst["InstanceId"]
    def get(path: str) -> Any:
        return fetch_signed(cluster.endpoint, path, key=cluster.key, secret=cluster.secret,
                            region="roost-1")

    nodes = get("/api/v1/nodes")["nodes"]
    assert {n["node_id"] for n in nodes} == {"n1", "n2", "n3"}
    assert all(n["live"] and n["allocatable"]["cpu_milli"] == 8000 for n in nodes)
    assert any(n["free"]["cpu_milli"] == 6000 for n in nodes)
    assert get(f"/api/v1/instances/{iid}")["instance_type"] == "t3.large"
    assert iid in {i["instance_id"] for i in get("/api/v1/instances?state=running")["instances"]
                   } | {i["instance_id"] for i in get("/api/v1/instances")["instances"]}
    doc = get("/api/v1/openapi.json")
    assert doc["openapi"].startswith("3.") and "/api/v1/nodes" in doc["paths"]
    assert httpx.get(cluster.endpoint + "/api/v1/nodes").status_code == 401

    health = httpx.get(cluster.endpoint + "/healthz")
    assert health.status_code == 200 and health.json()["live_nodes"] == 3
    metrics = httpx.get(cluster.endpoint + "/metrics").text
    assert 'roost_launches_total{outcome="launched"}' in metrics
    assert "roost_gateway_request_seconds_bucket" in metrics
    assert "roost_placement_attempts_total" in metrics

    env = {"AWS_ACCESS_KEY_ID": cluster.key, "AWS_SECRET_ACCESS_KEY": cluster.secret}
    out = CliRunner().invoke(status, ["--endpoint", cluster.endpoint], env=env)
    assert out.exit_code == 0, out.output
    assert "n1" in out.output and "n3" in out.output and "live" in out.output
    ec2.terminate_instances(InstanceIds=[iid])


def test_nats_unreachable_is_service_unavailable(tmp_path: Path) -> None:
    c = make_cluster(tmp_path, nodes=1)
    try:
        ec2: Any = c.client()
        (inst,) = ec2.run_instances(ImageId=IMAGE, InstanceType="t3.micro", MinCount=1,
                                    MaxCount=1)["Instances"]
        c.nats.server.stop()
        calls: list[Callable[[], object]] = [
            lambda: ec2.run_instances(ImageId=IMAGE, InstanceType="t3.micro", MinCount=1,
                                      MaxCount=1),
            lambda: ec2.terminate_instances(InstanceIds=[inst["InstanceId"]]),
        ]
        for call in calls:
            with pytest.raises(ClientError) as exc:
                call()
            assert exc.value.response["Error"]["Code"] == "ServiceUnavailable"
            assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
        assert httpx.get(c.endpoint + "/healthz").status_code == 503
    finally:
        c.stop()


def test_bench_launch_measures_a_running_gateway(cluster: ThreadedCluster) -> None:
    levels = asyncio.run(bench(Signer(cluster.endpoint, cluster.key, cluster.secret, "roost-1"),
                               levels=[1, 4], pairs=8, itype="t3.nano", warmup=2))
    assert [lv.concurrency for lv in levels] == [1, 4]
    assert all(lv.errors == 0 and lv.launches_per_second > 0 for lv in levels)
    assert all(0 < lv.run_p50_ms <= lv.run_p99_ms for lv in levels)
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0


def test_a_gateway_waiting_for_nats_stops_on_sigterm(tmp_path: Path) -> None:
    """NATS not up yet: the gateway says it is waiting, and SIGTERM still stops it."""
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "roost", "gateway", "--no-auth", "--port", "0",
             "--nats", f"nats://127.0.0.1:{free_port()}"],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while "connecting to NATS" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.05)
        time.sleep(0.5)  # inside the connect retries
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(15) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
