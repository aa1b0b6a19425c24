"""RegisterImage, DescribeImages and DeregisterImage through boto3 and the AWS CLI, with
every error code they answer; a second gateway sees what the first registered; and a
registered image on a node whose driver cannot boot it is refused at once, clearly.

The cluster is one process-driver node: the process driver boots no kernel, so it is
the node that "cannot run the image" here (tests/e2e/test_vm.py boots one for real).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from roost.domain.images import MICROVM_IMAGE_ID
from roost.gateway.server import Gateway, GatewayConfig
from tests.e2e.conftest import ThreadedCluster, make_cluster
from tests.e2e.test_instance_actions import aws_cli
from tests.e2e.test_network import fails
from tests.polling import wait_until


@pytest.fixture(scope="module")
def icluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedCluster]:
    c = make_cluster(tmp_path_factory.mktemp("images"), nodes=1, capacity="2vcpu,2GiB",
                     driver="process", isolation="none")
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A kernel (a bzImage says HdrS at 0x202), an initramfs and a qcow2 disk: what
    RegisterImage reads of them is their first bytes."""
    d = tmp_path_factory.mktemp("image-files")
    kernel = bytearray(4096)
    kernel[0x202:0x206] = b"HdrS"
    out = {"kernel": d / "vmlinuz", "initrd": d / "initrd.img", "disk": d / "disk.qcow2",
           "text": d / "notes.txt"}
    out["kernel"].write_bytes(bytes(kernel))
    out["initrd"].write_bytes(b"\x1f\x8b" + bytes(100))
    out["disk"].write_bytes(b"QFI\xfb" + bytes(1020))
    out["text"].write_text("not a kernel\n")
    return out


def _second_gateway(c: ThreadedCluster) -> tuple[Gateway, Any]:
    gw = Gateway(GatewayConfig(nats_urls=[c.nats.url], port=0, region=c.spec.region,
                               credentials=c.spec.credentials))
    c.run(gw.start())
    client = boto3.client("ec2", endpoint_url=gw.endpoint, region_name=c.spec.region,
                          aws_access_key_id=c.key, aws_secret_access_key=c.secret,
                          config=Config(retries={"total_max_attempts": 1}))
    return gw, client


def test_register_describe_and_deregister(icluster: ThreadedCluster,
                                          files: dict[str, Path]) -> None:
    ec2 = icluster.client()
    kid = ec2.register_image(
        Name="my-kernel", Description="a kernel and its initramfs",
        KernelId=str(files["kernel"]), RamdiskId=str(files["initrd"]),
        TagSpecifications=[{"ResourceType": "image", "Tags": [{"Key": "team", "Value": "a"}]}],
    )["ImageId"]
    did = ec2.register_image(Name="my-disk", ImageLocation=str(files["disk"]))["ImageId"]
    assert kid.startswith("ami-") and len(kid) == 21 and kid != did

    (k,) = ec2.describe_images(ImageIds=[kid])["Images"]
    assert (k["Name"], k["State"], k["Architecture"], k["Public"]) == (
        "my-kernel", "available", "x86_64", False)
    assert k["ImageLocation"] == str(files["kernel"]) and k["Tags"] == [
        {"Key": "team", "Value": "a"}]
    assert k["OwnerId"] == "000000000000" and k["CreationDate"].endswith("Z")

    def ids(**kw: Any) -> set[str]:
        return {i["ImageId"] for i in ec2.describe_images(**kw)["Images"]}

    everything = ids()
    assert {kid, did, MICROVM_IMAGE_ID} <= everything  # the built-ins stay
    assert ids(Filters=[{"Name": "name", "Values": ["my-*"]}]) == {kid, did}
    assert ids(Filters=[{"Name": "tag:team", "Values": ["a"]}]) == {kid}
    assert ids(Filters=[{"Name": "is-public", "Values": ["false"]}]) == {kid, did}
    assert MICROVM_IMAGE_ID in ids(Filters=[{"Name": "is-public", "Values": ["true"]}])
    assert ids(Filters=[{"Name": "image-id", "Values": [did]},
                        {"Name": "state", "Values": ["available"]},
                        {"Name": "architecture", "Values": ["x86_64"]}]) == {did}
    assert ids(Owners=["self"]) == everything
    assert ids(Owners=["123456789012"]) == set()
    assert ids(Filters=[{"Name": "owner-id", "Values": ["000000000000"]}]) == everything

    # Another gateway on the same bus sees both, and can deregister them.
    gw, other = _second_gateway(icluster)
    try:
        wait_until("the second gateway sees the images", lambda: {kid, did} <= {
            i["ImageId"] for i in other.describe_images()["Images"]}, 10, 0.1)
        fails("InvalidAMIName.Duplicate", other.register_image, Name="my-disk",
              ImageLocation=str(files["disk"]))
        other.deregister_image(ImageId=did)
    finally:
        icluster.run(gw.stop())
    wait_until("the deregistration reaches this gateway", lambda: did not in ids(), 10, 0.1)
    fails("InvalidAMIID.NotFound", ec2.describe_images, ImageIds=[did])
    fails("InvalidAMIID.NotFound", ec2.deregister_image, ImageId=did)
    fails("InvalidAMIID.NotFound", ec2.run_instances, ImageId=did, InstanceType="t3.nano",
          MinCount=1, MaxCount=1)
    # The name is free again once its image is gone.
    again = ec2.register_image(Name="my-disk", ImageLocation=str(files["disk"]))["ImageId"]
    ec2.deregister_image(ImageId=again)
    ec2.deregister_image(ImageId=kid)


