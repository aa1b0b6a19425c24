"""Accounts end to end: every EC2 action the gateway serves, asked by account B about
account A's resources, answers exactly as about resources that do not exist, and
changes nothing; an admin key sees both accounts. Accounts and keys are made with the
``roost accounts``/``roost keys`` commands against the cluster's real NATS."""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import boto3
import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from click.testing import CliRunner

from roost.bus import subjects
from roost.bus.connect import connect, key_value
from roost.bus.contents import live_entries
from roost.cli import main
from roost.gateway.accounts import OPERATOR_KEY_ENV
from roost.gateway.actions import ACTIONS
from tests.e2e.conftest import IMAGE, ThreadedCluster, make_cluster
from tests.polling import wait_until

MISSING = {"i": "i-0123456789abcdef0", "vpc": "vpc-0123456789abcdef1",
           "subnet": "subnet-0123456789abcdef2", "sg": "sg-0123456789abcdef3",
           "key": "no-such-key", "lt": "lt-0123456789abcdef4", "ltname": "no-such-template",
           "ami": "ami-0123456789abcdef5", "aminame": "no-such-image",
           "cvol": "vol-0123456789abcdef6"}
PERMISSION = {"IpPermissions.1.IpProtocol": "tcp", "IpPermissions.1.FromPort": "22",
              "IpPermissions.1.ToPort": "22", "IpPermissions.1.IpRanges.1.CidrIp": "10.0.0.0/8"}
RUN = {"ImageId": IMAGE, "InstanceType": "t3.micro", "MinCount": "1", "MaxCount": "1"}
PUBLIC_KEY = ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGQ0Yz6Gm1qzQdQ6bJ2mIDcBrX9DkQXw6c1"
              "ZzDkFBW9x roost-test")

