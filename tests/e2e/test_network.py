"""boto3 against a live cluster: VPCs, subnets, security groups, key pairs, addresses and
root volumes, each action's success path and each error code it answers."""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from botocore.exceptions import ClientError

from roost.gateway.keys import new_key_pair
from tests.e2e.conftest import IMAGE, ThreadedCluster, make_cluster
from tests.e2e.test_boto3 import _without_validation, code, run, wait_state

ED25519_PUB = new_key_pair("ed25519").public_key


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedCluster]:
    c = make_cluster(tmp_path_factory.mktemp("net"), nodes=2)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def ec2(cluster: ThreadedCluster) -> Any:
    return cluster.client()


def fails(expected: str, call: Any, *args: Any, **kw: Any) -> None:
    with pytest.raises(ClientError) as exc:
        call(*args, **kw)
    assert code(exc) == expected, exc.value.response["Error"]


def test_default_vpc_subnet_and_group(ec2: Any) -> None:
    (vpc,) = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
    assert vpc["CidrBlock"] == "172.31.0.0/16" and vpc["IsDefault"] and vpc["State"] == "available"
    subnets = ec2.describe_subnets(
        Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
    assert [(s["AvailabilityZone"], s["CidrBlock"]) for s in subnets] == [
        ("roost-1a", "172.31.0.0/20")]
    assert subnets[0]["VpcId"] == vpc["VpcId"] and subnets[0]["AvailableIpAddressCount"] > 4000
    (group,) = ec2.describe_security_groups(
        Filters=[{"Name": "vpc-id", "Values": [vpc["VpcId"]]},
                 {"Name": "group-name", "Values": ["default"]}])["SecurityGroups"]
    assert group["IpPermissionsEgress"][0]["IpRanges"] == [{"CidrIp": "0.0.0.0/0"}]
    same = ec2.describe_security_groups(GroupNames=["default"])["SecurityGroups"]
    assert same[0]["GroupId"] == group["GroupId"]
    fails("InvalidVpcID.NotFound", ec2.describe_vpcs, VpcIds=["vpc-0123456789abcdef0"])
    fails("InvalidSubnetID.NotFound", ec2.describe_subnets,
          SubnetIds=["subnet-0123456789abcdef0"])
    fails("InvalidGroup.NotFound", ec2.describe_security_groups,
          GroupIds=["sg-0123456789abcdef0"])
    fails("InvalidParameterValue", ec2.describe_vpcs, Filters=[{"Name": "nope", "Values": ["x"]}])
    fails("DependencyViolation", ec2.delete_vpc, VpcId=vpc["VpcId"])  # its default subnets
    fails("CannotDelete", ec2.delete_security_group, GroupId=group["GroupId"])


def test_instance_network_identity_and_root_volume(ec2: Any) -> None:
    (inst,) = run(ec2)
    iid = inst["InstanceId"]
    subnet = ec2.describe_subnets(SubnetIds=[inst["SubnetId"]])["Subnets"][0]
    assert ipaddress.ip_address(inst["PrivateIpAddress"]) in ipaddress.ip_network(
        subnet["CidrBlock"])
    assert inst["VpcId"] == subnet["VpcId"]
    assert inst["PrivateDnsName"].startswith("ip-" + inst["PrivateIpAddress"].replace(".", "-"))
    (nic,) = inst["NetworkInterfaces"]
    assert nic["PrivateIpAddress"] == inst["PrivateIpAddress"] and nic["Attachment"][
        "DeviceIndex"] == 0
    assert [g["GroupName"] for g in inst["SecurityGroups"]] == ["default"]
    assert "Tags" not in inst  # EC2 leaves tagSet out for an untagged instance
    (bdm,) = inst["BlockDeviceMappings"]
    assert bdm["DeviceName"] == inst["RootDeviceName"] == "/dev/xvda"
    (vol,) = ec2.describe_volumes(VolumeIds=[bdm["Ebs"]["VolumeId"]])["Volumes"]
    assert (vol["Size"], vol["VolumeType"], vol["Attachments"][0]["InstanceId"]) == (
        8, "gp2", iid)
    found = ec2.describe_volumes(
        Filters=[{"Name": "attachment.instance-id", "Values": [iid]}])["Volumes"]
    assert [v["VolumeId"] for v in found] == [vol["VolumeId"]]
    for name, value in (("vpc-id", inst["VpcId"]), ("subnet-id", inst["SubnetId"]),
                        ("private-dns-name", inst["PrivateDnsName"]),
                        ("instance.group-name", "default"),
                        ("network-interface.addresses.private-ip-address",
                         inst["PrivateIpAddress"]),
                        ("block-device-mapping.volume-id", vol["VolumeId"]),
                        ("architecture", "x86_64"), ("root-device-type", "ebs"),
                        ("tenancy", "default")):
        got = ec2.describe_instances(Filters=[{"Name": name, "Values": [value]}])
        ids = [i["InstanceId"] for r in got["Reservations"] for i in r["Instances"]]
        assert iid in ids, name
    ip = inst["PrivateIpAddress"]
    fails("InvalidIPAddress.InUse", run, ec2, SubnetId=inst["SubnetId"], PrivateIpAddress=ip)
    ec2.terminate_instances(InstanceIds=[iid])
    wait_state(ec2, iid, "terminated")
    fails("InvalidVolume.NotFound", ec2.describe_volumes, VolumeIds=[vol["VolumeId"]])
    (again,) = _eventually_run(ec2, SubnetId=inst["SubnetId"], PrivateIpAddress=ip)
    assert again["PrivateIpAddress"] == ip  # the address came back
    ec2.terminate_instances(InstanceIds=[again["InstanceId"]])


def _eventually_run(ec2: Any, **kw: Any) -> list[dict[str, Any]]:
    import time
    deadline = time.monotonic() + 10
    while True:
        try:
            return run(ec2, **kw)
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "InvalidIPAddress.InUse" or \
                    time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_addresses_are_distinct(ec2: Any) -> None:
    insts = run(ec2, 6)
    ips = [i["PrivateIpAddress"] for i in insts]
    assert len(set(ips)) == 6
    ec2.terminate_instances(InstanceIds=[i["InstanceId"] for i in insts])


def test_addresses_of_terminated_instances_are_claimed_again(ec2: Any) -> None:
    """A /28 holds 11 usable addresses: a launch of 12 takes none, 11 fit, a 12th is
    refused; their instances terminated, the same 11 are claimed again (over the
    deletes that freed them)."""
    vpc = ec2.create_vpc(CidrBlock="10.41.0.0/16")["Vpc"]["VpcId"]
    sub = ec2.create_subnet(VpcId=vpc, CidrBlock="10.41.0.0/28")["Subnet"]["SubnetId"]
    # 12 at once do not fit: the 11 claimed on the way are given back at once.
    fails("InsufficientFreeAddressesInSubnet", run, ec2, 12, itype="m1.small", SubnetId=sub)
    first = run(ec2, 11, itype="m1.small", SubnetId=sub)  # one vCPU each: all fit
    fails("InsufficientFreeAddressesInSubnet", run, ec2, itype="m1.small", SubnetId=sub)
    ec2.terminate_instances(InstanceIds=[i["InstanceId"] for i in first])
    for inst in first:
        wait_state(ec2, inst["InstanceId"], "terminated", timeout=30)
    deadline = time.monotonic() + 30
    while True:  # each gateway gives an address back once it sees the instance end
        try:
            again = run(ec2, 11, itype="m1.small", SubnetId=sub)
            break
        except ClientError as exc:
            assert exc.response["Error"]["Code"] == "InsufficientFreeAddressesInSubnet"
            assert time.monotonic() < deadline, "the addresses never came back"
            time.sleep(0.2)
    assert sorted(i["PrivateIpAddress"] for i in again) == sorted(
        i["PrivateIpAddress"] for i in first)
    ec2.terminate_instances(InstanceIds=[i["InstanceId"] for i in again])
    for inst in again:
        wait_state(ec2, inst["InstanceId"], "terminated", timeout=30)
    ec2.delete_subnet(SubnetId=sub)
    ec2.delete_vpc(VpcId=vpc)


def test_vpc_and_subnet_lifecycle(ec2: Any) -> None:
    fails("InvalidVpc.Range", ec2.create_vpc, CidrBlock="10.0.0.0/8")
    fails("InvalidVpc.Range", ec2.create_vpc, CidrBlock="10.0.0.1/16")
    vpc = ec2.create_vpc(CidrBlock="10.7.0.0/16", TagSpecifications=[
        {"ResourceType": "vpc", "Tags": [{"Key": "Name", "Value": "lab"}]}])["Vpc"]
    vid = vpc["VpcId"]
    assert vpc["CidrBlock"] == "10.7.0.0/16" and not vpc["IsDefault"]
    found = ec2.describe_vpcs(Filters=[{"Name": "tag:Name", "Values": ["lab"]}])["Vpcs"]
    assert [v["VpcId"] for v in found] == [vid]
    groups = ec2.describe_security_groups(
        Filters=[{"Name": "vpc-id", "Values": [vid]}])["SecurityGroups"]
    assert [g["GroupName"] for g in groups] == ["default"]
    fails("InvalidSubnet.Range", ec2.create_subnet, VpcId=vid, CidrBlock="10.8.0.0/24")
    fails("InvalidVpcID.NotFound", ec2.create_subnet, VpcId="vpc-0123456789abcdef0",
          CidrBlock="10.7.0.0/24")
    fails("InvalidVpcID.Malformed", ec2.create_subnet, VpcId="nope", CidrBlock="10.7.0.0/24")
    fails("InvalidParameterValue", ec2.create_subnet, VpcId=vid, CidrBlock="10.7.0.0/24",
          AvailabilityZone="roost-1z")
    subnet = ec2.create_subnet(VpcId=vid, CidrBlock="10.7.1.0/24")["Subnet"]
    sid = subnet["SubnetId"]
    assert subnet["AvailabilityZone"] == "roost-1a" and subnet["AvailableIpAddressCount"] == 251
    fails("InvalidSubnet.Conflict", ec2.create_subnet, VpcId=vid, CidrBlock="10.7.1.128/25")
    listed = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vid]}])["Subnets"]
    assert [s["SubnetId"] for s in listed] == [sid]

    (inst,) = run(ec2, SubnetId=sid, PrivateIpAddress="10.7.1.10")
    assert (inst["PrivateIpAddress"], inst["VpcId"], inst["SubnetId"]) == ("10.7.1.10", vid, sid)
    (other,) = run(ec2, SubnetId=sid)
    assert other["PrivateIpAddress"] == "10.7.1.4"  # the lowest after EC2's reserved four
    fails("InvalidParameterValue", run, ec2, SubnetId=sid, PrivateIpAddress="10.7.1.2")
    fails("InvalidParameterCombination", run, ec2, 2, SubnetId=sid, PrivateIpAddress="10.7.1.20")
    fails("InvalidSubnetID.NotFound", run, ec2, SubnetId="subnet-0123456789abcdef0")
    fails("InvalidSubnetID.Malformed", run, ec2, SubnetId="subnet-zz")
    fails("InvalidParameterValue", run, ec2, SubnetId=sid,
          Placement={"AvailabilityZone": "roost-1b"})
    fails("DependencyViolation", ec2.delete_subnet, SubnetId=sid)
    fails("DependencyViolation", ec2.delete_vpc, VpcId=vid)
    ids = [inst["InstanceId"], other["InstanceId"]]
    ec2.terminate_instances(InstanceIds=ids)
    for iid in ids:
        wait_state(ec2, iid, "terminated")
    ec2.delete_subnet(SubnetId=sid)
    fails("InvalidSubnetID.NotFound", ec2.delete_subnet, SubnetId=sid)
    ec2.delete_vpc(VpcId=vid)
    fails("InvalidVpcID.NotFound", ec2.delete_vpc, VpcId=vid)
    fails("InvalidVpcID.NotFound", ec2.describe_vpcs, VpcIds=[vid])


