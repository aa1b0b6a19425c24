"""Fault drills through the EC2 API, with real processes: each asserts no lost instance,
no leaked capacity, no duplicate launch and no false InsufficientInstanceCapacity, and
prints how long the cluster took to recover (``pytest -m fault -s`` shows the figures).

- NATS killed (SIGKILL) under a launch/terminate load, then started again on the same
  port and store;
- the instances bucket deleted under a launch load (every KV write fails), then back.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from roost.bus import subjects
from roost.bus.connect import key_value
from tests.e2e.conftest import IMAGE, ThreadedCluster, make_cluster
from tests.e2e.test_boto3 import wait_state

pytestmark = pytest.mark.fault


@pytest.fixture
def fcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedCluster]:
    # Room for 768 t3.micro: the load keeps about half of what it launches, and must
    # never fill the cluster, so that any InsufficientInstanceCapacity is a false one.
    c = make_cluster(tmp_path_factory.mktemp("faults"), nodes=3, capacity="1024vcpu,4TiB")
    try:
        yield c
    finally:
        c.stop()


class Load:
    """A client thread that launches (with a ClientToken, as boto3 does) and
    terminates in a loop, counting each answer by its EC2 code."""

    def __init__(self, cluster: ThreadedCluster) -> None:
        self.ec2 = cluster.client()
        self.outcomes: Counter[str] = Counter()
        self.messages: dict[str, str] = {}  # the first message of each error code
        self.launched: dict[str, str] = {}  # ClientToken -> instance id
        self.ok_times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set() and n < 600:  # bounded, whatever the timing
            n += 1
            token = f"fault-{n}"
            try:
                out = self.ec2.run_instances(ImageId=IMAGE, InstanceType="t3.micro",
                                             MinCount=1, MaxCount=1, ClientToken=token)
            except ClientError as exc:
                code = exc.response["Error"]["Code"]
                self.outcomes[code] += 1
                self.messages.setdefault(code, exc.response["Error"]["Message"])
                time.sleep(0.05)
                continue
            except EndpointConnectionError:
                self.outcomes["connection"] += 1
                continue
            iid = out["Instances"][0]["InstanceId"]
            self.launched[token] = iid
            self.outcomes["ok"] += 1
            self.ok_times.append(time.monotonic())
            if n % 2 == 0:  # half are terminated again under the load
                try:
                    self.ec2.terminate_instances(InstanceIds=[iid])
                except ClientError as exc:
                    self.outcomes[f"terminate:{exc.response['Error']['Code']}"] += 1

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def settle(cluster: ThreadedCluster, ec2: Any, ids: list[str]) -> None:
    """Terminate everything, then check the ledgers are exactly empty again."""
    for i in range(0, len(ids), 100):
        ec2.terminate_instances(InstanceIds=ids[i:i + 100])
    for iid in ids:
        wait_state(ec2, iid, "terminated", timeout=30)
    deadline = time.monotonic() + 10
    while any(cluster.allocations().values()):
        assert time.monotonic() < deadline, f"leaked capacity: {cluster.allocations()}"
        time.sleep(0.1)


def test_nats_killed_and_restarted_under_load(fcluster: ThreadedCluster) -> None:
    ec2 = fcluster.client()
    server = fcluster.nats.server
    with Load(fcluster) as load:
        time.sleep(2.0)
        before = load.outcomes["ok"]
        server.kill()
        killed = time.monotonic()
        time.sleep(2.0)
        server.start()
        restarted = time.monotonic()
        deadline = restarted + 30
        while not load.ok_times or load.ok_times[-1] < restarted:
            assert time.monotonic() < deadline, f"no launch succeeded after the restart: " \
                                                f"{dict(load.outcomes)}"
            time.sleep(0.05)
        recovered = load.ok_times[-1] - restarted
        time.sleep(1.0)
    print(f"\nNATS down {restarted - killed:.1f} s; first launch after restart "
          f"{recovered:.2f} s later; outcomes {dict(load.outcomes)} {load.messages}")
    assert before > 0
    # Only "unavailable" while the bus was down: never a capacity answer, never a 500.
    refused = {k for k in load.outcomes if k not in ("ok",)}
    assert refused <= {"ServiceUnavailable", "terminate:ServiceUnavailable", "connection"}
    # No duplicates, nothing lost: every token launched one instance, still describable.
    ids = list(load.launched.values())
    assert len(set(ids)) == len(ids)
    described = {i["InstanceId"] for r in ec2.describe_instances()["Reservations"]
                 for i in r["Instances"]}
    assert set(ids) <= described
    settle(fcluster, ec2, ids)


def test_kv_writes_failing_during_launches(fcluster: ThreadedCluster) -> None:
    ec2 = fcluster.client()

    async def drop_bucket() -> None:
        await fcluster.cluster.nodes[0]._nc.jetstream().delete_key_value(  # type: ignore[union-attr]
            subjects.INSTANCES_BUCKET)

    async def bring_back() -> None:
        nc = fcluster.cluster.nodes[0]._nc
        assert nc is not None
        await key_value(nc, subjects.INSTANCES_BUCKET)

    fcluster.run(drop_bucket())
    ids = []
    for _ in range(20):  # every node's KV put fails meanwhile; launches still answer
        out = ec2.run_instances(ImageId=IMAGE, InstanceType="t3.micro", MinCount=1, MaxCount=1)
        ids.append(out["Instances"][0]["InstanceId"])
    nodes = fcluster.cluster.nodes
    assert sum(len(n._unpublished) for n in nodes) == len(ids)  # held in the outbox
    fcluster.run(bring_back())
    started = time.monotonic()
    while any(n._unpublished for n in nodes):
        assert time.monotonic() - started < 20, "records never reached the bucket"
        time.sleep(0.05)
    published = time.monotonic() - started
    # The gateways' mirror follows the new bucket at once (it re-watches on JetStream's
    # stream-created advisory): every instance shows as running.
    for iid in ids:
        wait_state(ec2, iid, "running", timeout=20)
    mirrored = time.monotonic() - started
    assert mirrored < 10, f"the gateway took {mirrored:.1f} s to follow the new bucket"
    print(f"\nrecords back in the bucket {published:.2f} s after it was; gateway "
          f"describes them all running {time.monotonic() - started:.2f} s after")

    async def keys() -> set[str]:
        nc = nodes[0]._nc
        assert nc is not None
        kv = await key_value(nc, subjects.INSTANCES_BUCKET)
        return set(await kv.keys())

    assert set(ids) <= fcluster.run(keys())
    settle(fcluster, ec2, ids)
