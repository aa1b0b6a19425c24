"""An instance is held to its type, on real cgroups, through the EC2 API with boto3: the
memory limit kills and says so, the CPU quota holds, a fork bomb stays under its pids
limit, a double-forked daemon dies with terminate, and every instance reads its own
identity (and only its own) from the node's metadata service with botocore."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from roost.domain.catalog import BUILTIN, InstanceType
from roost.node.cgroups import CgroupError, detect
from roost.node.drivers import alive, start_ticks
from tests.e2e.conftest import ThreadedCluster, make_cluster
from tests.e2e.test_boto3 import wait_state
from tests.e2e.test_instance_actions import console
from tests.polling import wait_until

PYTHON_IMAGE = "ami-00000000000000002"
ONE_VCPU = InstanceType("test.one", cpu_milli=1000, mem_mib=512, pids_max=64)


def _cgroups_here() -> str:
    try:
        detect("probe")
    except CgroupError as exc:
        return str(exc)
    return ""


pytestmark = pytest.mark.skipif(
    bool(_cgroups_here()),
    reason=f"needs writable cgroups (root on Linux): {_cgroups_here()}",
)


@pytest.fixture(scope="module")
def lcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedCluster]:
    c = make_cluster(tmp_path_factory.mktemp("limits"), nodes=1, capacity="6vcpu,8GiB",
                     driver="process", catalog=BUILTIN.with_types([ONE_VCPU]))
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def ec2(lcluster: ThreadedCluster) -> Iterator[Any]:
    client = lcluster.client()
    launched: list[str] = []

    def run(itype: str, user_data: str, image: str = PYTHON_IMAGE, **kw: Any) -> str:
        out = client.run_instances(ImageId=image, InstanceType=itype, MinCount=1,
                                   MaxCount=1, UserData=user_data, **kw)
        iid = str(out["Instances"][0]["InstanceId"])
        launched.append(iid)
        return iid

    client.launch = run
    try:
        yield client
    finally:
        if launched:
            client.terminate_instances(InstanceIds=launched)
            for iid in launched:
                wait_state(client, iid, "terminated", timeout=30)


def usage(cluster: ThreadedCluster, iid: str) -> Any:
    u = cluster.cluster.nodes[0].driver.usage(iid)
    assert u is not None, f"no cgroup accounting for {iid}"
    return u


def test_memory_limit_kills_and_says_so(ec2: Any, lcluster: ThreadedCluster) -> None:
    hog = "buf = bytearray(2 * 1024**3)\nprint('allocated', flush=True)\n"
    iid = ec2.launch("t3.micro", hog)  # 1 GiB
    done = wait_state(ec2, iid, "stopped", timeout=60)
    assert done["StateReason"]["Code"] == "Server.OutOfMemory"
    assert "1024 MiB" in done["StateTransitionReason"]
    assert lcluster.allocations() == {"n1": 0}  # the room came back


def test_cpu_quota_holds_a_busy_instance(ec2: Any, lcluster: ThreadedCluster) -> None:
    # Two busy processes: unlimited they would take both of this host's cores.
    spin = ("import os\nos.fork()\nprint('spinning', flush=True)\nwhile True:\n    pass\n")
    iid = ec2.launch("test.one", spin)
    wait_state(ec2, iid, "running")
    console(ec2, iid, "spinning")
    time.sleep(0.5)
    first, t0 = usage(lcluster, iid).cpu_seconds, time.monotonic()
    time.sleep(3.0)
    rate = (usage(lcluster, iid).cpu_seconds - first) / (time.monotonic() - t0)
    # At most the quota; and it did spin (on a loaded host it may get well under one CPU).
    assert 0.05 < rate <= 1.1, f"{rate:.2f} CPU-seconds per second for a 1-vCPU type"
    print(f"\nbusy 1-vCPU instance: {rate:.3f} CPU-seconds per second")


def test_fork_bomb_stays_under_the_pids_limit(ec2: Any, lcluster: ThreadedCluster) -> None:
    bomb = "#!/bin/bash\necho forking\nwhile :; do sleep 100 & done\n"
    iid = ec2.launch("test.one", bomb, image="ami-00000000000000001")
    console(ec2, iid, "forking")
    driver = lcluster.cluster.nodes[0].driver
    deadline = time.monotonic() + 10
    while len(group := driver.pids(iid)) < 50 and time.monotonic() < deadline:
        time.sleep(0.2)  # the bomb's first 50 forks, however slow the host
    time.sleep(1.0)  # and it goes on forking against the limit
    group = driver.pids(iid)
    assert 50 <= len(group) <= ONE_VCPU.pids_max
    # The host keeps working: the gateway and the node still answer at once.
    started = time.monotonic()
    assert wait_state(ec2, iid, "running")["InstanceId"] == iid
    assert time.monotonic() - started < 2.0
    ec2.terminate_instances(InstanceIds=[iid])
    wait_state(ec2, iid, "terminated", timeout=30)
    assert not any(start_ticks(pid) for pid in group)


def test_a_double_forked_daemon_dies_with_terminate(ec2: Any, tmp_path: Path) -> None:
    pid_file = tmp_path / "daemon.pid"
    script = (f"setsid sh -c 'sleep 900 & echo $! > {pid_file}' &\n"
              "echo started\nexec sleep 600\n")
    iid = ec2.launch("t3.micro", script, image="ami-00000000000000001")
    console(ec2, iid, "started")
    wait_until("the daemon writes its pid",
               lambda: pid_file.exists() and pid_file.read_text().strip())
    daemon = int(pid_file.read_text())
    ticks = start_ticks(daemon)
    assert ticks is not None
    ec2.terminate_instances(InstanceIds=[iid])
    wait_state(ec2, iid, "terminated", timeout=30)
    from roost.node.drivers import ProcessRef
    assert not alive(ProcessRef(daemon, ticks)), "the daemon outlived terminate-instances"


IDENTITY = r"""
import json, botocore.session
from botocore.utils import IMDSFetcher
session = botocore.session.get_session()
config = {n: session.get_config_variable(n)
          for n in ("ec2_metadata_service_endpoint", "ec2_metadata_v1_disabled")}