def test_security_groups(ec2: Any) -> None:
    gid = ec2.create_security_group(GroupName="web", Description="web servers")["GroupId"]
    fails("InvalidGroup.Duplicate", ec2.create_security_group, GroupName="web",
          Description="again")
    fails("InvalidGroup.Reserved", ec2.create_security_group, GroupName="default",
          Description="no")
    fails("InvalidVpcID.NotFound", ec2.create_security_group, GroupName="x", Description="x",
          VpcId="vpc-0123456789abcdef0")
    ssh = [{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
            "IpRanges": [{"CidrIp": "0.0.0.0/0", "Description": "ssh"}]}]
    out = ec2.authorize_security_group_ingress(GroupId=gid, IpPermissions=ssh)
    assert out["Return"] and out["SecurityGroupRules"][0]["FromPort"] == 22
    fails("InvalidPermission.Duplicate", ec2.authorize_security_group_ingress, GroupId=gid,
          IpPermissions=ssh)
    fails("InvalidGroup.NotFound", ec2.authorize_security_group_ingress,
          GroupId="sg-0123456789abcdef0", IpPermissions=ssh)
    fails("InvalidGroupId.Malformed", ec2.authorize_security_group_ingress, GroupId="sg-x",
          IpPermissions=ssh)
    fails("InvalidPermission.Malformed", ec2.authorize_security_group_ingress, GroupId=gid,
          IpPermissions=[{"IpProtocol": "bogus", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}])
    fails("InvalidParameterValue", ec2.authorize_security_group_ingress, GroupId=gid,
          IpPermissions=[{"IpProtocol": "tcp", "FromPort": 1, "ToPort": 70000,
                          "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}])
    (g,) = ec2.describe_security_groups(
        Filters=[{"Name": "ip-permission.from-port", "Values": ["22"]}])["SecurityGroups"]
    assert g["GroupId"] == gid and g["IpPermissions"][0]["IpRanges"][0]["Description"] == "ssh"
    ec2.revoke_security_group_egress(GroupId=gid, IpPermissions=[
        {"IpProtocol": "-1", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}])
    ec2.authorize_security_group_egress(GroupId=gid, IpPermissions=[
        {"IpProtocol": "tcp", "FromPort": 443, "ToPort": 443,
         "IpRanges": [{"CidrIp": "10.0.0.0/8"}]}])
    g = ec2.describe_security_groups(GroupIds=[gid])["SecurityGroups"][0]
    assert [(p["IpProtocol"], p.get("FromPort")) for p in g["IpPermissionsEgress"]] == [
        ("tcp", 443)]

    (inst,) = run(ec2, SecurityGroupIds=[gid])
    assert [s["GroupId"] for s in inst["SecurityGroups"]] == [gid]
    (named,) = run(ec2, SecurityGroups=["web"])
    assert [s["GroupName"] for s in named["SecurityGroups"]] == ["web"]
    got = ec2.describe_instances(Filters=[{"Name": "instance.group-id", "Values": [gid]}])
    assert {i["InstanceId"] for r in got["Reservations"] for i in r["Instances"]} == {
        inst["InstanceId"], named["InstanceId"]}
    fails("InvalidGroup.NotFound", run, ec2, SecurityGroupIds=["sg-0123456789abcdef0"])
    fails("InvalidGroup.NotFound", run, ec2, SecurityGroups=["nope"])
    fails("DependencyViolation", ec2.delete_security_group, GroupId=gid)
    ids = [inst["InstanceId"], named["InstanceId"]]
    ec2.terminate_instances(InstanceIds=ids)
    for iid in ids:
        wait_state(ec2, iid, "terminated")

    ec2.revoke_security_group_ingress(GroupId=gid, IpPermissions=ssh)
    fails("InvalidPermission.NotFound", ec2.revoke_security_group_ingress, GroupId=gid,
          IpPermissions=ssh)
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    other = ec2.create_security_group(GroupName="web", Description="same name, other VPC",
                                      VpcId=vpc)["GroupId"]
    fails("InvalidParameter", run, ec2, SecurityGroupIds=[other])
    ec2.delete_security_group(GroupId=other)
    ec2.delete_vpc(VpcId=vpc)
    ec2.delete_security_group(GroupName="web")
    fails("InvalidGroup.NotFound", ec2.delete_security_group, GroupId=gid)


def test_key_pairs(ec2: Any) -> None:
    made = ec2.create_key_pair(KeyName="ops")
    assert made["KeyMaterial"].startswith("-----BEGIN RSA PRIVATE KEY-----")
    assert made["KeyFingerprint"].count(":") == 19 and made["KeyPairId"].startswith("key-")
    ed = ec2.create_key_pair(KeyName="ops-ed", KeyType="ed25519")
    assert "OPENSSH PRIVATE KEY" in ed["KeyMaterial"]
    fails("InvalidKeyPair.Duplicate", ec2.create_key_pair, KeyName="ops")
    fails("InvalidParameterValue", ec2.create_key_pair, KeyName="x", KeyType="dsa")
    imported = ec2.import_key_pair(KeyName="mine", PublicKeyMaterial=ED25519_PUB.encode())
    assert imported["KeyFingerprint"].endswith("=")
    fails("InvalidKey.Format", ec2.import_key_pair, KeyName="bad", PublicKeyMaterial=b"nope")
    fails("InvalidKeyPair.Duplicate", ec2.import_key_pair, KeyName="mine",
          PublicKeyMaterial=ED25519_PUB.encode())
    listed = ec2.describe_key_pairs(KeyNames=["mine"], IncludePublicKey=True)["KeyPairs"]
    assert listed[0]["PublicKey"] == ED25519_PUB and listed[0]["KeyType"] == "ed25519"
    names = {k["KeyName"] for k in ec2.describe_key_pairs()["KeyPairs"]}
    assert {"ops", "ops-ed", "mine"} <= names
    fails("InvalidKeyPair.NotFound", ec2.describe_key_pairs, KeyNames=["nope"])
    (inst,) = run(ec2, KeyName="ops")
    assert inst["KeyName"] == "ops"
    got = ec2.describe_instances(Filters=[{"Name": "key-name", "Values": ["ops"]}])
    assert [i["InstanceId"] for r in got["Reservations"] for i in r["Instances"]] == [
        inst["InstanceId"]]
    fails("InvalidKeyPair.NotFound", run, ec2, KeyName="nope")
    ec2.terminate_instances(InstanceIds=[inst["InstanceId"]])
    for name in ("ops", "ops-ed", "mine"):
        ec2.delete_key_pair(KeyName=name)
    ec2.delete_key_pair(KeyName="ops")  # deleting what is gone succeeds, as on EC2
    fails("InvalidKeyPair.NotFound", ec2.describe_key_pairs, KeyNames=["ops"])


def test_block_device_mappings(ec2: Any) -> None:
    root = [{"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 20, "VolumeType": "gp3",
                                                "DeleteOnTermination": True}}]
    (inst,) = run(ec2, BlockDeviceMappings=root)
    vol = ec2.describe_volumes(
        Filters=[{"Name": "attachment.instance-id", "Values": [inst["InstanceId"]]}])["Volumes"]
    assert (vol[0]["Size"], vol[0]["VolumeType"], vol[0]["Iops"]) == (20, "gp3", 3000)
    ec2.terminate_instances(InstanceIds=[inst["InstanceId"]])
    fails("InvalidBlockDeviceMapping", run, ec2,
          BlockDeviceMappings=[{"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 4}}])
    fails("InvalidParameterValue", run, ec2,
          BlockDeviceMappings=[{"DeviceName": "/dev/xvda", "Ebs": {"VolumeType": "fast"}}])
    fails("InvalidBlockDeviceMapping", run, ec2,  # other devices: tests/e2e/test_volumes.py
          BlockDeviceMappings=[{"DeviceName": "floppy", "Ebs": {"VolumeSize": 10}}])
    fails("InvalidParameterCombination", run, ec2,
          BlockDeviceMappings=[{"DeviceName": "/dev/xvda", "Ebs": {"Iops": 500}}])


def test_dry_run_first_and_tag_limit(ec2: Any) -> None:
    fails("DryRunOperation", ec2.run_instances, ImageId="ami-nope", MinCount=1, MaxCount=1,
          DryRun=True)
    fails("DryRunOperation", ec2.create_vpc, CidrBlock="10.0.0.0/8", DryRun=True)
    tags = [{"ResourceType": "instance",
             "Tags": [{"Key": f"k{i}", "Value": "v"} for i in range(51)]}]
    fails("TagLimitExceeded", ec2.run_instances, ImageId=IMAGE, MinCount=1, MaxCount=1,
          TagSpecifications=tags)


def refused(expected: str, call: Any, *args: Any, **kw: Any) -> str:
    """The message of the error ``call`` answers, once its code is ``expected``."""
    with pytest.raises(ClientError) as exc:
        call(*args, **kw)
    assert code(exc) == expected, exc.value.response["Error"]
    return str(exc.value.response["Error"]["Message"])


def _tags(n: int, prefix: str = "k") -> list[dict[str, str]]:
    return [{"Key": f"{prefix}{i}", "Value": "v"} for i in range(n)]


def _held(ec2: Any, rid: str) -> dict[str, str]:
    rows = ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [rid]}],
                             MaxResults=1000)["Tags"]
    return {t["Key"]: t["Value"] for t in rows}


def test_tag_limit_counts_the_tags_a_resource_holds(ec2: Any) -> None:
    """50 per resource after the call, not per request: keys already there only
    overwrite, and a call one resource refuses changes none of the others."""
    (inst,) = run(ec2, TagSpecifications=[{"ResourceType": "instance", "Tags": _tags(40)}])
    iid = inst["InstanceId"]
    vpc = ec2.create_vpc(CidrBlock="10.14.0.0/16")["Vpc"]["VpcId"]
    spare = ec2.create_vpc(CidrBlock="10.15.0.0/16")["Vpc"]["VpcId"]
    ec2.create_tags(Resources=[iid], Tags=_tags(50))  # k0..k39 overwrite, 10 added
    ec2.create_tags(Resources=[vpc], Tags=_tags(50))
    for rid in (iid, vpc):
        message = refused("TagLimitExceeded", ec2.create_tags, Resources=[rid],
                          Tags=[{"Key": "one-more", "Value": "v"}])
        assert rid in message
        ec2.create_tags(Resources=[rid], Tags=[{"Key": "k7", "Value": "new"}])
        assert len(_held(ec2, rid)) == 50 and _held(ec2, rid)["k7"] == "new"
    refused("TagLimitExceeded", ec2.create_tags, Resources=[spare, vpc],
            Tags=[{"Key": "one-more", "Value": "v"}])
    assert _held(ec2, spare) == {}
    ec2.delete_tags(Resources=[vpc], Tags=[{"Key": "k0"}])
    ec2.create_tags(Resources=[vpc], Tags=[{"Key": "one-more", "Value": "v"}])
    assert len(_held(ec2, vpc)) == 50
    ec2.terminate_instances(InstanceIds=[iid])
    ec2.delete_vpc(VpcId=vpc)
    ec2.delete_vpc(VpcId=spare)


def _race(cluster: ThreadedCluster, rid: str, calls: int) -> list[str]:
    """``calls`` CreateTags of one new key each on ``rid``, from as many clients at once:
    the code each answered, sorted ("ok" for success)."""
    clients = [cluster.client() for _ in range(calls)]
    start = threading.Barrier(calls)

    def add(i: int) -> str:
        start.wait()
        try:
            clients[i].create_tags(Resources=[rid], Tags=[{"Key": f"race{i}", "Value": "v"}])
        except ClientError as exc:
            return str(exc.response["Error"]["Code"])
        return "ok"

    with ThreadPoolExecutor(calls) as pool:
        return sorted(pool.map(add, range(calls)))


def test_tag_limit_holds_when_calls_race(cluster: ThreadedCluster, ec2: Any) -> None:
    """Calls adding one key each to a resource with 45, all at once: five win and the
    resource holds 50 (each write is a compare-and-set that counts what it replaces)."""
    (inst,) = run(ec2, TagSpecifications=[{"ResourceType": "instance", "Tags": _tags(45)}])
    iid = inst["InstanceId"]
    vpc = ec2.create_vpc(CidrBlock="10.16.0.0/16",
                         TagSpecifications=[{"ResourceType": "vpc", "Tags": _tags(45)}])[
        "Vpc"]["VpcId"]
    for rid in (iid, vpc):
        outcomes = _race(cluster, rid, 12)
        assert outcomes == ["TagLimitExceeded"] * 7 + ["ok"] * 5, outcomes
        assert len(_held(ec2, rid)) == 50
    ec2.terminate_instances(InstanceIds=[iid])
    ec2.delete_vpc(VpcId=vpc)


@pytest.mark.parametrize(("bad", "shown"), [
    ("a\x00b", "a\\x00b"), ("tab\there", "tab\\x09here"), ("line\n", "line\\x0a"),
    ("\x1f", "\\x1f"), ("del\x7f", "del\\x7f"),
])
def test_control_characters_in_tags_are_refused(ec2: Any, bad: str, shown: str) -> None:
    """They came back as U+FFFD, or not at all, so the tag could never be named again
    to filter or delete it. Refused as a key or a value, wherever tags enter; the
    message names the key with its control characters escaped."""
    (inst,) = run(ec2)
    iid = inst["InstanceId"]
    for tag in ({"Key": bad, "Value": "v"}, {"Key": "k", "Value": bad}):
        message = refused("InvalidParameterValue", ec2.create_tags, Resources=[iid],
                          Tags=[tag])
        assert (shown if tag["Key"] == bad else "'k'") in message
        refused("InvalidParameterValue", run, ec2,
                TagSpecifications=[{"ResourceType": "instance", "Tags": [tag]}])
        refused("InvalidParameterValue", run, ec2,
                TagSpecifications=[{"ResourceType": "volume", "Tags": [tag]}])
        refused("InvalidParameterValue", ec2.create_vpc, CidrBlock="10.17.0.0/16",
                TagSpecifications=[{"ResourceType": "vpc", "Tags": [tag]}])
        refused("InvalidParameterValue", ec2.create_volume, Size=1,
                AvailabilityZone=inst["Placement"]["AvailabilityZone"],
                TagSpecifications=[{"ResourceType": "volume", "Tags": [tag]}])
        refused("InvalidParameterValue", ec2.create_launch_template,
                LaunchTemplateName="ctl", LaunchTemplateData={"TagSpecifications": [
                    {"ResourceType": "instance", "Tags": [tag]}]})
    assert _held(ec2, iid) == {}
    assert not ec2.describe_vpcs(Filters=[{"Name": "cidr", "Values": ["10.17.0.0/16"]}])[
        "Vpcs"]
    ec2.create_tags(Resources=[iid], Tags=[{"Key": "fine", "Value": "spaces + - = . _ : / @ é"}])
    ec2.delete_tags(Resources=[iid], Tags=[{"Key": bad}])  # naming one is harmless
    assert _held(ec2, iid) == {"fine": "spaces + - = . _ : / @ é"}
    ec2.terminate_instances(InstanceIds=[iid])


def _live(ec2: Any) -> int:
    found = ec2.describe_instances(Filters=[{"Name": "instance-state-name",
                                             "Values": ["pending", "running"]}])
    return sum(len(r["Instances"]) for r in found["Reservations"])


def test_run_instances_refuses_tag_types_it_does_not_tag(ec2: Any) -> None:
    """Entries for another type were dropped and the launch went ahead; EC2 refuses an
    unknown type, and roost refuses the types EC2 tags at launch but roost cannot keep
    (network interfaces, Spot requests). Volume tags go on every launch volume."""
    before = _live(ec2)
    tag = [{"Key": "k", "Value": "v"}]
    message = refused("InvalidParameterValue", run, ec2,
                      TagSpecifications=[{"ResourceType": "foo", "Tags": tag}])
    assert message == "'foo' is not a valid taggable resource type for this operation."
    refused("InvalidParameterValue", run, ec2,
            TagSpecifications=[{"ResourceType": "vpc", "Tags": tag}])
    for kind in ("network-interface", "spot-instances-request"):
        message = refused("InvalidParameterValue", run, ec2, TagSpecifications=[
            {"ResourceType": "instance", "Tags": tag}, {"ResourceType": kind, "Tags": tag}])
        assert f"'{kind}'" in message and "instance, volume" in message
    assert _live(ec2) == before
    (inst,) = run(ec2, TagSpecifications=[{"ResourceType": "instance", "Tags": tag},
                                          {"ResourceType": "volume", "Tags": [
                                              {"Key": "vk", "Value": "vv"}]}])
    (vol,) = ec2.describe_volumes(Filters=[{"Name": "attachment.instance-id",
                                            "Values": [inst["InstanceId"]]}])["Volumes"]
    assert inst["Tags"] == tag and vol["Tags"] == [{"Key": "vk", "Value": "vv"}]
    ec2.terminate_instances(InstanceIds=[inst["InstanceId"]])


def test_duplicate_tag_keys_are_refused(ec2: Any) -> None:
    """The last value won; EC2 refuses the request."""
    (inst,) = run(ec2)
    iid = inst["InstanceId"]
    twice = [{"Key": "k", "Value": "a"}, {"Key": "k", "Value": "b"}]
    message = refused("InvalidParameterValue", ec2.create_tags, Resources=[iid], Tags=twice)
    assert message == "Duplicate tag key 'k' specified."
    assert _held(ec2, iid) == {}
    before = _live(ec2)
    for specs in ([{"ResourceType": "instance", "Tags": twice}],
                  [{"ResourceType": "volume", "Tags": twice}],
                  [{"ResourceType": "instance", "Tags": twice[:1]},
                   {"ResourceType": "instance", "Tags": twice[1:]}]):
        message = refused("InvalidParameterValue", run, ec2, TagSpecifications=specs)
        assert message == "Duplicate tag key 'k' specified."
    refused("InvalidParameterValue", ec2.create_vpc, CidrBlock="10.18.0.0/16",
            TagSpecifications=[{"ResourceType": "vpc", "Tags": twice}])
    assert _live(ec2) == before
    ec2.delete_tags(Resources=[iid], Tags=[{"Key": "k"}, {"Key": "k"}])  # harmless
    ec2.terminate_instances(InstanceIds=[iid])


def test_type_offerings_and_account_attributes(ec2: Any) -> None:
    region = ec2.describe_instance_type_offerings()["InstanceTypeOfferings"]
    assert {"InstanceType": "t3.micro", "LocationType": "region", "Location": "roost-1"} in region
    zones = ec2.describe_instance_type_offerings(
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": ["m1.small", "t3.*"]}])
    found = {(o["InstanceType"], o["Location"]) for o in zones["InstanceTypeOfferings"]}
    assert ("m1.small", "roost-1a") in found and ("t3.micro", "roost-1a") in found
    assert all(t == "m1.small" or t.startswith("t3.") for t, _ in found)
    pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
        PaginationConfig={"PageSize": 5})
    assert sum(len(p["InstanceTypeOfferings"]) for p in pages) == len(region)
    fails("InvalidParameterValue", ec2.describe_instance_type_offerings, LocationType="planet")
    attrs = ec2.describe_account_attributes()["AccountAttributes"]
    by_name = {a["AttributeName"]: [v["AttributeValue"] for v in a["AttributeValues"]]
               for a in attrs}
    assert by_name["supported-platforms"] == ["VPC"]
    default = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]
    assert by_name["default-vpc"] == [default[0]["VpcId"]]
    one = ec2.describe_account_attributes(AttributeNames=["default-vpc"])["AccountAttributes"]
    assert [a["AttributeName"] for a in one] == ["default-vpc"]
    fails("InvalidParameterValue", ec2.describe_account_attributes, AttributeNames=["nope"])


def test_modify_instance_groups(ec2: Any) -> None:
    a = ec2.create_security_group(GroupName="a", Description="a")["GroupId"]
    b = ec2.create_security_group(GroupName="b", Description="b")["GroupId"]
    (inst,) = run(ec2)
    iid = inst["InstanceId"]
    ec2.modify_instance_attribute(InstanceId=iid, Groups=[a, b])
    got = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
    assert [g["GroupId"] for g in got["SecurityGroups"]] == [a, b]
    assert [g["GroupId"] for g in got["NetworkInterfaces"][0]["Groups"]] == [a, b]
    attr = ec2.describe_instance_attribute(InstanceId=iid, Attribute="groupSet")
    assert [g["GroupId"] for g in attr["Groups"]] == [a, b]
    fails("InvalidGroup.NotFound", ec2.modify_instance_attribute, InstanceId=iid,
          Groups=["sg-0123456789abcdef0"])
    fails("InvalidGroupId.Malformed", ec2.modify_instance_attribute, InstanceId=iid,
          Groups=["nope"])
    vpc = ec2.create_vpc(CidrBlock="10.11.0.0/16")["Vpc"]["VpcId"]
    elsewhere = ec2.create_security_group(GroupName="x", Description="x", VpcId=vpc)["GroupId"]
    fails("InvalidParameter", ec2.modify_instance_attribute, InstanceId=iid, Groups=[elsewhere])
    fails("DependencyViolation", ec2.delete_security_group, GroupId=a)
    ec2.terminate_instances(InstanceIds=[iid])
    wait_state(ec2, iid, "terminated")
    for gid in (a, b, elsewhere):
        ec2.delete_security_group(GroupId=gid)
    ec2.delete_vpc(VpcId=vpc)


def test_route_tables_acls_vpc_attributes_interfaces(ec2: Any) -> None:
    vpc = ec2.create_vpc(CidrBlock="10.12.0.0/16")["Vpc"]["VpcId"]
    (rtb,) = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [vpc]},
                                                {"Name": "association.main",
                                                 "Values": ["true"]}])["RouteTables"]
    assert rtb["Routes"][0]["DestinationCidrBlock"] == "10.12.0.0/16"
    assert rtb["Associations"][0]["Main"] is True
    (acl,) = ec2.describe_network_acls(Filters=[{"Name": "vpc-id", "Values": [vpc]},
                                                {"Name": "default", "Values": ["true"]}])[
        "NetworkAcls"]
    assert acl["IsDefault"] and len(acl["Entries"]) == 4
    support = ec2.describe_vpc_attribute(VpcId=vpc, Attribute="enableDnsSupport")
    hostnames = ec2.describe_vpc_attribute(VpcId=vpc, Attribute="enableDnsHostnames")
    assert support["EnableDnsSupport"]["Value"] and not hostnames["EnableDnsHostnames"]["Value"]
    fails("InvalidVpcID.NotFound", ec2.describe_vpc_attribute, VpcId="vpc-0123456789abcdef0",
          Attribute="enableDnsSupport")
    fails("InvalidParameterValue", ec2.describe_route_tables,
          Filters=[{"Name": "nope", "Values": ["x"]}])
    ec2.delete_vpc(VpcId=vpc)

    (inst,) = run(ec2)
    (nic,) = ec2.describe_network_interfaces(
        Filters=[{"Name": "attachment.instance-id", "Values": [inst["InstanceId"]]}])[
        "NetworkInterfaces"]
    assert nic["NetworkInterfaceId"] == inst["NetworkInterfaces"][0]["NetworkInterfaceId"]
    assert nic["Attachment"]["InstanceId"] == inst["InstanceId"]
    assert nic["PrivateIpAddress"] == inst["PrivateIpAddress"]
    ec2.terminate_instances(InstanceIds=[inst["InstanceId"]])
    wait_state(ec2, inst["InstanceId"], "terminated")
    fails("InvalidNetworkInterfaceID.NotFound", ec2.describe_network_interfaces,
          NetworkInterfaceIds=[nic["NetworkInterfaceId"]])
    fails("InvalidRouteTableID.NotFound", ec2.describe_route_tables,
          RouteTableIds=["rtb-0123456789abcdef0"])
    fails("InvalidNetworkAclID.NotFound", ec2.describe_network_acls,
          NetworkAclIds=["acl-0123456789abcdef0"])


