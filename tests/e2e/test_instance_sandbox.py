"""`--isolation sandbox`: bubblewrap around the cgroup. The instance has its own pid
namespace and /tmp, sees the host read-only and none of the node's data but its own
directory, and still reads its identity from the metadata service."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import ThreadedCluster, make_cluster
from tests.e2e.test_boto3 import wait_state
from tests.e2e.test_instance_actions import console
from tests.e2e.test_instance_limits import IDENTITY, PYTHON_IMAGE, identity, pytestmark

__all__ = ["pytestmark"]  # needs cgroups, as the limits tests do

PROBE = """
echo "pid-in-namespace $$"
echo "proc-count $(ls /proc | grep -c '^[0-9]')"
echo host-marker-visible $(test -e {marker} && echo yes || echo no)
echo sandbox > /tmp/roost-sandbox-write && echo tmp-writable yes
touch /usr/roost-sandbox-probe 2>/dev/null && echo host-writable yes || echo host-writable no
echo own-dir-writable $(touch ./probe && echo yes || echo no)
echo siblings $(ls {instances} | wc -l)
echo probe-done
exec sleep 600
"""


@pytest.fixture(scope="module")
def scluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedCluster]:
    if shutil.which("bwrap") is None:
        pytest.fail("the sandbox tests need bubblewrap: apt-get install bubblewrap "
                    "(make test installs it when run as root)")
    c = make_cluster(tmp_path_factory.mktemp("sandbox"), nodes=1, capacity="4vcpu,8GiB",
                     driver="process", isolation="sandbox")
    try:
        yield c
    finally:
        c.stop()


def test_the_node_reports_sandbox_isolation(scluster: ThreadedCluster) -> None:
    node = scluster.cluster.nodes[0]
    assert node.driver.isolation == "sandbox" and node.driver.isolation_note == ""
    assert node.snapshot().isolation == "sandbox"


def test_a_sandboxed_instance_sees_only_itself(scluster: ThreadedCluster) -> None:
    ec2: Any = scluster.client()
    marker = Path("/tmp") / "roost-host-marker"
    marker.write_text("host")
    instances = scluster.cluster.nodes[0].config.data_dir / "instances"
    script = PROBE.format(marker=marker, instances=instances)
    ids = []
    try:
        for _ in range(2):
            out = ec2.run_instances(ImageId="ami-00000000000000001", InstanceType="t3.micro",
                                    MinCount=1, MaxCount=1, UserData=script)
            ids.append(out["Instances"][0]["InstanceId"])
        text = console(ec2, ids[1], "probe-done")
        facts = dict(line.split(" ", 1) for line in text.splitlines() if " " in line)
        assert int(facts["pid-in-namespace"]) < 10  # its own pid namespace
        assert int(facts["proc-count"]) < 10
        assert facts["host-marker-visible"] == "no" and facts["tmp-writable"] == "yes"
        assert not Path("/tmp/roost-sandbox-write").exists()  # a private /tmp
        assert facts["host-writable"] == "no"
        assert facts["own-dir-writable"] == "yes"
        assert facts["siblings"] == "1"  # its own directory; the other instance's is hidden
    finally:
        marker.unlink()
        if ids:
            ec2.terminate_instances(InstanceIds=ids)
            for iid in ids:
                wait_state(ec2, iid, "terminated", timeout=30)


def test_metadata_service_works_from_the_sandbox(scluster: ThreadedCluster) -> None:
    ec2: Any = scluster.client()
    out = ec2.run_instances(ImageId=PYTHON_IMAGE, InstanceType="t3.micro", MinCount=1,
                            MaxCount=1, UserData=IDENTITY,
                            MetadataOptions={"HttpTokens": "required"})
    iid = out["Instances"][0]["InstanceId"]
    try:
        assert identity(ec2, iid)["instance_id"] == iid
    finally:
        ec2.terminate_instances(InstanceIds=[iid])
        wait_state(ec2, iid, "terminated", timeout=30)