# Every action about a resource: the Query parameters naming it. "{i}" and the like are
# filled with A's ids, then with ids that exist nowhere; B must get one answer for both.
ABOUT: dict[str, list[dict[str, str]]] = {
    "RunInstances": [{**RUN, "SubnetId": "{subnet}"}, {**RUN, "KeyName": "{key}"},
                     {**RUN, "SecurityGroupId.1": "{sg}"}, {**RUN, "ImageId": "{ami}"},
                     {"MinCount": "1", "MaxCount": "1",
                      "LaunchTemplate.LaunchTemplateId": "{lt}"}],
    "TerminateInstances": [{"InstanceId.1": "{i}"}],
    "StopInstances": [{"InstanceId.1": "{i}"}],
    "StartInstances": [{"InstanceId.1": "{i}"}],
    "RebootInstances": [{"InstanceId.1": "{i}"}],
    "DescribeInstances": [{"InstanceId.1": "{i}"},
                          {"Filter.1.Name": "instance-id", "Filter.1.Value.1": "{i}"},
                          {"Filter.1.Name": "vpc-id", "Filter.1.Value.1": "{vpc}",
                           "MaxResults": "5"}],
    "DescribeInstanceStatus": [{"InstanceId.1": "{i}"}],
    "DescribeInstanceAttribute": [{"InstanceId": "{i}", "Attribute": "userData"},
                                  {"InstanceId": "{i}", "Attribute": "instanceType"}],
    "DescribeInstanceCreditSpecifications": [{"InstanceId.1": "{i}"}],
    "ModifyInstanceAttribute": [{"InstanceId": "{i}", "DisableApiTermination.Value": "true"},
                                {"InstanceId": "{i}", "GroupId.1": "{sg}"}],
    "ModifyInstanceMetadataOptions": [{"InstanceId": "{i}", "HttpTokens": "required"}],
    "GetConsoleOutput": [{"InstanceId": "{i}"}],
    "CreateTags": [{"ResourceId.1": r, "Tag.1.Key": "owner", "Tag.1.Value": "b"}
                   for r in ("{i}", "{vpc}", "{subnet}", "{sg}")],
    "DeleteTags": [{"ResourceId.1": r, "Tag.1.Key": "team"}
                   for r in ("{i}", "{vpc}", "{subnet}", "{sg}")],
    "DescribeTags": [{"Filter.1.Name": "resource-id", "Filter.1.Value.1": r}
                     for r in ("{i}", "{vpc}", "{subnet}", "{sg}")],
    "CreateVpc": [{"CidrBlock": "10.20.0.0/16"}],  # A's block: no conflict across accounts
    "DescribeVpcs": [{"VpcId.1": "{vpc}"},
                     {"Filter.1.Name": "vpc-id", "Filter.1.Value.1": "{vpc}"}],
    "DeleteVpc": [{"VpcId": "{vpc}"}],
    "DescribeVpcAttribute": [{"VpcId": "{vpc}", "Attribute": "enableDnsSupport"}],
    "CreateSubnet": [{"VpcId": "{vpc}", "CidrBlock": "10.20.9.0/24"}],
    "DescribeSubnets": [{"SubnetId.1": "{subnet}"},
                        {"Filter.1.Name": "vpc-id", "Filter.1.Value.1": "{vpc}"}],
    "DeleteSubnet": [{"SubnetId": "{subnet}"}],
    "ModifySubnetAttribute": [{"SubnetId": "{subnet}", "MapPublicIpOnLaunch.Value": "true"}],
    "CreateSecurityGroup": [{"GroupName": "b-web", "GroupDescription": "x", "VpcId": "{vpc}"}],
    "DescribeSecurityGroups": [{"GroupId.1": "{sg}"},
                               {"Filter.1.Name": "vpc-id", "Filter.1.Value.1": "{vpc}"}],
    "DeleteSecurityGroup": [{"GroupId": "{sg}"}],
    "AuthorizeSecurityGroupIngress": [{"GroupId": "{sg}", **PERMISSION}],
    "AuthorizeSecurityGroupEgress": [{"GroupId": "{sg}", **PERMISSION}],
    "RevokeSecurityGroupIngress": [{"GroupId": "{sg}", **PERMISSION}],
    "RevokeSecurityGroupEgress": [{"GroupId": "{sg}", **PERMISSION}],
    # Names are per account: B may take A's name, exactly as it may take a free one.
    "CreateKeyPair": [{"KeyName": "{key}"}],
    "ImportKeyPair": [{"KeyName": "{key}-2",
                       "PublicKeyMaterial": base64.b64encode(PUBLIC_KEY.encode()).decode()}],
    "DescribeKeyPairs": [{"KeyName.1": "{key}"}],
    "DeleteKeyPair": [{"KeyName": "{key}"}],
    "CreateLaunchTemplate": [{"LaunchTemplateName": "{ltname}",
                              "LaunchTemplateData.ImageId": IMAGE}],
    "CreateLaunchTemplateVersion": [{"LaunchTemplateId": "{lt}",
                                     "LaunchTemplateData.InstanceType": "t3.small"}],
    "ModifyLaunchTemplate": [{"LaunchTemplateId": "{lt}", "SetDefaultVersion": "1"}],
    "DescribeLaunchTemplates": [{"LaunchTemplateId.1": "{lt}"},
                                {"LaunchTemplateName.1": "{ltname}"}],
    "DescribeLaunchTemplateVersions": [{"LaunchTemplateId": "{lt}"}],
    "DeleteLaunchTemplate": [{"LaunchTemplateId": "{lt}"}, {"LaunchTemplateName": "{ltname}"}],
    "DescribeVolumes": [{"VolumeId.1": "{vol}"}, {"VolumeId.1": "{cvol}"},
                        {"Filter.1.Name": "attachment.instance-id", "Filter.1.Value.1": "{i}"}],
    "CreateVolume": [{"AvailabilityZone": "{zone}", "Size": "1"}],
    "AttachVolume": [{"VolumeId": "{cvol}", "InstanceId": "{i}", "Device": "/dev/sdf"}],
    "DetachVolume": [{"VolumeId": "{cvol}"}],
    "DeleteVolume": [{"VolumeId": "{cvol}"}, {"VolumeId": "{vol}"}],
    "DescribeNetworkInterfaces": [{"NetworkInterfaceId.1": "{eni}"},
                                  {"Filter.1.Name": "vpc-id", "Filter.1.Value.1": "{vpc}"}],
    "DescribeRouteTables": [{"RouteTableId.1": "{rtb}"},
                            {"Filter.1.Name": "vpc-id", "Filter.1.Value.1": "{vpc}"}],
    "DescribeNetworkAcls": [{"NetworkAclId.1": "{acl}"},
                            {"Filter.1.Name": "vpc-id", "Filter.1.Value.1": "{vpc}"}],
    "DescribeImages": [{"ImageId.1": "{ami}"},
                       {"Filter.1.Name": "image-id", "Filter.1.Value.1": "{ami}"}],
    "DeregisterImage": [{"ImageId": "{ami}"}],
    "RegisterImage": [{"Name": "{aminame}", "ImageLocation": "{disk}"}],
}
# Actions about no account's resource: the region, its catalog and images, its shared
# default VPC (which only an admin key may delete or create again). Every account gets
# the same answer.
SHARED = {"DescribeAvailabilityZones", "DescribeRegions",
          "DescribeInstanceTypes", "DescribeInstanceTypeOfferings",
          "DescribeAccountAttributes", "CreateDefaultVpc", "CreateDefaultSubnet"}
