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
from roost.gateway.describe import Field, apply_filters, page_of
from roost.gateway.netrequests import check_id
from roost.gateway.render import has_interface, interface, interface_id
from roost.gateway.requests import parse_describe_listed
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
    req = parse_describe_listed(c.params, "RouteTableId", "DescribeRouteTables")
    vpcs = [v for v in store.vpcs() if not req.ids or route_table_id(v) in req.ids]
    _missing(req.ids, map(route_table_id, vpcs), InvalidRouteTableIDNotFound, "route table ID")
    page = page_of(apply_filters(vpcs, req.filters, ROUTE_FIELDS), req.page, route_table_id,
                   "rtb")
    subnets = store.subnets()
    return response("DescribeRouteTables", c.request_id,
                    items("routeTableSet", (route_table(v, subnets) for v in page.items)),
                    text("nextToken", page.next_token))


async def describe_network_acls(c: Call) -> str:
    store = c.service.net.store
    req = parse_describe_listed(c.params, "NetworkAclId", "DescribeNetworkAcls")
    vpcs = [v for v in store.vpcs() if not req.ids or network_acl_id(v) in req.ids]
    _missing(req.ids, map(network_acl_id, vpcs), InvalidNetworkAclIDNotFound, "network ACL ID")
    page = page_of(apply_filters(vpcs, req.filters, ACL_FIELDS), req.page, network_acl_id,
                   "acl")
    subnets = store.subnets()
    return response("DescribeNetworkAcls", c.request_id,
                    items("networkAclSet", (network_acl(v, subnets) for v in page.items)),
                    text("nextToken", page.next_token))


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
    req = parse_describe_listed(c.params, "NetworkInterfaceId", "DescribeNetworkInterfaces")
    recs = [r for r in c.service.index.all() if has_interface(r)
            and (not req.ids or interface_id(r.instance_id) in req.ids)]
    _missing(req.ids, (interface_id(r.instance_id) for r in recs),
             InvalidNetworkInterfaceIDNotFound, "network interface ID")
    page = page_of(apply_filters(recs, req.filters, NIC_FIELDS), req.page,
                   lambda r: interface_id(r.instance_id), "eni")
    names = c.service.net.group_names()
    return response("DescribeNetworkInterfaces", c.request_id, items(
        "networkInterfaceSet", (interface(r, names, standalone=True) for r in page.items)),
        text("nextToken", page.next_token))


VPC_EXTRA_ACTIONS: dict[str, Action] = {
    "DescribeRouteTables": describe_route_tables,
    "DescribeNetworkAcls": describe_network_acls,
    "DescribeVpcAttribute": describe_vpc_attribute,
    "DescribeNetworkInterfaces": describe_network_interfaces,
}