def test_bad_registrations_are_refused_and_leave_nothing(icluster: ThreadedCluster,
                                                         files: dict[str, Path]) -> None:
    ec2 = icluster.client()
    before = ec2.describe_images()["Images"]
    disk = str(files["disk"])
    fails("InvalidParameterValue", ec2.register_image, Name="gone",  # no such file
          ImageLocation=str(files["disk"].parent / "missing.raw"))
    fails("InvalidParameterValue", ec2.register_image, Name="rel",  # not absolute
          ImageLocation="images/disk.qcow2")
    fails("InvalidParameterValue", ec2.register_image, Name="dots",
          ImageLocation=str(files["disk"].parent / ".." / "disk.qcow2"))
    fails("InvalidParameterValue", ec2.register_image, Name="text",  # not a kernel
          KernelId=str(files["text"]))
    fails("InvalidParameterValue", ec2.register_image, Name="arm",
          ImageLocation=disk, Architecture="arm64")
    fails("InvalidParameterValue", ec2.register_image, Name="both", ImageLocation=disk,
          KernelId=str(files["kernel"]))
    fails("MissingParameter", ec2.register_image, Name="nothing")
    fails("InvalidAMIName.Malformed", ec2.register_image, Name="x" * 129, ImageLocation=disk)
    fails("InvalidAMIName.Malformed", ec2.register_image, Name="a|b", ImageLocation=disk)
    fails("InvalidAMIName.Duplicate", ec2.register_image, Name="roost-microvm",
          ImageLocation=disk)
    fails("DryRunOperation", ec2.register_image, Name="dry", ImageLocation=disk, DryRun=True)
    fails("InvalidAMIID.Malformed", ec2.describe_images, ImageIds=["ami-xyz"])
    fails("InvalidAMIID.Malformed", ec2.deregister_image, ImageId="i-0123456789abcdef0")
    fails("InvalidAMIID.NotFound", ec2.deregister_image, ImageId="ami-0123456789abcdef0")
    fails("OperationNotPermitted", ec2.deregister_image, ImageId=MICROVM_IMAGE_ID)
    fails("InvalidAMIID.Malformed", ec2.run_instances, ImageId="ami-nope",
          InstanceType="t3.nano", MinCount=1, MaxCount=1)
    assert ec2.describe_images()["Images"] == before


def test_an_image_no_node_can_boot_is_refused_at_once(icluster: ThreadedCluster,
                                                      files: dict[str, Path]) -> None:
    ec2 = icluster.client()
    iid = ec2.register_image(Name="needs-a-vm", KernelId=str(files["kernel"]))["ImageId"]
    try:
        before = icluster.allocations()
        started = time.monotonic()
        fails("Unsupported", ec2.run_instances, ImageId=iid, InstanceType="t3.nano",
              MinCount=1, MaxCount=1)
        # Refused by the only node, at once: not retried until the launch deadline.
        assert time.monotonic() - started < 5.0
        with pytest.raises(Exception, match="--driver vm"):
            ec2.run_instances(ImageId=iid, InstanceType="t3.nano", MinCount=1, MaxCount=1)
        assert icluster.allocations() == before
        running = [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
                   if i["ImageId"] == iid]
        assert running == []
    finally:
        ec2.deregister_image(ImageId=iid)


def test_the_aws_cli_registers_and_describes(icluster: ThreadedCluster,
                                             files: dict[str, Path]) -> None:
    made = aws_cli(icluster, "ec2", "register-image", "--name", "cli-disk",
                   "--image-location", str(files["disk"]))
    found = aws_cli(icluster, "ec2", "describe-images", "--owners", "self",
                    "--filters", "Name=name,Values=cli-disk")
    assert [i["ImageId"] for i in found["Images"]] == [made["ImageId"]]
    aws_cli(icluster, "ec2", "deregister-image", "--image-id", made["ImageId"])
    refused = aws_cli(icluster, "ec2", "deregister-image", "--image-id", made["ImageId"],
                      check=False)
    assert "InvalidAMIID.NotFound" in refused["stderr"]
