"""The network actions, three lines each as in `actions`: parse, act, render."""

from __future__ import annotations

from roost.gateway import netrender as nr
from roost.gateway import netrequests as nq
from roost.gateway import requests as rq
from roost.gateway.call import Action, Call
from roost.gateway.describe import page_of


def _region(c: Call) -> str:
    return c.service.site.region


async def create_vpc(c: Call) -> str:
    vpc = await c.service.net.create_vpc(nq.parse_create_vpc(c.params))
    return nr.created_vpc(vpc, c.request_id)


async def delete_vpc(c: Call) -> str:
    await c.service.net.delete_vpc(nq.parse_id(c.params, "VpcId", "vpc"))
    return nr.ok("DeleteVpc", c.request_id)


async def create_default_vpc(c: Call) -> str:
    vpc = await c.service.net.create_default_vpc(c.service.zones())
    return nr.created_vpc(vpc, c.request_id, "CreateDefaultVpc")


async def create_default_subnet(c: Call) -> str:
    zone = c.params.require("AvailabilityZone")
    subnet = await c.service.net.create_default_subnet(zone, c.service.zones())
    return nr.created_subnet(subnet, _region(c), c.request_id, "CreateDefaultSubnet")


async def describe_vpcs(c: Call) -> str:
    req = rq.parse_describe_listed(c.params, "VpcId", "DescribeVpcs")
    page = page_of(c.reads.net.vpcs(req), req.page, key=lambda v: v.vpc_id, kind="vpc")
    return nr.vpcs(page.items, c.request_id, page.next_token)


async def create_subnet(c: Call) -> str:
    subnet = await c.service.net.create_subnet(nq.parse_create_subnet(c.params), c.service.zones())
    return nr.created_subnet(subnet, _region(c), c.request_id)


async def delete_subnet(c: Call) -> str:
    subnet_id = nq.parse_id(c.params, "SubnetId", "subnet")
    await c.service.net.delete_subnet(subnet_id, c.service.index.all())
    return nr.ok("DeleteSubnet", c.request_id)


async def modify_subnet_attribute(c: Call) -> str:
    subnet_id, value = nq.parse_modify_subnet_attribute(c.params)
    await c.service.net.set_map_public_ip(subnet_id, value)
    return nr.ok("ModifySubnetAttribute", c.request_id)


async def describe_subnets(c: Call) -> str:
    req = rq.parse_describe_listed(c.params, "SubnetId", "DescribeSubnets")
    page = page_of(c.reads.net.subnets(req), req.page, key=lambda s: s.subnet_id,
                   kind="subnet")
    return nr.subnets(c.reads.net.with_free(list(page.items)), _region(c), c.request_id,
                      page.next_token)


async def create_security_group(c: Call) -> str:
    group = await c.service.net.create_group(nq.parse_create_group(c.params))
    return nr.created_group(group, _region(c), c.request_id)


async def delete_security_group(c: Call) -> str:
    await c.service.net.delete_group(nq.parse_group_ref(c.params), c.service.index.all())
    return nr.ok("DeleteSecurityGroup", c.request_id)


async def describe_security_groups(c: Call) -> str:
    req = rq.parse_describe_listed(c.params, "GroupId", "DescribeSecurityGroups")
    page = page_of(c.reads.net.groups(req, c.params.values("GroupName")), req.page,
                   key=lambda g: g.group_id, kind="sg")
    return nr.groups(page.items, _region(c), c.request_id, page.next_token)


def _rules(action: str, *, egress: bool, revoke: bool) -> Action:
    async def handle(c: Call) -> str:
        req = nq.parse_permissions(c.params, egress=egress)
        group = await c.service.net.change_rules(req, revoke=revoke)
        return nr.rules_changed(action, group, req.rules, egress=egress,
                                request_id=c.request_id)
    return handle


async def create_key_pair(c: Call) -> str:
    made = await c.service.net.create_key_pair(nq.parse_create_key_pair(c.params))
    return nr.key_pair_created(made, c.request_id)


async def import_key_pair(c: Call) -> str:
    pair = await c.service.net.import_key_pair(nq.parse_import_key_pair(c.params))
    return nr.key_pair_imported(pair, c.request_id)


async def delete_key_pair(c: Call) -> str:
    names = nq.parse_key_names(c.params)
    await c.service.net.delete_key_pair(c.params.get("KeyName") or "",
                                        c.params.get("KeyPairId") or "")
    return nr.deleted_key_pair(next(iter(names.ids), ""), c.request_id)


async def describe_key_pairs(c: Call) -> str:
    found = c.reads.net.key_pairs(nq.parse_key_names(c.params), rq.filters(c.params))
    return nr.key_pairs(found, public=c.params.flag("IncludePublicKey"), request_id=c.request_id)


NETWORK_ACTIONS: dict[str, Action] = {
    "CreateVpc": create_vpc,
    "DeleteVpc": delete_vpc,
    "DescribeVpcs": describe_vpcs,
    "CreateDefaultVpc": create_default_vpc,
    "CreateDefaultSubnet": create_default_subnet,
    "CreateSubnet": create_subnet,
    "DeleteSubnet": delete_subnet,
    "DescribeSubnets": describe_subnets,
    "ModifySubnetAttribute": modify_subnet_attribute,
    "CreateSecurityGroup": create_security_group,
    "DeleteSecurityGroup": delete_security_group,
    "DescribeSecurityGroups": describe_security_groups,
    "AuthorizeSecurityGroupIngress": _rules("AuthorizeSecurityGroupIngress", egress=False,
                                            revoke=False),
    "AuthorizeSecurityGroupEgress": _rules("AuthorizeSecurityGroupEgress", egress=True,
                                           revoke=False),
    "RevokeSecurityGroupIngress": _rules("RevokeSecurityGroupIngress", egress=False,
                                         revoke=True),
    "RevokeSecurityGroupEgress": _rules("RevokeSecurityGroupEgress", egress=True,
                                        revoke=True),
    "CreateKeyPair": create_key_pair,
    "ImportKeyPair": import_key_pair,
    "DeleteKeyPair": delete_key_pair,
    "DescribeKeyPairs": describe_key_pairs,
}