def test_tags_on_vpcs_subnets_and_groups(ec2: Any) -> None:
    vpc = ec2.create_vpc(CidrBlock="10.13.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.13.0.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName="tagged", Description="t",
                                      VpcId=vpc)["GroupId"]
    ec2.create_tags(Resources=[vpc, subnet, group], Tags=[{"Key": "env", "Value": "lab"}])
    for call, key in ((ec2.describe_vpcs, "Vpcs"), (ec2.describe_subnets, "Subnets"),
                      (ec2.describe_security_groups, "SecurityGroups")):
        found = call(Filters=[{"Name": "tag:env", "Values": ["lab"]}])[key]
        assert len(found) == 1 and found[0]["Tags"] == [{"Key": "env", "Value": "lab"}]
    rows = ec2.describe_tags(Filters=[{"Name": "resource-type", "Values": ["vpc"]}])["Tags"]
    assert {"Key": "env", "ResourceId": vpc, "ResourceType": "vpc", "Value": "lab"} in rows
    ec2.delete_tags(Resources=[vpc, subnet, group], Tags=[{"Key": "env"}])
    assert "Tags" not in ec2.describe_vpcs(VpcIds=[vpc])["Vpcs"][0]
    default = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])[
        "Vpcs"][0]["VpcId"]
    ec2.create_tags(Resources=[default], Tags=[{"Key": "Name", "Value": "default"}])
    assert ec2.describe_vpcs(VpcIds=[default])["Vpcs"][0]["Tags"] == [
        {"Key": "Name", "Value": "default"}]
    fails("InvalidVpcID.NotFound", ec2.create_tags, Resources=["vpc-0123456789abcdef0"],
          Tags=[{"Key": "a", "Value": "b"}])
    fails("InvalidSubnetID.Malformed", ec2.create_tags, Resources=["subnet-x"],
          Tags=[{"Key": "a", "Value": "b"}])
    ec2.delete_security_group(GroupId=group)
    ec2.delete_subnet(SubnetId=subnet)
    ec2.delete_vpc(VpcId=vpc)