# Listings without ids: B's shows none of A's ids, the admin's shows them.
LISTINGS = ["DescribeImages", "DescribeInstances", "DescribeInstanceStatus", "DescribeTags",
            "DescribeVpcs", "DescribeSubnets", "DescribeSecurityGroups", "DescribeKeyPairs",
            "DescribeLaunchTemplates", "DescribeVolumes", "DescribeNetworkInterfaces",
            "DescribeRouteTables", "DescribeNetworkAcls",
            "DescribeInstanceCreditSpecifications"]
# Answers that create something of B's own carry its new ids: compared by outcome only.
CREATES = {"CreateVpc", "CreateSubnet", "CreateSecurityGroup", "CreateKeyPair",
           "ImportKeyPair", "CreateLaunchTemplate", "RegisterImage", "CreateVolume"}


@dataclass
class Key:
    key_id: str
    secret: str


@dataclass
class Tenants:
    cluster: ThreadedCluster
    env: dict[str, str]
    a: Key
    b: Key
    admin: Key
    ids: dict[str, str]  # A's resources, named as in MISSING
    a_account: str
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))

    def cli(self, *args: str) -> str:
        res = CliRunner().invoke(main, [*args, "--nats", self.cluster.nats.url], env=self.env)
        assert res.exit_code == 0, res.output
        return res.output

    def client(self, key: Key) -> Any:
        return boto3.client(
            "ec2", endpoint_url=self.cluster.endpoint, region_name="roost-1",
            aws_access_key_id=key.key_id, aws_secret_access_key=key.secret,
            config=Config(retries={"total_max_attempts": 1, "mode": "standard"}))

    def call(self, key: Key, action: str, params: dict[str, str]) -> tuple[int, str]:
        url = self.cluster.endpoint + "/"
        body = urlencode({"Action": action, "Version": "2016-11-15", **params})
        req = AWSRequest(method="POST", url=url, data=body, headers={
            "Content-Type": "application/x-www-form-urlencoded; charset=utf-8"})
        SigV4Auth(Credentials(key.key_id, key.secret), "ec2", "roost-1").add_auth(req)
        resp = self.http.post(url, content=body, headers=dict(req.headers.items()))
        return resp.status_code, resp.text


def _new_key(t_cli: Any, account: str, *extra: str) -> Key:
    out = json.loads(t_cli("keys", "create", account, "--json", *extra))
    return Key(out["access_key_id"], out["secret_access_key"])


def _wait_accepted(t: Tenants, key: Key, timeout: float = 10.0) -> None:
    """Until every gateway's key book has the key (it follows the bucket)."""
    wait_until(f"{key.key_id} accepted",
               lambda: t.call(key, "DescribeRegions", {})[0] == 200, timeout)


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    operator_key = os.urandom(32)
    cluster = make_cluster(tmp_path_factory.mktemp("tenants"), nodes=1,
                           capacity="16vcpu,64GiB", operator_key=operator_key)
    env = {OPERATOR_KEY_ENV: base64.urlsafe_b64encode(operator_key).decode()}
    try:
        t = Tenants(cluster, env, Key("", ""), Key("", ""), Key("", ""), {}, "")

        def acct(name: str) -> str:
            return str(json.loads(t.cli("accounts", "create", name, "--json"))["account_id"])

        t.a_account = acct("alpha")
        t.a, t.b = _new_key(t.cli, t.a_account), _new_key(t.cli, acct("beta"))
        t.admin = _new_key(t.cli, acct("ops"), "--admin")
        for key in (t.a, t.b, t.admin):
            _wait_accepted(t, key)
        disk = tmp_path_factory.mktemp("image") / "disk.qcow2"
        disk.write_bytes(b"QFI\xfb" + bytes(1020))  # what RegisterImage reads of a disk
        t.ids = _make_a_resources(t.client(t.a), str(disk))
        yield t
    finally:
        t.http.close()
        cluster.stop()


