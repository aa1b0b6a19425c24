"""boto3 against a live cluster: deleting the region's default subnets and default VPC,
what RunInstances answers without them (EC2's VPCIdNotSpecified, MissingInput and
InvalidInput), and CreateDefaultVpc / CreateDefaultSubnet bringing them back, each
with the error codes they answer. A cluster of its own: the test deletes defaults."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import ThreadedCluster, make_cluster
from tests.e2e.test_boto3 import run, wait_state
from tests.e2e.test_network import fails

ZONES = ["roost-1a", "roost-1b"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedCluster]:
    c = make_cluster(tmp_path_factory.mktemp("defaults"), nodes=2, zones=ZONES)
    try:
        yield c
    finally:
        c.stop()


def _defaults(ec2: Any) -> dict[str, str]:
    """zone -> default subnet id."""
    subnets = ec2.describe_subnets(
        Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
    return {s["AvailabilityZone"]: s["SubnetId"] for s in subnets}


def _zone(inst: dict[str, Any]) -> str:
    return str(inst["Placement"]["AvailabilityZone"])


def test_default_subnets_and_vpc_deleted_and_created_again(cluster: ThreadedCluster) -> None:
    ec2 = cluster.client()
    (vpc,) = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
    vpc_id = vpc["VpcId"]
    subnets = _defaults(ec2)
    assert sorted(subnets) == ZONES
    fails("DefaultVpcAlreadyExists", ec2.create_default_vpc)
    fails("DefaultSubnetAlreadyExistsInAvailabilityZone", ec2.create_default_subnet,
          AvailabilityZone="roost-1a")
    fails("InvalidParameterValue", ec2.create_default_subnet, AvailabilityZone="roost-1z")
    fails("DependencyViolation", ec2.delete_vpc, VpcId=vpc_id)

    # A default subnet with an instance in it stays; without, it goes.
    (inst,) = run(ec2, Placement={"AvailabilityZone": "roost-1a"})
    fails("DependencyViolation", ec2.delete_subnet, SubnetId=subnets["roost-1a"])
    ec2.terminate_instances(InstanceIds=[inst["InstanceId"]])
    wait_state(ec2, inst["InstanceId"], "terminated")
    ec2.delete_subnet(SubnetId=subnets["roost-1a"])
    assert _defaults(ec2) == {"roost-1b": subnets["roost-1b"]}
    fails("InvalidSubnetID.NotFound", ec2.delete_subnet, SubnetId=subnets["roost-1a"])
    fails("InvalidInput", run, ec2, Placement={"AvailabilityZone": "roost-1a"})
    placed = [run(ec2)[0] for _ in range(3)]  # only the zone that has a default subnet
    assert {(_zone(i), i["SubnetId"]) for i in placed} == {("roost-1b", subnets["roost-1b"])}
    ec2.terminate_instances(InstanceIds=[i["InstanceId"] for i in placed])
    for i in placed:
        wait_state(ec2, i["InstanceId"], "terminated")
    ec2.delete_subnet(SubnetId=subnets["roost-1b"])
    fails("MissingInput", run, ec2)

    ec2.delete_vpc(VpcId=vpc_id)
    assert vpc_id not in {v["VpcId"] for v in ec2.describe_vpcs()["Vpcs"]}
    fails("InvalidVpcID.NotFound", ec2.delete_vpc, VpcId=vpc_id)
    attrs = ec2.describe_account_attributes(AttributeNames=["default-vpc"])
    assert attrs["AccountAttributes"][0]["AttributeValues"] == [{"AttributeValue": "none"}]
    fails("VPCIdNotSpecified", run, ec2)
    fails("VPCIdNotSpecified", ec2.create_security_group, GroupName="web", Description="x")
    fails("DefaultVpcDoesNotExist", ec2.create_default_subnet, AvailabilityZone="roost-1a")

    # Created again: the same derived id, a default subnet in every zone, its group.
    again = ec2.create_default_vpc()["Vpc"]
    assert (again["VpcId"], again["IsDefault"], again["CidrBlock"]) == (
        vpc_id, True, "172.31.0.0/16")
    assert _defaults(ec2) == subnets
    groups = ec2.describe_security_groups(
        Filters=[{"Name": "vpc-id", "Values": [vpc_id]}])["SecurityGroups"]
    assert [g["GroupName"] for g in groups] == ["default"]
    ec2.delete_subnet(SubnetId=subnets["roost-1b"])
    made = ec2.create_default_subnet(AvailabilityZone="roost-1b")["Subnet"]
    assert (made["SubnetId"], made["DefaultForAz"], made["MapPublicIpOnLaunch"]) == (
        subnets["roost-1b"], True, True)
    (back,) = run(ec2, Placement={"AvailabilityZone": "roost-1b"})
    assert back["SubnetId"] == subnets["roost-1b"]
    ec2.terminate_instances(InstanceIds=[back["InstanceId"]])