def test_public_ipv4_addresses(ec2: Any) -> None:
    """Default subnets map public addresses on launch, new subnets do not until
    ModifySubnetAttribute says so; AssociatePublicIpAddress overrides either. The
    address is recorded (from the pool, 198.18.0.0/15 by default), not routed."""
    vpc = ec2.create_vpc(CidrBlock="10.40.0.0/16")["Vpc"]["VpcId"]
    sub = ec2.create_subnet(VpcId=vpc, CidrBlock="10.40.1.0/24")["Subnet"]
    assert sub["MapPublicIpOnLaunch"] is False
    (default,) = ec2.describe_subnets(
        Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
    assert default["MapPublicIpOnLaunch"] is True
    (on_default,) = run(ec2)
    ip = on_default["PublicIpAddress"]
    assert ipaddress.IPv4Address(ip) in ipaddress.IPv4Network("198.18.0.0/15")
    assert ip.replace(".", "-") in on_default["PublicDnsName"]
    nic = on_default["NetworkInterfaces"][0]
    assert nic["Association"] == {"PublicIp": ip, "PublicDnsName": on_default["PublicDnsName"],
                                  "IpOwnerId": "amazon"}
    (private,) = run(ec2, SubnetId=sub["SubnetId"])
    assert "PublicIpAddress" not in private and private["PublicDnsName"] == ""
    ec2.modify_subnet_attribute(SubnetId=sub["SubnetId"], MapPublicIpOnLaunch={"Value": True})
    (mapped,) = ec2.describe_subnets(SubnetIds=[sub["SubnetId"]])["Subnets"]
    assert mapped["MapPublicIpOnLaunch"] is True
    (public,) = run(ec2, SubnetId=sub["SubnetId"])
    (opted_out,) = run(ec2, NetworkInterfaces=[{"DeviceIndex": 0, "SubnetId": sub["SubnetId"],
                                                "AssociatePublicIpAddress": False}])
    assert public["PublicIpAddress"] not in (ip, None) and "PublicIpAddress" not in opted_out
    found = ec2.describe_instances(Filters=[{"Name": "ip-address", "Values": [ip]}])
    assert [i["InstanceId"] for r in found["Reservations"] for i in r["Instances"]] == [
        on_default["InstanceId"]]
    found = ec2.describe_instances(
        Filters=[{"Name": "dns-name", "Values": [public["PublicDnsName"]]}])
    assert [i["InstanceId"] for r in found["Reservations"] for i in r["Instances"]] == [
        public["InstanceId"]]
    fails("InvalidSubnetID.NotFound", ec2.modify_subnet_attribute,
          SubnetId="subnet-0123456789abcdef0", MapPublicIpOnLaunch={"Value": True})
    fails("InvalidParameterValue", ec2.modify_subnet_attribute, SubnetId=sub["SubnetId"],
          EnableDns64={"Value": True})
    fails("MissingParameter", ec2.modify_subnet_attribute, SubnetId=sub["SubnetId"])
    # Stopped, it has none (EC2 gives it back); started again, it gets one anew.
    ec2.stop_instances(InstanceIds=[public["InstanceId"]])
    stopped = wait_state(ec2, public["InstanceId"], "stopped", timeout=30)
    assert "PublicIpAddress" not in stopped and stopped["PublicDnsName"] == ""
    ec2.start_instances(InstanceIds=[public["InstanceId"]])
    started = wait_state(ec2, public["InstanceId"], "running", timeout=30)
    assert ipaddress.IPv4Address(started["PublicIpAddress"]) in ipaddress.IPv4Network(
        "198.18.0.0/15")
    assert started["NetworkInterfaces"][0]["Association"]["PublicIp"] == started[
        "PublicIpAddress"]
    # Terminated, it shows no address (its claim in the pool is released).
    ids = [i["InstanceId"] for i in (on_default, private, public, opted_out)]
    ec2.terminate_instances(InstanceIds=ids)
    gone = wait_state(ec2, on_default["InstanceId"], "terminated", timeout=30)
    assert "PublicIpAddress" not in gone
    for iid in ids[1:]:
        wait_state(ec2, iid, "terminated", timeout=30)
    ec2.delete_subnet(SubnetId=sub["SubnetId"])
    ec2.delete_vpc(VpcId=vpc)


def test_root_device_is_the_images(ec2: Any, tmp_path: Any) -> None:
    """An image registered with RootDeviceName: its instances' root volume is at that
    device, which the launch's mapping for it sizes; ModifyInstanceAttribute
    BlockDeviceMapping changes DeleteOnTermination, and termination keeps what it says."""
    disk = tmp_path / "disk.raw"
    disk.write_bytes(bytes(4096))
    ami = ec2.register_image(Name="sda-root", ImageLocation=str(disk),
                             RootDeviceName="/dev/sda1")["ImageId"]
    (image,) = ec2.describe_images(ImageIds=[ami])["Images"]
    assert image["RootDeviceName"] == "/dev/sda1"
    (mapping,) = image["BlockDeviceMappings"]
    assert mapping["DeviceName"] == "/dev/sda1" and mapping["Ebs"]["VolumeSize"] == 8
    fails("InvalidParameterValue", ec2.register_image, Name="bad-root",
          ImageLocation=str(disk), RootDeviceName="sda1")
    (inst,) = ec2.run_instances(
        ImageId=ami, InstanceType="t3.micro", MinCount=1, MaxCount=1,
        BlockDeviceMappings=[{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 20}}])["Instances"]
    iid = inst["InstanceId"]
    assert inst["RootDeviceName"] == "/dev/sda1"
    assert [(m["DeviceName"], m["Ebs"]["DeleteOnTermination"])
            for m in inst["BlockDeviceMappings"]] == [("/dev/sda1", True)]
    (vol,) = ec2.describe_volumes(
        Filters=[{"Name": "attachment.instance-id", "Values": [iid]}])["Volumes"]
    assert vol["Size"] == 20 and vol["Attachments"][0]["Device"] == "/dev/sda1"
    assert vol["SnapshotId"] == mapping["Ebs"]["SnapshotId"]
    attr = ec2.describe_instance_attribute(InstanceId=iid, Attribute="rootDeviceName")
    assert attr["RootDeviceName"]["Value"] == "/dev/sda1"
    ec2.modify_instance_attribute(InstanceId=iid, BlockDeviceMappings=[
        {"DeviceName": "/dev/sda1", "Ebs": {"DeleteOnTermination": False}}])
    described = wait_state(ec2, iid, "running")
    assert described["BlockDeviceMappings"][0]["Ebs"]["DeleteOnTermination"] is False
    fails("InvalidParameterValue", ec2.modify_instance_attribute, InstanceId=iid,
          BlockDeviceMappings=[{"DeviceName": "/dev/xvda",
                                "Ebs": {"DeleteOnTermination": False}}])
    ec2.terminate_instances(InstanceIds=[iid])
    wait_state(ec2, iid, "terminated", timeout=30)
    (kept,) = ec2.describe_volumes(VolumeIds=[vol["VolumeId"]])["Volumes"]
    assert kept["State"] == "available"
    ec2.delete_volume(VolumeId=vol["VolumeId"])
    ec2.deregister_image(ImageId=ami)