def _make_a_resources(ec2: Any, disk: str) -> dict[str, str]:
    vpc = ec2.create_vpc(CidrBlock="10.20.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.20.1.0/24")["Subnet"]["SubnetId"]
    sg = ec2.create_security_group(GroupName="a-web", Description="a", VpcId=vpc)["GroupId"]
    ec2.create_key_pair(KeyName="a-key")
    lt = ec2.create_launch_template(
        LaunchTemplateName="a-template",
        LaunchTemplateData={"ImageId": IMAGE, "InstanceType": "t3.micro"},
    )["LaunchTemplate"]["LaunchTemplateId"]
    inst = ec2.run_instances(
        ImageId=IMAGE, InstanceType="t3.micro", MinCount=1, MaxCount=1, SubnetId=subnet,
        UserData="a-secret-user-data", ClientToken="shared-token",
        TagSpecifications=[{"ResourceType": "instance",
                            "Tags": [{"Key": "team", "Value": "a"}]}],
    )["Instances"][0]["InstanceId"]
    for rid in (vpc, subnet, sg):
        ec2.create_tags(Resources=[rid], Tags=[{"Key": "team", "Value": "a"}])
    ec2.get_waiter("instance_running").wait(InstanceIds=[inst],
                                            WaiterConfig={"Delay": 0.2, "MaxAttempts": 100})
    ami = ec2.register_image(Name="a-image", ImageLocation=disk)["ImageId"]
    zone = ec2.describe_availability_zones()["AvailabilityZones"][0]["ZoneName"]
    cvol = ec2.create_volume(AvailabilityZone=zone, Size=1)["VolumeId"]
    return {"i": inst, "vpc": vpc, "subnet": subnet, "sg": sg, "key": "a-key", "lt": lt,
            "ltname": "a-template", "ami": ami, "aminame": "a-image", "disk": disk,
            "cvol": cvol, "zone": zone}


def _derived(ids: dict[str, str]) -> dict[str, str]:
    i, vpc = ids["i"][2:], ids["vpc"][4:]
    return {**ids, "vol": f"vol-{i}", "eni": f"eni-{i}", "rtb": f"rtb-{vpc}",
            "acl": f"acl-{vpc}"}


def _fill(params: dict[str, str], ids: dict[str, str]) -> dict[str, str]:
    return {k: v.format(**ids) for k, v in params.items()}


def _normal(status: int, body: str, ids: dict[str, str], *, outcome_only: bool) -> Any:
    """An answer with its request id dropped and the ids it names made neutral (the
    hex part of an id also names its volume, interface, route table and ACL)."""
    body = re.sub(r"<(requestId|RequestID)>[^<]*</\1>", "", body)
    for name in sorted(ids, key=lambda n: -len(ids[n])):
        value = ids[name]
        body = body.replace(value, f"<{name}>")
        if "-" in value and name in ("i", "vpc"):
            body = body.replace(value.split("-", 1)[1], f"<{name}-hex>")
    code = re.search(r"<Code>([^<]*)</Code>", body)
    if outcome_only:
        return status, code.group(1) if code else "ok"
    return status, body