fetcher = IMDSFetcher(timeout=5, config=config)
token = fetcher._fetch_metadata_token()
get = lambda path: fetcher._get_request(path, None, token).text
print("IDENTITY " + json.dumps({
    "token": bool(token),
    "instance_id": get("latest/meta-data/instance-id"),
    "zone": get("latest/meta-data/placement/availability-zone"),
    "document": json.loads(get("latest/dynamic/instance-identity/document")),
}), flush=True)
import time; time.sleep(600)
"""


def identity(ec2: Any, iid: str) -> dict[str, Any]:
    text = console(ec2, iid, "IDENTITY ", timeout=30)
    line = next(ln for ln in text.splitlines() if ln.startswith("IDENTITY "))
    return dict(json.loads(line[len("IDENTITY "):]))


def test_botocore_inside_an_instance_reads_its_own_identity(
        ec2: Any, lcluster: ThreadedCluster) -> None:
    opts = {"HttpTokens": "required"}
    a = ec2.launch("t3.micro", IDENTITY, MetadataOptions=opts)
    b = ec2.launch("t3.micro", IDENTITY, MetadataOptions=opts)
    for iid in (a, b):
        seen = identity(ec2, iid)
        assert seen["token"] and seen["instance_id"] == iid
        assert seen["zone"] == "roost-1a"
        assert seen["document"]["instanceId"] == iid
        assert seen["document"]["instanceType"] == "t3.micro"
    # Anyone else (this test process, not an instance) learns nothing.
    endpoint = lcluster.cluster.nodes[0].imds_endpoint
    with pytest.raises(urllib.error.HTTPError) as outsider:
        urllib.request.urlopen(endpoint + "latest/meta-data/instance-id", timeout=5)
    assert outsider.value.code == 404
    outsider.value.close()
