"""The Describe* side of the network: VPCs, subnets, security groups, key pairs and
root volumes, read from the mirrors (`NetworkStore`, `InstanceIndex`) with EC2's
filters. Nothing here waits on a node or the bus."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from roost.domain.errors import (
    InvalidGroupNotFound,
    InvalidKeyPairNotFound,
    InvalidSubnetIDNotFound,
    InvalidVpcIDNotFound,
)
from roost.domain.network import KeyPair, Rule, SecurityGroup, Subnet, Vpc
from roost.gateway.describe import Field, apply_filters
from roost.gateway.index import InstanceIndex
from roost.gateway.netrequests import NamedDescribe
from roost.gateway.network import NetworkStore
from roost.gateway.requests import DescribeRequest, Filter


def _bool(value: bool) -> list[str]:
    return ["true" if value else "false"]


VPC_FIELDS: dict[str, Field[Vpc]] = {
    "vpc-id": lambda v: [v.vpc_id],
    "cidr": lambda v: [v.cidr],
    "cidr-block-association.cidr-block": lambda v: [v.cidr],
    "cidr-block-association.state": lambda v: ["associated"],
    "is-default": lambda v: _bool(v.is_default),
    "isDefault": lambda v: _bool(v.is_default),
    "state": lambda v: ["available"],
    "owner-id": lambda v: [v.owner_id],
    "dhcp-options-id": lambda v: ["default"],
    "ipv6-cidr-block-association.ipv6-cidr-block": lambda v: [v.ipv6_cidr] if v.ipv6_cidr else [],
}


def _subnet_fields(store: NetworkStore) -> dict[str, Field[Subnet]]:
    def free(s: Subnet) -> list[str]:
        return [str(s.capacity - store.addresses_in_use(s.subnet_id))]
    return {
        "subnet-id": lambda s: [s.subnet_id],
        "vpc-id": lambda s: [s.vpc_id],
        "cidr-block": lambda s: [s.cidr],
        "cidr": lambda s: [s.cidr],
        "cidrBlock": lambda s: [s.cidr],
        "availability-zone": lambda s: [s.availability_zone],
        "availabilityZone": lambda s: [s.availability_zone],
        "default-for-az": lambda s: _bool(s.default_for_az),
        "defaultForAz": lambda s: _bool(s.default_for_az),
        "state": lambda s: ["available"],
        "owner-id": lambda s: [s.owner_id],
        "available-ip-address-count": free,
        "map-public-ip-on-launch": lambda s: _bool(s.map_public_ip_on_launch),
        "ipv6-cidr-block-association.ipv6-cidr-block": lambda s: (
            [s.ipv6_cidr] if s.ipv6_cidr else []),
    }


def _rule_fields(rules: Sequence[Rule]) -> dict[str, list[str]]:
    return {
        "protocol": [r.protocol for r in rules],
        "cidr": [r.cidr for r in rules if r.cidr],
        "ipv6-cidr": [r.cidr_v6 for r in rules if r.cidr_v6],
        "from-port": [str(r.from_port) for r in rules if r.from_port is not None],
        "to-port": [str(r.to_port) for r in rules if r.to_port is not None],
        "group-id": [r.group_id for r in rules if r.group_id],
    }


def _group_fields() -> dict[str, Field[SecurityGroup]]:
    fields: dict[str, Field[SecurityGroup]] = {
        "group-id": lambda g: [g.group_id],
        "group-name": lambda g: [g.group_name],
        "description": lambda g: [g.description],
        "vpc-id": lambda g: [g.vpc_id],
        "owner-id": lambda g: [g.owner_id],
    }
    for part in ("protocol", "cidr", "ipv6-cidr", "from-port", "to-port", "group-id"):
        fields[f"ip-permission.{part}"] = (
            lambda g, part=part: _rule_fields(g.ingress)[part])  # type: ignore[misc]
        fields[f"egress.ip-permission.{part}"] = (
            lambda g, part=part: _rule_fields(g.egress)[part])  # type: ignore[misc]
    return fields


GROUP_FIELDS = _group_fields()
KEY_FIELDS: dict[str, Field[KeyPair]] = {
    "key-name": lambda k: [k.key_name],
    "key-pair-id": lambda k: [k.key_pair_id],
    "fingerprint": lambda k: [k.fingerprint],
    "key-type": lambda k: [k.key_type],
}


@dataclass(frozen=True, slots=True)
class NetworkReads:
    store: NetworkStore
    index: InstanceIndex

    def vpcs(self, req: DescribeRequest) -> list[Vpc]:
        found = {v.vpc_id: v for v in self.store.vpcs()}
        missing = [i for i in req.ids if i not in found]
        if missing:
            raise InvalidVpcIDNotFound(f"The vpc ID '{', '.join(missing)}' does not exist")
        chosen = [found[i] for i in dict.fromkeys(req.ids)] if req.ids else found.values()
        return apply_filters(chosen, req.filters, VPC_FIELDS, tags=lambda v: v.tags)

    def subnets(self, req: DescribeRequest) -> list[Subnet]:
        found = {s.subnet_id: s for s in self.store.subnets()}
        missing = [i for i in req.ids if i not in found]
        if missing:
            raise InvalidSubnetIDNotFound(
                f"The subnet ID '{', '.join(missing)}' does not exist")
        chosen = [found[i] for i in dict.fromkeys(req.ids)] if req.ids else found.values()
        return apply_filters(chosen, req.filters, _subnet_fields(self.store),
                             tags=lambda s: s.tags)

    def with_free(self, found: Sequence[Subnet]) -> list[tuple[Subnet, int]]:
        return [(s, s.capacity - self.store.addresses_in_use(s.subnet_id)) for s in found]

    def groups(self, req: DescribeRequest, names: Sequence[str]) -> list[SecurityGroup]:
        groups = self.store.groups()
        by_id = {g.group_id: g for g in groups}
        missing = [i for i in req.ids if i not in by_id]
        default_vpc = self.store.default_vpc.vpc_id
        by_name = {g.group_name: g for g in groups if g.vpc_id == default_vpc}
        missing += [n for n in names if n not in by_name]
        if missing:
            raise InvalidGroupNotFound(
                f"The security group '{', '.join(missing)}' does not exist")
        if req.ids or names:
            chosen = list({g.group_id: g for g in [*(by_id[i] for i in req.ids),
                                                    *(by_name[n] for n in names)]}.values())
        else:
            chosen = groups
        return apply_filters(chosen, req.filters, GROUP_FIELDS, tags=lambda g: g.tags)

    def key_pairs(self, req: NamedDescribe, filters: Sequence[Filter]) -> list[KeyPair]:
        pairs = self.store.key_pairs()
        by_name = {k.key_name: k for k in pairs}
        by_id = {k.key_pair_id: k for k in pairs}
        missing = [n for n in req.names if n not in by_name]
        missing += [i for i in req.ids if i not in by_id]
        if missing:
            raise InvalidKeyPairNotFound(
                f"The key pair '{', '.join(missing)}' does not exist")
        if req.names or req.ids:
            chosen = [*(by_name[n] for n in req.names), *(by_id[i] for i in req.ids)]
        else:
            chosen = sorted(pairs, key=lambda k: k.key_name)
        return apply_filters(chosen, filters, KEY_FIELDS, tags=lambda k: k.tags)
