"""EBS volumes through boto3: launch mappings beyond the root, CreateVolume,
AttachVolume, DetachVolume, DeleteVolume, DescribeVolumes, what termination keeps, and
each error code these actions answer. Also: a launch's key pair reaches the node's
record, which IMDS serves from, and the instance attributes recorded beside the volumes
(SourceDestCheck, EbsOptimized, HibernationOptions, credit specifications)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from roost.node.imds_tree import find, instance_tree
from roost.node.metadata import metadata_for
from tests.e2e.conftest import IMAGE, ThreadedCluster
from tests.polling import wait_until


def _code(call: Callable[..., Any], **kw: Any) -> str:
    with pytest.raises(ClientError) as exc:
        call(**kw)
    return str(exc.value.response["Error"]["Code"])


def _launch(ec2: Any, **kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = ec2.run_instances(ImageId=IMAGE, InstanceType="t3.micro",
                                            MinCount=1, MaxCount=1, **kw)["Instances"][0]
    return out


def _volumes(ec2: Any, **kw: Any) -> dict[str, dict[str, Any]]:
    return {v["VolumeId"]: v for v in ec2.describe_volumes(**kw)["Volumes"]}


def test_launch_mappings_are_volumes_and_termination_keeps_what_it_should(ec2: Any) -> None:
    inst = _launch(ec2, BlockDeviceMappings=[
        {"DeviceName": "/dev/sdb", "Ebs": {"VolumeSize": 20, "VolumeType": "gp3",
                                           "DeleteOnTermination": False}},
        {"DeviceName": "/dev/sdc", "Ebs": {"VolumeSize": 5}},
    ], TagSpecifications=[{"ResourceType": "volume", "Tags": [{"Key": "k", "Value": "v"}]}])
    iid = inst["InstanceId"]
    devices = {m["DeviceName"]: m["Ebs"] for m in inst["BlockDeviceMappings"]}
    assert set(devices) == {"/dev/xvda", "/dev/sdb", "/dev/sdc"}
    assert devices["/dev/sdb"]["DeleteOnTermination"] is False
    mine = _volumes(ec2, Filters=[{"Name": "attachment.instance-id", "Values": [iid]}])
    kept = devices["/dev/sdb"]["VolumeId"]
    assert mine[kept]["Size"] == 20 and mine[kept]["VolumeType"] == "gp3"
    assert mine[kept]["Iops"] == 3000 and mine[kept]["State"] == "in-use"
    assert all(v["Tags"] == [{"Key": "k", "Value": "v"}] for v in mine.values())

    ec2.terminate_instances(InstanceIds=[iid])
    wait_until("only the kept volume outlives the instance",
               lambda: set(mine) & set(_volumes(ec2)) == {kept})
    after = _volumes(ec2, VolumeIds=[kept])[kept]
    assert after["State"] == "available" and after["Attachments"] == []
    ec2.delete_volume(VolumeId=kept)
    assert kept not in _volumes(ec2)
    assert _code(ec2.describe_volumes, VolumeIds=[kept]) == "InvalidVolume.NotFound"


def test_create_attach_detach_delete(ec2: Any) -> None:
    inst = _launch(ec2)
    iid, zone = inst["InstanceId"], inst["Placement"]["AvailabilityZone"]
    vol = ec2.create_volume(Size=10, AvailabilityZone=zone, TagSpecifications=[
        {"ResourceType": "volume", "Tags": [{"Key": "Name", "Value": "data"}]}])
    vid = vol["VolumeId"]
    assert vol["State"] == "available" and vol["Size"] == 10
    att = ec2.attach_volume(VolumeId=vid, InstanceId=iid, Device="/dev/sdf")
    assert (att["State"], att["Device"], att["InstanceId"]) == ("attaching", "/dev/sdf", iid)
    mapping = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0][
        "BlockDeviceMappings"]
    assert [m["DeviceName"] for m in mapping] == ["/dev/xvda", "/dev/sdf"]
    attr = ec2.describe_instance_attribute(InstanceId=iid, Attribute="blockDeviceMapping")
    assert [m["DeviceName"] for m in attr["BlockDeviceMappings"]] == ["/dev/xvda", "/dev/sdf"]
    assert _volumes(ec2, VolumeIds=[vid])[vid]["Attachments"][0]["State"] == "attached"
    assert ec2.detach_volume(VolumeId=vid)["State"] == "detaching"
    assert _volumes(ec2, VolumeIds=[vid])[vid]["State"] == "available"
    ec2.delete_volume(VolumeId=vid)
    assert vid not in _volumes(ec2)
    ec2.terminate_instances(InstanceIds=[iid])


def test_volume_errors(ec2: Any) -> None:
    inst = _launch(ec2)
    iid, zone = inst["InstanceId"], inst["Placement"]["AvailabilityZone"]
    root = inst["BlockDeviceMappings"][0]["Ebs"]["VolumeId"]
    vid = ec2.create_volume(Size=1, AvailabilityZone=zone)["VolumeId"]
    assert _code(ec2.create_volume, Size=1, AvailabilityZone="nowhere-1z") == \
        "InvalidZone.NotFound"
    assert _code(ec2.create_volume, AvailabilityZone=zone) == "MissingParameter"
    assert _code(ec2.create_volume, Size=0, AvailabilityZone=zone) == "InvalidParameterValue"
    assert _code(ec2.create_volume, Size=1, AvailabilityZone=zone,
                 VolumeType="floppy") == "InvalidParameterValue"
    assert _code(ec2.attach_volume, VolumeId="vol-0000000000000000a", InstanceId=iid,
                 Device="/dev/sdf") == "InvalidVolume.NotFound"
    assert _code(ec2.attach_volume, VolumeId="volume-1", InstanceId=iid,
                 Device="/dev/sdf") == "InvalidVolumeID.Malformed"
    assert _code(ec2.attach_volume, VolumeId=vid, InstanceId="i-0000000000000000a",
                 Device="/dev/sdf") == "InvalidInstanceID.NotFound"
    assert _code(ec2.attach_volume, VolumeId=vid, InstanceId=iid,
                 Device="floppy") == "InvalidParameterValue"
    assert _code(ec2.attach_volume, VolumeId=vid, InstanceId=iid,
                 Device="/dev/xvda") == "InvalidParameterValue"  # the root's device
    assert _code(ec2.detach_volume, VolumeId=vid) == "IncorrectState"
    ec2.attach_volume(VolumeId=vid, InstanceId=iid, Device="/dev/sdg")
    assert _code(ec2.attach_volume, VolumeId=vid, InstanceId=iid,
                 Device="/dev/sdh") == "VolumeInUse"
    assert _code(ec2.delete_volume, VolumeId=vid) == "VolumeInUse"
    assert _code(ec2.detach_volume, VolumeId=vid, Device="/dev/sdz") == \
        "InvalidAttachment.NotFound"
    assert _code(ec2.detach_volume, VolumeId=root) == "OperationNotPermitted"
    ec2.detach_volume(VolumeId=vid, InstanceId=iid, Device="/dev/sdg")
    ec2.delete_volume(VolumeId=vid)
    assert _code(ec2.delete_volume, VolumeId=vid) == "InvalidVolume.NotFound"
    ec2.terminate_instances(InstanceIds=[iid])


def test_zone_mismatch(tmp_path_factory: pytest.TempPathFactory) -> None:
    from tests.e2e.conftest import make_cluster
    c = make_cluster(tmp_path_factory.mktemp("zones"), nodes=2, zones=["roost-1a", "roost-1b"])
    try:
        ec2 = c.client()
        inst = _launch(ec2, Placement={"AvailabilityZone": "roost-1a"})
        vid = ec2.create_volume(Size=1, AvailabilityZone="roost-1b")["VolumeId"]
        assert _code(ec2.attach_volume, VolumeId=vid, InstanceId=inst["InstanceId"],
                     Device="/dev/sdf") == "InvalidVolume.ZoneMismatch"
    finally:
        c.stop()


def test_launch_mapping_errors(ec2: Any) -> None:
    def mapping(*m: dict[str, Any]) -> str:
        return _code(ec2.run_instances, ImageId=IMAGE, InstanceType="t3.micro", MinCount=1,
                     MaxCount=1, BlockDeviceMappings=list(m))
    assert mapping({"DeviceName": "/dev/sdb"}) == "MissingParameter"
    assert mapping({"DeviceName": "/dev/sdb", "Ebs": {"VolumeType": "gp3"}}) == \
        "MissingParameter"
    assert mapping({"DeviceName": "/dev/sdb", "NoDevice": "yes"}) == "InvalidRequest"
    assert mapping({"DeviceName": "floppy", "Ebs": {"VolumeSize": 1}}) == \
        "InvalidBlockDeviceMapping"
    assert mapping({"DeviceName": "/dev/sdb", "Ebs": {"VolumeSize": 1,
                                                      "VolumeType": "sc1"}}) == \
        "InvalidParameterValue"


def test_key_pair_reaches_the_record_and_imds(cluster: ThreadedCluster, ec2: Any) -> None:
    ec2.create_key_pair(KeyName="imds-key", KeyType="ed25519")
    try:
        iid = _launch(ec2, KeyName="imds-key")["InstanceId"]
        wait_until("the record mirrored", lambda: cluster.record(iid) is not None)
        rec = cluster.record(iid)
        assert rec is not None and rec.net.public_key.startswith("ssh-ed25519 ")
        tree = instance_tree(metadata_for(rec, None))
        listing = find(tree, "latest/meta-data/public-keys/")
        key = find(tree, "latest/meta-data/public-keys/0/openssh-key")
        assert listing is not None and listing.body == b"0=imds-key"
        assert key is not None and key.body.decode().startswith("ssh-ed25519 AAAAC3")
        ec2.terminate_instances(InstanceIds=[iid])
    finally:
        ec2.delete_key_pair(KeyName="imds-key")


def test_recorded_attributes_and_credit_specifications(ec2: Any) -> None:
    """SourceDestCheck, EbsOptimized and HibernationOptions are recorded per instance
    (and read back by DescribeInstances, DescribeInstanceAttribute and filters)."""
    iid = _launch(ec2, EbsOptimized=True, HibernationOptions={"Configured": True})["InstanceId"]
    other = ec2.run_instances(ImageId=IMAGE, InstanceType="m7i.large", MinCount=1,
                              MaxCount=1)["Instances"][0]["InstanceId"]
    ec2.modify_instance_attribute(InstanceId=iid, SourceDestCheck={"Value": False})
    ec2.modify_instance_attribute(InstanceId=iid, EbsOptimized={"Value": False})
    inst = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
    assert (inst["SourceDestCheck"], inst["EbsOptimized"]) == (False, False)
    assert inst["HibernationOptions"] == {"Configured": True}
    assert inst["NetworkInterfaces"][0]["SourceDestCheck"] is False
    attr = ec2.describe_instance_attribute(InstanceId=iid, Attribute="sourceDestCheck")
    assert attr["SourceDestCheck"] == {"Value": False}
    found = ec2.describe_instances(Filters=[{"Name": "source-dest-check", "Values": ["false"]}])
    assert [i["InstanceId"] for r in found["Reservations"] for i in r["Instances"]] == [iid]
    assert _code(ec2.modify_instance_attribute, InstanceId=iid,
                 Attribute="sourceDestCheck", Value="maybe") == "InvalidParameterValue"
    assert _code(ec2.describe_instance_attribute, InstanceId=iid,
                 Attribute="iNsTaNcEtYpE") == "InvalidParameterValue"
    credits = ec2.describe_instance_credit_specifications(InstanceIds=[iid, other])
    assert {c["InstanceId"]: c["CpuCredits"] for c in credits["InstanceCreditSpecifications"]} \
        == {iid: "unlimited", other: "standard"}
    assert _code(ec2.terminate_instances, InstanceIds=[]) == "InvalidParameterCombination"
    ec2.terminate_instances(InstanceIds=[iid, other])
