"""What a VPC has without being asked: its main route table, its default network ACL,
its DNS attributes, and the network interfaces of the instances in it. All are derived
from the VPCs and instances roost records (ids from the VPC id), nothing is stored, and
none of it routes or filters a packet (docs/gateway.md)."""

from __future__ import annotations

from collections.abc import Iterable

from roost.bus.schemas import InstanceRecord
from roost.domain.errors import (
    ClientError,
    InvalidNetworkAclIDNotFound,
    InvalidNetworkInterfaceIDNotFound,
    InvalidParameterValue,
    InvalidRouteTableIDNotFound,
)
from roost.domain.network import Subnet, Vpc
from roost.gateway.call import Action, Call
from roost.gateway.describe import Field, apply_filters
from roost.gateway.netrequests import check_id
from roost.gateway.render import has_interface, interface, interface_id
from roost.gateway.requests import filters
from roost.gateway.xml import Fragment, items, node, response, text


def route_table_id(vpc: Vpc) -> str:
    return "rtb-" + vpc.vpc_id[4:]


def network_acl_id(vpc: Vpc) -> str:
    return "acl-" + vpc.vpc_id[4:]


ROUTE_FIELDS: dict[str, Field[Vpc]] = {
    "vpc-id": lambda v: [v.vpc_id],
    "route-table-id": lambda v: [route_table_id(v)],
    "association.main": lambda v: ["true"],
    "owner-id": lambda v: [v.owner_id],
}
ACL_FIELDS: dict[str, Field[Vpc]] = {
    "vpc-id": lambda v: [v.vpc_id],
    "network-acl-id": lambda v: [network_acl_id(v)],
    "default": lambda v: ["true"],
    "owner-id": lambda v: [v.owner_id],
}
NIC_FIELDS: dict[str, Field[InstanceRecord]] = {
    "network-interface-id": lambda r: [interface_id(r.instance_id)],
    "attachment.instance-id": lambda r: [r.instance_id],
    "attachment.status": lambda r: ["attached"],
    "subnet-id": lambda r: [r.net.subnet_id],
    "vpc-id": lambda r: [r.net.vpc_id],
    "group-id": lambda r: r.net.security_group_ids,
    "private-ip-address": lambda r: [r.private_ip],
    "addresses.private-ip-address": lambda r: [r.private_ip],
    "availability-zone": lambda r: [r.availability_zone],
    "status": lambda r: ["in-use"],
    "owner-id": lambda r: [r.owner_id],
    "description": lambda r: [""],
    "requester-managed": lambda r: ["false"],
}


def _missing(wanted: Iterable[str], found: Iterable[str], error: type[ClientError],
             what: str) -> None:
    gone = sorted(set(wanted) - set(found))
    if gone:
        raise error(f"The {what} '{', '.join(gone)}' does not exist")


def route_table(v: Vpc, subnets: Iterable[Subnet]) -> Fragment:
    rtb = route_table_id(v)
    route = (text("destinationCidrBlock", v.cidr) + text("gatewayId", "local")
             + text("state", "active") + text("origin", "CreateRouteTable"))
    main = (text("routeTableAssociationId", "rtbassoc-" + v.vpc_id[4:])
            + text("routeTableId", rtb) + text("main", True)
            + node("associationState", text("state", "associated")))
    del subnets  # subnets use the main table implicitly, as EC2 lists them: not at all
    return Fragment("".join([
        text("routeTableId", rtb), text("vpcId", v.vpc_id), text("ownerId", v.owner_id),
        items("routeSet", [route]), items("associationSet", [main]),
        Fragment("<propagatingVgwSet/>"), Fragment("<tagSet/>"),
    ]))


def network_acl(v: Vpc, subnets: Iterable[Subnet]) -> Fragment:
    def entry(number: int, action: str, egress: bool) -> str:
        return (text("ruleNumber", number) + text("protocol", "-1")
                + text("ruleAction", action) + text("egress", egress)
                + text("cidrBlock", "0.0.0.0/0"))
    acl = network_acl_id(v)
    entries = [entry(n, a, e) for e in (True, False) for n, a in ((100, "allow"),
                                                                (32767, "deny"))]
    assoc = [text("networkAclAssociationId", "aclassoc-" + s.subnet_id[7:])
             + text("networkAclId", acl) + text("subnetId", s.subnet_id)
             for s in subnets if s.vpc_id == v.vpc_id]
    return Fragment("".join([
        text("networkAclId", acl), text("vpcId", v.vpc_id), text("default", True),
        items("entrySet", entries), items("associationSet", assoc), Fragment("<tagSet/>"),
        text("ownerId", v.owner_id),
    ]))


async def describe_route_tables(c: Call) -> str:
    store = c.service.net.store
    wanted = c.params.values("RouteTableId")
    vpcs = [v for v in store.vpcs() if not wanted or route_table_id(v) in wanted]
    _missing(wanted, map(route_table_id, vpcs), InvalidRouteTableIDNotFound, "route table ID")
    found = apply_filters(vpcs, filters(c.params), ROUTE_FIELDS)
    subnets = store.subnets()
    return response("DescribeRouteTables", c.request_id,
                    items("routeTableSet", (route_table(v, subnets) for v in found)))


async def describe_network_acls(c: Call) -> str:
    store = c.service.net.store
    wanted = c.params.values("NetworkAclId")
    vpcs = [v for v in store.vpcs() if not wanted or network_acl_id(v) in wanted]
    _missing(wanted, map(network_acl_id, vpcs), InvalidNetworkAclIDNotFound, "network ACL ID")
    found = apply_filters(vpcs, filters(c.params), ACL_FIELDS)
    subnets = store.subnets()
    return response("DescribeNetworkAcls", c.request_id,
                    items("networkAclSet", (network_acl(v, subnets) for v in found)))


_VPC_ATTRIBUTES = ("enableDnsSupport", "enableDnsHostnames",
                   "enableNetworkAddressUsageMetrics")


async def describe_vpc_attribute(c: Call) -> str:
    vpc = c.service.net.vpc(check_id("vpc", c.params.require("VpcId")))
    attribute = c.params.require("Attribute")
    if attribute not in _VPC_ATTRIBUTES:
        raise InvalidParameterValue(f"Value ({attribute[:80]}) for parameter attribute is "
                                    f"invalid. Valid values: {', '.join(_VPC_ATTRIBUTES)}.")
    value = {"enableDnsSupport": True, "enableDnsHostnames": vpc.is_default}.get(attribute,
                                                                                False)
    return response("DescribeVpcAttribute", c.request_id, text("vpcId", vpc.vpc_id),
                    node(attribute, text("value", value)))


async def describe_network_interfaces(c: Call) -> str:
    wanted = c.params.values("NetworkInterfaceId")
    recs = [r for r in c.service.index.all() if has_interface(r)
            and (not wanted or interface_id(r.instance_id) in wanted)]
    _missing(wanted, (interface_id(r.instance_id) for r in recs),
             InvalidNetworkInterfaceIDNotFound, "network interface ID")
    found = apply_filters(recs, filters(c.params), NIC_FIELDS)
    names = c.service.net.group_names()
    return response("DescribeNetworkInterfaces", c.request_id, items(
        "networkInterfaceSet", (interface(r, names, standalone=True) for r in found)))


VPC_EXTRA_ACTIONS: dict[str, Action] = {
    "DescribeRouteTables": describe_route_tables,
    "DescribeNetworkAcls": describe_network_acls,
    "DescribeVpcAttribute": describe_vpc_attribute,
    "DescribeNetworkInterfaces": describe_network_interfaces,
}
