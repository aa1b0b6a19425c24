"""VPCs, subnets, security groups, key pairs and volumes as EC2's XML (2016-11-15)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from roost.domain.network import KeyPair, Rule, SecurityGroup, Subnet, Vpc
from roost.gateway.netservice import CreatedKeyPair
from roost.gateway.xml import Fragment, items, node, response, text, timestamp


def _tags(tags: Mapping[str, str]) -> Fragment:
    if not tags:
        return Fragment("")
    return items("tagSet", (text("key", k) + text("value", v) for k, v in tags.items()))


def _zone_id(region: str, zone: str) -> str:
    compact = re.sub(r"[^a-z0-9]", "", region.lower())
    return f"{compact}-az{ord(zone[-1]) - ord('a') + 1}" if zone[-1:].isalpha() else zone


def ok(action: str, request_id: str) -> str:
    return response(action, request_id, text("return", True))


def vpc(v: Vpc) -> Fragment:
    assoc = (text("cidrBlock", v.cidr) + text("associationId", "vpc-cidr-assoc-" + v.vpc_id[4:])
             + node("cidrBlockState", text("state", "associated")))
    return Fragment("".join([
        text("vpcId", v.vpc_id), text("ownerId", v.owner_id), text("state", "available"),
        text("cidrBlock", v.cidr), items("cidrBlockAssociationSet", [assoc]),
        _ipv6_set(v.ipv6_cidr, "vpc-cidr-assoc-6" + v.vpc_id[5:],
                  text("ipv6Pool", "Amazon")),
        text("dhcpOptionsId", "default"), text("instanceTenancy", v.tenancy),
        text("isDefault", v.is_default), _tags(v.tags),
    ]))


def _ipv6_set(cidr: str, association_id: str, extra: Fragment) -> Fragment:
    if not cidr:
        return Fragment("<ipv6CidrBlockAssociationSet/>")
    return items("ipv6CidrBlockAssociationSet", [
        text("associationId", association_id) + text("ipv6CidrBlock", cidr)
        + node("ipv6CidrBlockState", text("state", "associated")) + extra])


def vpcs(found: Iterable[Vpc], request_id: str, next_token: str | None = None) -> str:
    return response("DescribeVpcs", request_id, items("vpcSet", map(vpc, found)),
                    text("nextToken", next_token))


def created_vpc(v: Vpc, request_id: str, action: str = "CreateVpc") -> str:
    return response(action, request_id, node("vpc", vpc(v)))


def subnet(s: Subnet, free: int, region: str) -> Fragment:
    arn = f"arn:aws:ec2:{region}:{s.owner_id}:subnet/{s.subnet_id}"
    return Fragment("".join([
        text("subnetId", s.subnet_id), text("subnetArn", arn), text("state", "available"),
        text("ownerId", s.owner_id), text("vpcId", s.vpc_id), text("cidrBlock", s.cidr),
        _ipv6_set(s.ipv6_cidr, "subnet-cidr-assoc-6" + s.subnet_id[8:], Fragment("")),
        text("availableIpAddressCount", free),
        text("availabilityZone", s.availability_zone),
        text("availabilityZoneId", _zone_id(region, s.availability_zone)),
        text("defaultForAz", s.default_for_az),
        text("mapPublicIpOnLaunch", s.map_public_ip_on_launch),
        text("mapCustomerOwnedIpOnLaunch", False),
        text("assignIpv6AddressOnCreation", False), text("enableDns64", False),
        text("ipv6Native", False),
        node("privateDnsNameOptionsOnLaunch", text("hostnameType", "ip-name"),
             text("enableResourceNameDnsARecord", False),
             text("enableResourceNameDnsAAAARecord", False)),
        _tags(s.tags),
    ]))


def subnets(found: Iterable[tuple[Subnet, int]], region: str, request_id: str,
            next_token: str | None = None) -> str:
    return response("DescribeSubnets", request_id,
                    items("subnetSet", (subnet(s, free, region) for s, free in found)),
                    text("nextToken", next_token))


def created_subnet(s: Subnet, region: str, request_id: str, action: str = "CreateSubnet"
                   ) -> str:
    return response(action, request_id, node("subnet", subnet(s, s.capacity, region)))


def _permissions(tag: str, rules: Iterable[Rule], owner_id: str) -> Fragment:
    """EC2 groups rules by (protocol, ports) with every source of each listed inside."""
    grouped: dict[tuple[str, int | None, int | None], list[Rule]] = {}
    for r in rules:
        grouped.setdefault((r.protocol, r.from_port, r.to_port), []).append(r)

    def one(key: tuple[str, int | None, int | None], rs: list[Rule]) -> str:
        protocol, low, high = key
        return "".join([
            text("ipProtocol", protocol), text("fromPort", low), text("toPort", high),
            items("groups", (text("userId", owner_id) + text("groupId", r.group_id)
                             + text("description", r.description or None)
                             for r in rs if r.group_id)),
            items("ipRanges", (text("cidrIp", r.cidr) + text("description", r.description or None)
                               for r in rs if r.cidr)),
            items("ipv6Ranges", (text("cidrIpv6", r.cidr_v6)
                                 + text("description", r.description or None)
                                 for r in rs if r.cidr_v6)),
            Fragment("<prefixListIds/>"),
        ])
    return items(tag, (one(k, rs) for k, rs in grouped.items()))


def group(g: SecurityGroup, region: str) -> Fragment:
    return Fragment("".join([
        text("ownerId", g.owner_id), text("groupId", g.group_id),
        text("groupName", g.group_name), text("groupDescription", g.description),
        text("vpcId", g.vpc_id),
        text("securityGroupArn",
             f"arn:aws:ec2:{region}:{g.owner_id}:security-group/{g.group_id}"),
        _permissions("ipPermissions", g.ingress, g.owner_id),
        _permissions("ipPermissionsEgress", g.egress, g.owner_id),
        _tags(g.tags),
    ]))


def groups(found: Iterable[SecurityGroup], region: str, request_id: str,
           next_token: str | None = None) -> str:
    return response("DescribeSecurityGroups", request_id,
                    items("securityGroupInfo", (group(g, region) for g in found)),
                    text("nextToken", next_token))


def created_group(g: SecurityGroup, region: str, request_id: str) -> str:
    return response("CreateSecurityGroup", request_id, text("return", True),
                    text("groupId", g.group_id), _tags(g.tags),
                    text("securityGroupArn",
                         f"arn:aws:ec2:{region}:{g.owner_id}:security-group/{g.group_id}"))


def rules_changed(action: str, g: SecurityGroup, rules: Iterable[Rule], *, egress: bool,
                  request_id: str) -> str:
    def one(i: int, r: Rule) -> str:
        return "".join([
            text("securityGroupRuleId", f"sgr-{g.group_id[3:]}{i:x}"[:21]),
            text("groupId", g.group_id), text("groupOwnerId", g.owner_id),
            text("isEgress", egress), text("ipProtocol", r.protocol),
            text("fromPort", r.from_port if r.from_port is not None else -1),
            text("toPort", r.to_port if r.to_port is not None else -1),
            text("cidrIpv4", r.cidr or None), text("cidrIpv6", r.cidr_v6 or None),
            node("referencedGroupInfo", text("groupId", r.group_id),
                 text("userId", g.owner_id)) if r.group_id else "",
            text("description", r.description or None),
        ])
    body = [text("return", True)]
    if not action.startswith("Revoke"):
        body.append(items("securityGroupRuleSet", (one(i, r) for i, r in enumerate(rules))))
    return response(action, request_id, *body)


def key_pair_created(made: CreatedKeyPair, request_id: str) -> str:
    k = made.pair
    return response("CreateKeyPair", request_id, text("keyName", k.key_name),
                    text("keyFingerprint", k.fingerprint),
                    text("keyMaterial", made.private_key), text("keyPairId", k.key_pair_id),
                    _tags(k.tags))


def key_pair_imported(k: KeyPair, request_id: str) -> str:
    return response("ImportKeyPair", request_id, text("keyFingerprint", k.fingerprint),
                    text("keyName", k.key_name), text("keyPairId", k.key_pair_id),
                    _tags(k.tags))


def key_pairs(found: Iterable[KeyPair], *, public: bool, request_id: str) -> str:
    return response("DescribeKeyPairs", request_id, items("keySet", (
        text("keyPairId", k.key_pair_id) + text("keyFingerprint", k.fingerprint)
        + text("keyName", k.key_name) + text("keyType", k.key_type) + _tags(k.tags)
        + text("publicKey", k.public_key if public else None)
        + text("createTime", timestamp(k.created) if k.created else None)
        for k in found
    )))


def deleted_key_pair(pair_id: str, request_id: str) -> str:
    return response("DeleteKeyPair", request_id, text("return", True),
                    text("keyPairId", pair_id or None))