def _a_state(ec2: Any, ids: dict[str, str]) -> Any:
    """What A can see of its own resources: must not move while B tries."""
    inst = ec2.describe_instances(InstanceIds=[ids["i"]])["Reservations"][0]["Instances"][0]
    attrs = [ec2.describe_instance_attribute(InstanceId=ids["i"], Attribute=a)
             for a in ("userData", "disableApiTermination", "groupSet")]
    groups = ec2.describe_security_groups(GroupIds=[ids["sg"]])["SecurityGroups"]
    lt = ec2.describe_launch_template_versions(LaunchTemplateId=ids["lt"])
    for d in (inst, *attrs, lt):
        d.pop("ResponseMetadata", None)
    return (inst["State"]["Name"], inst["Tags"], inst["MetadataOptions"]["HttpTokens"],
            attrs, groups, ec2.describe_vpcs(VpcIds=[ids["vpc"]])["Vpcs"],
            ec2.describe_subnets(SubnetIds=[ids["subnet"]])["Subnets"],
            ec2.describe_key_pairs(KeyNames=["a-key"])["KeyPairs"], lt,
            ec2.describe_images(ImageIds=[ids["ami"]])["Images"],
            ec2.describe_volumes(VolumeIds=[ids["cvol"], _derived(ids)["vol"]])["Volumes"])


def test_the_matrix_covers_every_action_the_gateway_serves() -> None:
    """A new action must say how B can ask about A's resource (or that it is about
    nobody's): it cannot escape the matrix."""
    assert set(ACTIONS) - set(ABOUT) - SHARED == set()
    assert set(ABOUT) | SHARED <= set(ACTIONS)


def test_another_accounts_resource_answers_as_a_missing_one(tenants: Tenants) -> None:
    t = tenants
    a_ids = _derived(t.ids)
    gone = _derived({**MISSING, "disk": t.ids["disk"], "zone": t.ids["zone"]})
    before = _a_state(t.client(t.a), t.ids)
    mismatches = []
    # Creations last: B's own new resources must not show in the answers compared.
    for action, variants in sorted(ABOUT.items(), key=lambda kv: kv[0] in CREATES):
        for params in variants:
            about_a = t.call(t.b, action, _fill(params, a_ids))
            about_none = t.call(t.b, action, _fill(params, gone))
            only = action in CREATES
            if _normal(*about_a, a_ids, outcome_only=only) != _normal(*about_none, gone,
                                                                      outcome_only=only):
                mismatches.append((action, params, about_a, about_none))
    assert [m[:2] for m in mismatches] == [], mismatches
    assert _a_state(t.client(t.a), t.ids) == before
    for action in SHARED:
        answers = {_normal(*t.call(k, action, {}), {}, outcome_only=False)
                   for k in (t.a, t.b)}
        assert len(answers) == 1, action


def test_listings_show_only_the_callers_own_and_the_admin_sees_all(tenants: Tenants) -> None:
    t = tenants
    a_ids = [v for k, v in _derived(t.ids).items()
             if k not in ("key", "ltname", "aminame", "disk", "zone")]
    for action in LISTINGS:
        status, body = t.call(t.b, action, {})
        assert status == 200, (action, body)
        assert not [x for x in a_ids if x in body], (action, body)
    admin = t.client(t.admin)
    seen = admin.describe_instances(InstanceIds=[t.ids["i"]])["Reservations"][0]
    assert seen["OwnerId"] == t.a_account
    assert admin.describe_vpcs(VpcIds=[t.ids["vpc"]])["Vpcs"][0]["OwnerId"] == t.a_account
    assert admin.describe_instance_attribute(
        InstanceId=t.ids["i"], Attribute="userData")["UserData"]["Value"]
    assert "a-key" in {k["KeyName"] for k in admin.describe_key_pairs()["KeyPairs"]}