def test_ipv6_blocks_and_addresses(ec2: Any) -> None:
    """AmazonProvidedIpv6CidrBlock gives a VPC a /56 of 2001:db8::/32 (recorded, not
    routed), a subnet takes a /64 of it, and Ipv6AddressCount gives instances addresses
    of the subnet's /64."""
    vpc = ec2.create_vpc(CidrBlock="10.50.0.0/16", AmazonProvidedIpv6CidrBlock=True)["Vpc"]
    (assoc,) = vpc["Ipv6CidrBlockAssociationSet"]
    block = ipaddress.IPv6Network(assoc["Ipv6CidrBlock"])
    assert block.prefixlen == 56 and block.subnet_of(ipaddress.IPv6Network("2001:db8::/32"))
    assert assoc["Ipv6CidrBlockState"]["State"] == "associated"
    other = ec2.create_vpc(CidrBlock="10.51.0.0/16", AmazonProvidedIpv6CidrBlock=True)["Vpc"]
    assert other["Ipv6CidrBlockAssociationSet"][0]["Ipv6CidrBlock"] != str(block)
    plain = ec2.create_vpc(CidrBlock="10.52.0.0/16")["Vpc"]
    assert plain["Ipv6CidrBlockAssociationSet"] == []
    sixty_four = str(next(block.subnets(new_prefix=64)))
    sub = ec2.create_subnet(VpcId=vpc["VpcId"], CidrBlock="10.50.0.0/24",
                            Ipv6CidrBlock=sixty_four)["Subnet"]
    assert sub["Ipv6CidrBlockAssociationSet"][0]["Ipv6CidrBlock"] == sixty_four
    fails("InvalidSubnet.Conflict", ec2.create_subnet, VpcId=vpc["VpcId"],
          CidrBlock="10.50.1.0/24", Ipv6CidrBlock=sixty_four)
    fails("InvalidSubnet.Range", ec2.create_subnet, VpcId=vpc["VpcId"],
          CidrBlock="10.50.2.0/24", Ipv6CidrBlock=str(block))  # a /56, not a /64
    fails("InvalidSubnet.Range", ec2.create_subnet, VpcId=plain["VpcId"],
          CidrBlock="10.52.0.0/24", Ipv6CidrBlock=sixty_four)
    insts = run(ec2, 2, SubnetId=sub["SubnetId"], Ipv6AddressCount=2)
    addresses = [a["Ipv6Address"] for i in insts for a in i["NetworkInterfaces"][0][
        "Ipv6Addresses"]]
    assert len(set(addresses)) == 4
    assert all(ipaddress.IPv6Address(a) in ipaddress.IPv6Network(sixty_four) for a in addresses)
    assert insts[0]["Ipv6Address"] == addresses[0]
    fails("InvalidParameterValue", run, ec2, Ipv6AddressCount=1)  # the default subnet has none
    ec2.terminate_instances(InstanceIds=[i["InstanceId"] for i in insts])
    for i in insts:
        wait_state(ec2, i["InstanceId"], "terminated", timeout=30)
    ec2.delete_subnet(SubnetId=sub["SubnetId"])
    for v in (vpc, other, plain):
        ec2.delete_vpc(VpcId=v["VpcId"])