def test_only_an_admin_deletes_or_creates_the_shared_defaults(tenants: Tenants) -> None:
    """The region's default VPC and default subnets are every account's: an account's
    key may neither delete them nor create them again (an admin's may)."""
    t = tenants
    b = t.client(t.b)
    (vpc,) = b.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
    (subnet, *_) = b.describe_subnets(
        Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
    for call, kw in ((b.delete_subnet, {"SubnetId": subnet["SubnetId"]}),
                     (b.delete_vpc, {"VpcId": vpc["VpcId"]}), (b.create_default_vpc, {}),
                     (b.create_default_subnet, {"AvailabilityZone": t.ids["zone"]})):
        with pytest.raises(ClientError) as exc:
            call(**kw)
        assert exc.value.response["Error"]["Code"] == "OperationNotPermitted", call
    with pytest.raises(ClientError) as exc:  # the admin's: the VPC still has subnets
        t.client(t.admin).delete_vpc(VpcId=vpc["VpcId"])
    assert exc.value.response["Error"]["Code"] == "DependencyViolation"


def test_a_client_token_belongs_to_its_account(tenants: Tenants) -> None:
    """B reusing A's ClientToken launches B's own instance; A's reservation is not
    replayed to B, and A's token still replays A's."""
    t = tenants
    b = t.client(t.b)
    mine = b.run_instances(ImageId=IMAGE, InstanceType="t3.micro", MinCount=1, MaxCount=1,
                           ClientToken="shared-token")["Instances"][0]
    try:
        assert mine["InstanceId"] != t.ids["i"]
        again = t.client(t.a).run_instances(
            ImageId=IMAGE, InstanceType="t3.micro", MinCount=1, MaxCount=1,
            SubnetId=t.ids["subnet"], UserData="a-secret-user-data",
            ClientToken="shared-token",
            TagSpecifications=[{"ResourceType": "instance",
                                "Tags": [{"Key": "team", "Value": "a"}]}])
        assert [i["InstanceId"] for i in again["Instances"]] == [t.ids["i"]]
        listed = b.describe_instances()["Reservations"]
        assert {i["InstanceId"] for r in listed for i in r["Instances"]} == {mine["InstanceId"]}
    finally:
        b.terminate_instances(InstanceIds=[mine["InstanceId"]])


def test_keys_revoke_and_rotate_without_a_restart(tenants: Tenants) -> None:
    t = tenants
    account = json.loads(t.cli("accounts", "create", "gamma", "--json"))["account_id"]
    old = _new_key(t.cli, account)
    _wait_accepted(t, old)
    rotated = json.loads(t.cli("keys", "rotate", old.key_id, "--json"))
    new = Key(rotated["access_key_id"], rotated["secret_access_key"])
    _wait_accepted(t, new)
    wait_until("the rotated-out key refused",
               lambda: t.call(old, "DescribeRegions", {})[0] != 200)
    t.cli("keys", "revoke", new.key_id)
    wait_until("the revoked key refused", lambda: t.call(new, "DescribeRegions", {})[0] != 200)
    with pytest.raises(ClientError) as err:
        t.client(new).describe_regions()
    assert err.value.response["Error"]["Code"] == "AuthFailure"
    listed = t.cli("keys", "list", "--account", account)
    assert new.key_id not in listed and old.key_id not in listed
    # Deleting an account revokes its keys.
    last = _new_key(t.cli, account)
    _wait_accepted(t, last)
    assert f"{account}  gamma  keys=1" in t.cli("accounts", "list")
    t.cli("accounts", "delete", account)
    wait_until("the deleted account's key refused",
               lambda: t.call(last, "DescribeRegions", {})[0] != 200)
    assert account not in t.cli("accounts", "list")


def test_secrets_are_sealed_in_the_bucket(tenants: Tenants) -> None:
    """No secret appears in the accounts bucket: only AES-GCM sealed, and `keys list`
    never prints one."""
    t = tenants

    async def every_value() -> bytes:
        nc = await connect([t.cluster.nats.url], name="test-read-accounts")
        try:
            kv = await key_value(nc, subjects.ACCOUNTS_BUCKET)
            return b"".join((await live_entries(kv, timeout=30)).values())
        finally:
            await nc.close()

    raw = t.cluster.run(every_value())
    listed = t.cli("keys", "list", "--json")
    for key in (t.a, t.b, t.admin):
        assert key.key_id.encode() in raw
        assert key.secret.encode() not in raw and key.secret not in listed


def test_accounts_show_reports_usage(tenants: Tenants) -> None:
    t = tenants
    t.cli("accounts", "set-quota", t.a_account, "--vcpus", "standard=64", "--instances", "10")
    shown = json.loads(t.cli("accounts", "show", t.a_account, "--json"))
    assert shown["quotas"] == {"vcpus": {"standard": 64}, "instances": 10}
    assert {k["access_key_id"] for k in shown["keys"]} == {t.a.key_id}
    assert shown["usage"]["vcpus"] == {"standard": 2}  # A's one t3.micro
    assert shown["usage"]["instances"] == 1
    assert "Standard (A, C, D, H, I, M, R, T, Z)" in t.cli("accounts", "show", t.a_account)