def test_an_images_root_mapping_is_its_instances_default(ec2: Any, tmp_path: Any) -> None:
    disk = tmp_path / "disk.raw"
    disk.write_bytes(bytes(4096))
    root = {"DeviceName": "/dev/xvda",
            "Ebs": {"VolumeSize": 30, "VolumeType": "gp3", "DeleteOnTermination": False}}
    ami = ec2.register_image(Name="big-root", ImageLocation=str(disk),
                             BlockDeviceMappings=[root])["ImageId"]
    (mapping,) = ec2.describe_images(ImageIds=[ami])["Images"][0]["BlockDeviceMappings"]
    assert (mapping["Ebs"]["VolumeSize"], mapping["Ebs"]["VolumeType"],
            mapping["Ebs"]["DeleteOnTermination"]) == (30, "gp3", False)
    for bad in ({"DeviceName": "/dev/sdf", "Ebs": {"VolumeSize": 10}},
                {"DeviceName": "/dev/xvda", "Ebs": {"SnapshotId": "snap-0123456789abcdef0"}},
                {"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 4}}):
        fails("InvalidParameterValue", ec2.register_image, Name="bad-map",
              ImageLocation=str(disk), BlockDeviceMappings=[bad])
    (inst,) = ec2.run_instances(ImageId=ami, InstanceType="t3.micro", MinCount=1,
                                MaxCount=1)["Instances"]
    assert inst["BlockDeviceMappings"][0]["Ebs"]["DeleteOnTermination"] is False
    (vol,) = ec2.describe_volumes(Filters=[
        {"Name": "attachment.instance-id", "Values": [inst["InstanceId"]]}])["Volumes"]
    assert (vol["Size"], vol["VolumeType"]) == (30, "gp3")
    fails("InvalidBlockDeviceMapping", ec2.run_instances, ImageId=ami, InstanceType="t3.micro",
          MinCount=1, MaxCount=1,
          BlockDeviceMappings=[{"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 20}}])
    ec2.terminate_instances(InstanceIds=[inst["InstanceId"]])
    wait_state(ec2, inst["InstanceId"], "terminated", timeout=30)
    ec2.delete_volume(VolumeId=vol["VolumeId"])  # kept: the image said so
    ec2.deregister_image(ImageId=ami)


def _paged(ec2: Any, operation: str, key: str, field: str, size: int, **kw: Any
           ) -> list[list[str]]:
    """The ids of each page boto3's paginator reads at ``size`` a page; only the last
    page has no NextToken."""
    pages = list(ec2.get_paginator(operation).paginate(PaginationConfig={"PageSize": size},
                                                       **kw))
    assert [bool(p.get("NextToken")) for p in pages] == [True] * (len(pages) - 1) + [False]
    return [[item[field] for item in page[key]] for page in pages]


def test_every_describe_pages_with_max_results_and_next_token(
        ec2: Any, cluster: ThreadedCluster) -> None:
    """boto3's paginators read every VPC, subnet, group, route table, ACL, volume,
    interface, image and launch template once, over more than one page, the last
    without a token; MaxResults out of EC2's bounds, a token of another call, and ids
    with MaxResults where EC2 refuses them are refused; without MaxResults all come in
    one answer, as before."""
    vpcs = [ec2.create_vpc(CidrBlock=f"10.{200 + i}.0.0/16")["Vpc"]["VpcId"] for i in range(6)]
    subnets = [ec2.create_subnet(VpcId=vpcs[0], CidrBlock=f"10.200.{i}.0/24")["Subnet"]
               ["SubnetId"] for i in range(6)]
    zone = ec2.describe_availability_zones()["AvailabilityZones"][0]["ZoneName"]
    volumes = [ec2.create_volume(AvailabilityZone=zone, Size=1)["VolumeId"] for _ in range(6)]
    templates = [ec2.create_launch_template(
        LaunchTemplateName=f"paged-{i}", LaunchTemplateData={"InstanceType": "t3.micro"},
    )["LaunchTemplate"]["LaunchTemplateId"] for i in range(3)]
    instances = [i["InstanceId"] for i in run(ec2, 6)]  # their interfaces
    try:
        for operation, key, field, size in [
            ("describe_vpcs", "Vpcs", "VpcId", 5),
            ("describe_subnets", "Subnets", "SubnetId", 5),
            ("describe_security_groups", "SecurityGroups", "GroupId", 5),
            ("describe_route_tables", "RouteTables", "RouteTableId", 5),
            ("describe_network_acls", "NetworkAcls", "NetworkAclId", 5),
            ("describe_network_interfaces", "NetworkInterfaces", "NetworkInterfaceId", 5),
            ("describe_volumes", "Volumes", "VolumeId", 5),
            ("describe_images", "Images", "ImageId", 1),
            ("describe_launch_templates", "LaunchTemplates", "LaunchTemplateId", 2),
        ]:
            whole = [item[field] for item in getattr(ec2, operation)()[key]]
            pages = _paged(ec2, operation, key, field, size)
            read = [i for page in pages for i in page]
            assert len(pages) > 1 and all(len(p) <= size for p in pages), (operation, pages)
            assert sorted(read) == sorted(whole) and len(set(read)) == len(read), operation
        assert set(vpcs) <= {v["VpcId"] for v in ec2.describe_vpcs()["Vpcs"]}
        raw = _without_validation(cluster)  # botocore refuses these before sending
        fails("InvalidParameterValue", raw.describe_vpcs, MaxResults=4)
        fails("InvalidParameterValue", raw.describe_route_tables, MaxResults=101)
        fails("InvalidParameterValue", raw.describe_launch_templates, MaxResults=201)
        fails("InvalidParameterValue", raw.describe_volumes, MaxResults=4)
        fails("InvalidPaginationToken", ec2.describe_subnets, MaxResults=5, NextToken="%%")
        vpc_token = ec2.describe_vpcs(MaxResults=5)["NextToken"]
        fails("InvalidPaginationToken", ec2.describe_subnets, MaxResults=5, NextToken=vpc_token)
        for call, ids in [(ec2.describe_network_interfaces,
                           {"NetworkInterfaceIds": ["eni-0123456789abcdef0"]}),
                          (ec2.describe_volumes, {"VolumeIds": volumes[:1]}),
                          (ec2.describe_images, {"ImageIds": [IMAGE]})]:
            fails("InvalidParameterCombination", call, MaxResults=5, **ids)
    finally:
        ec2.terminate_instances(InstanceIds=instances)
        for t in templates:
            ec2.delete_launch_template(LaunchTemplateId=t)
        for v in volumes:
            ec2.delete_volume(VolumeId=v)
        for s in subnets:
            ec2.delete_subnet(SubnetId=s)
        for v in vpcs:
            ec2.delete_vpc(VpcId=v)
