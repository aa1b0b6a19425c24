"""VPCs, subnets, security groups and key pairs: typed requests in, records or EC2 errors
out. What is stored where is `roost.gateway.network`'s business; what RunInstances
needs from here is `place`: the subnet, groups, key and addresses of a launch.

Recorded, not enforced: no packet is routed or filtered by any of this (docs/gateway.md).
"""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

import msgspec

from roost.bus.schemas import InstanceNetwork, InstanceRecord
from roost.domain.errors import (
    CannotDelete,
    DefaultSubnetAlreadyExistsInAvailabilityZone,
    DefaultVpcAlreadyExists,
    DefaultVpcDoesNotExist,
    DependencyViolation,
    IncorrectInstanceState,
    InvalidGroupDuplicate,
    InvalidGroupNotFound,
    InvalidGroupReserved,
    InvalidInput,
    InvalidKeyPairDuplicate,
    InvalidKeyPairNotFound,
    InvalidParameter,
    InvalidParameterValue,
    InvalidPermissionDuplicate,
    InvalidPermissionNotFound,
    InvalidSubnetConflict,
    InvalidSubnetIDNotFound,
    InvalidSubnetRange,
    InvalidVpcIDNotFound,
    InvalidVpcRange,
    MissingInput,
    OperationNotPermitted,
    VPCIdNotSpecified,
)
from roost.domain.images import Image
from roost.domain.network import (
    ALLOW_ALL_EGRESS,
    KeyPair,
    SecurityGroup,
    Subnet,
    Vpc,
    check_block,
    check_ipv6_subnet,
    default_group,
    default_subnet,
)
from roost.gateway.keys import import_public_key, new_key_pair
from roost.gateway.netrequests import (
    CreateGroupRequest,
    CreateSubnetRequest,
    CreateVpcRequest,
    GroupRef,
    KeyPairRequest,
    LaunchNetwork,
    PermissionsRequest,
)
from roost.gateway.network import NetworkStore
from roost.gateway.tagging import changed
from roost.gateway.tenancy import account, caller

R = TypeVar("R", Vpc, Subnet, SecurityGroup)

CLAIMS_AT_ONCE = 8
"""Address claims of one launch in flight at once: a launch of 50 waits for 7 round
trips, not 50, and does not put 50 writes on a loaded bus at one time (with 32 such
launches in flight, writes queued past nats-py's 5 s timeout)."""


NO_DEFAULT_VPC = ("No default VPC for this user. GroupName is only supported for EC2-Classic "
                  "and default VPC.")


def _shared_defaults(what: str) -> None:
    """The region's default VPC and its default subnets are every account's (roost has
    one default VPC a region, not one an account): only an admin key may delete or
    create them again."""
    who = caller()
    if who is not None and not who.admin:
        raise OperationNotPermitted(
            f"The region's default VPC and default subnets are shared by every account: "
            f"only an operator's admin key may {what} them.")


def _zone_check(zone: str, zones: Sequence[str]) -> None:
    if zone not in zones:
        raise InvalidParameterValue(f"Value ({zone[:80]}) for parameter "
                                    "availabilityZone is invalid. Subnets can currently "
                                    f"only be created in: {', '.join(zones)}.")


def _new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(9)[:17]}"


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a launch goes on the network: one address per instance, in launch order."""

    subnet: Subnet
    network: InstanceNetwork
    addresses: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CreatedKeyPair:
    pair: KeyPair
    private_key: str


class NetworkService:
    def __init__(self, store: NetworkStore) -> None:
        self.store = store

    # -- lookups that answer EC2's NotFound -----------------------------------------

    def vpc(self, vpc_id: str) -> Vpc:
        found = self.store.vpc(vpc_id)
        if found is None:
            raise InvalidVpcIDNotFound(f"The vpc ID '{vpc_id}' does not exist")
        return found

    def subnet(self, subnet_id: str) -> Subnet:
        found = self.store.subnet(subnet_id)
        if found is None:
            raise InvalidSubnetIDNotFound(f"The subnet ID '{subnet_id}' does not exist")
        return found

    def group(self, ref: GroupRef) -> SecurityGroup:
        if ref.group_id:
            found = self.store.group(ref.group_id)
            name = ref.group_id
        else:
            found = self.store.group_named(self.store.default_vpc.vpc_id, ref.group_name)
            name = ref.group_name
        if found is None:
            raise InvalidGroupNotFound(f"The security group '{name}' does not exist")
        return found

    def key_pair(self, name: str) -> KeyPair:
        found = self.store.key_pair(name)
        if found is None:
            raise InvalidKeyPairNotFound(f"The key pair '{name}' does not exist")
        return found

    def group_names(self) -> dict[str, str]:
        return {g.group_id: g.group_name for g in self.store.groups()}

    # -- tags -------------------------------------------------------------------------

    def _taggable(self, rid: str) -> Vpc | Subnet | SecurityGroup:
        if rid.startswith("vpc-"):
            return self.vpc(rid)
        if rid.startswith("subnet-"):
            return self.subnet(rid)
        return self.group(GroupRef(group_id=rid))

    def require_taggable(self, ids: Sequence[str]) -> list[Vpc | Subnet | SecurityGroup]:
        return [self._taggable(rid) for rid in ids]

    async def change_tags(self, rid: str, change: Mapping[str, str | None], *,
                          delete: bool) -> None:
        """CreateTags/DeleteTags on a VPC, subnet or group: the record is rewritten
        with compare-and-set (a derived default is stored from then on), the tag limit
        checked against the record each try writes over (`tagging.changed`)."""
        def edit(rec: R) -> R:
            return msgspec.structs.replace(
                rec, tags=changed(rid, rec.tags, change, delete=delete))

        base = self._taggable(rid)
        if isinstance(base, Vpc):
            await self.store.change(rid, base, edit)
        elif isinstance(base, Subnet):
            await self.store.change(rid, base, edit)
        else:
            await self.store.change(rid, base, edit)

    # -- VPCs and subnets -------------------------------------------------------------

    async def create_vpc(self, req: CreateVpcRequest) -> Vpc:
        net = check_block(req.cidr)
        if net is None:
            raise InvalidVpcRange(f"The CIDR '{req.cidr[:80]}' is invalid.")
        vpc = Vpc(_new_id("vpc"), str(net), account(self.store.owner_id), tags=dict(req.tags),
                  tenancy=req.tenancy)
        if req.ipv6:
            vpc = msgspec.structs.replace(
                vpc, ipv6_cidr=await self.store.claim_ipv6_block(vpc.vpc_id))
        try:
            await self.store.create(vpc)
        except Exception:
            if vpc.ipv6_cidr:
                await self.store.release_ipv6_block(vpc.vpc_id, vpc.ipv6_cidr)
            raise
        group = default_group(vpc)
        await self.store.create(group)
        await self.store.claim_name(vpc.vpc_id, "default", group.group_id)
        return vpc

    async def delete_vpc(self, vpc_id: str) -> None:
        vpc = self.vpc(vpc_id)
        if vpc.is_default:
            _shared_defaults("delete")
        if any(s.vpc_id == vpc_id for s in self.store.subnets()):
            raise DependencyViolation(
                f"The vpc '{vpc_id}' has dependencies and cannot be deleted.")
        groups = [g for g in self.store.groups() if g.vpc_id == vpc_id]
        if any(not g.is_default for g in groups):
            raise DependencyViolation(
                f"The vpc '{vpc_id}' has dependencies and cannot be deleted.")
        for g in groups:
            await self.store.remove(g.group_id)
            await self.store.release_name(vpc_id, g.group_name, g.owner_id)
        if vpc.is_default:
            await self.store.mark_removed(self.store.default_vpc, removed=True, already=(
                InvalidVpcIDNotFound(f"The vpc ID '{vpc_id}' does not exist")))
            return
        await self.store.remove(vpc_id)
        if vpc.ipv6_cidr:
            await self.store.release_ipv6_block(vpc_id, vpc.ipv6_cidr)

    async def create_subnet(self, req: CreateSubnetRequest, zones: Sequence[str]) -> Subnet:
        vpc = self.vpc(req.vpc_id)
        net = check_block(req.cidr)
        vpc_net = check_block(vpc.cidr)
        if net is None or vpc_net is None or not net.subnet_of(vpc_net):
            raise InvalidSubnetRange(f"The CIDR '{req.cidr[:80]}' is invalid.")
        for other in self.store.subnets():
            if other.vpc_id == vpc.vpc_id and other.network.overlaps(net):
                raise InvalidSubnetConflict(
                    f"The CIDR '{req.cidr}' conflicts with another subnet")
        ipv6 = ""
        if req.ipv6_cidr:
            found = check_ipv6_subnet(req.ipv6_cidr, vpc.ipv6_cidr)
            if found is None:
                raise InvalidSubnetRange(f"The IPv6 CIDR '{req.ipv6_cidr[:80]}' is invalid: "
                                         "a /64 of the VPC's IPv6 block.")
            if any(o.vpc_id == vpc.vpc_id and o.ipv6_cidr
                   and ipaddress.IPv6Network(o.ipv6_cidr).overlaps(found)
                   for o in self.store.subnets()):
                raise InvalidSubnetConflict(
                    f"The CIDR '{req.ipv6_cidr}' conflicts with another subnet")
            ipv6 = str(found)
        zone = req.availability_zone or zones[0]
        _zone_check(zone, zones)
        subnet = Subnet(_new_id("subnet"), vpc.vpc_id, str(net), zone, account(self.store.owner_id),
                        tags=dict(req.tags), ipv6_cidr=ipv6)
        await self.store.create(subnet)
        return subnet

    async def set_map_public_ip(self, subnet_id: str, value: bool) -> None:
        """ModifySubnetAttribute MapPublicIpOnLaunch (compare-and-set on the record; a
        default subnet is stored from then on)."""
        base = self.subnet(subnet_id)
        await self.store.change(subnet_id, base, lambda rec: msgspec.structs.replace(
            rec, map_public_ip_on_launch=value))

    async def delete_subnet(self, subnet_id: str, instances: Iterable[InstanceRecord]) -> None:
        subnet = self.subnet(subnet_id)
        default = subnet.default_for_az and subnet.vpc_id == self.store.default_vpc.vpc_id
        if default:
            _shared_defaults("delete")
        if any(r.net.subnet_id == subnet_id and r.state != "terminated" for r in instances):
            raise DependencyViolation(
                f"The subnet '{subnet_id}' has dependencies and cannot be deleted.")
        if default:
            await self.store.mark_removed(subnet, removed=True, already=(
                InvalidSubnetIDNotFound(f"The subnet ID '{subnet_id}' does not exist")))
            return
        await self.store.remove(subnet_id)

    async def create_default_vpc(self, zones: Sequence[str]) -> Vpc:
        """CreateDefaultVpc: the region's default VPC again, with a default subnet in
        every zone, after it was deleted (roost gives it back its derived id)."""
        _shared_defaults("create")
        store = self.store
        vpc = await store.mark_removed(store.default_vpc, removed=False, already=(
            DefaultVpcAlreadyExists(
                "A Default VPC already exists for this account in this region.")))
        for zone in zones:
            subnet = default_subnet(vpc, store.region, zone)
            if store.removed(subnet.subnet_id):
                await store.mark_removed(subnet, removed=False)
        return vpc

    async def create_default_subnet(self, zone: str, zones: Sequence[str]) -> Subnet:
        """CreateDefaultSubnet: a zone's default subnet again, in the default VPC."""
        _shared_defaults("create")
        store = self.store
        if not store.has_default_vpc:
            raise DefaultVpcDoesNotExist(
                "No default VPC exists for this account in this region.")
        _zone_check(zone, zones)
        subnet = default_subnet(store.default_vpc, store.region, zone)
        taken = DefaultSubnetAlreadyExistsInAvailabilityZone(
            f"'{subnet.subnet_id}' is already the default subnet in {zone}.")
        if not store.removed(subnet.subnet_id):
            raise taken
        for other in store.subnets():
            if other.vpc_id == subnet.vpc_id and other.network.overlaps(subnet.network):
                raise InvalidSubnetConflict(
                    f"The CIDR '{subnet.cidr}' of the default subnet of {zone} conflicts "
                    f"with subnet '{other.subnet_id}'")
        return await store.mark_removed(subnet, removed=False, already=taken)

    # -- security groups --------------------------------------------------------------

    async def create_group(self, req: CreateGroupRequest) -> SecurityGroup:
        if not req.vpc_id and not self.store.has_default_vpc:
            raise VPCIdNotSpecified(NO_DEFAULT_VPC)
        vpc = self.vpc(req.vpc_id) if req.vpc_id else self.store.default_vpc
        if req.name == "default":
            raise InvalidGroupReserved("The security group 'default' is reserved.")
        gid = _new_id("sg")
        if self.store.group_named(vpc.vpc_id, req.name) is not None or \
                not await self.store.claim_name(vpc.vpc_id, req.name, gid):
            raise InvalidGroupDuplicate(
                f"The security group '{req.name}' already exists for VPC '{vpc.vpc_id}'")
        group = SecurityGroup(gid, req.name, req.description, vpc.vpc_id,
                              account(self.store.owner_id), egress=(ALLOW_ALL_EGRESS,),
                              tags=dict(req.tags))
        try:
            await self.store.create(group)
        except Exception:
            await self.store.release_name(vpc.vpc_id, req.name, group.owner_id)
            raise
        return group

    async def delete_group(self, ref: GroupRef, instances: Iterable[InstanceRecord]) -> None:
        group = self.group(ref)
        if group.is_default:
            raise CannotDelete(f"the specified group: \"{group.group_id}\" name: "
                               "\"default\" cannot be deleted by a user")
        gid = group.group_id
        users = any(gid in r.net.security_group_ids and r.state != "terminated"
                    for r in instances)
        referenced = any(rule.group_id == gid for g in self.store.groups() if g.group_id != gid
                         for rule in (*g.ingress, *g.egress))
        if users or referenced:
            raise DependencyViolation(f"resource {gid} has a dependent object")
        await self.store.remove(gid)
        await self.store.release_name(group.vpc_id, group.group_name, group.owner_id)

    async def change_rules(self, req: PermissionsRequest, *, revoke: bool) -> SecurityGroup:
        group = self.group(req.group)
        for rule in req.rules:
            if rule.group_id and self.store.group(rule.group_id) is None:
                raise InvalidGroupNotFound(
                    f"The security group '{rule.group_id}' does not exist")

        def edit(g: SecurityGroup) -> SecurityGroup:
            current = list(g.egress if req.egress else g.ingress)
            keys = [r.key() for r in current]
            for rule in req.rules:
                if revoke:
                    if rule.key() not in keys:
                        raise InvalidPermissionNotFound(
                            "The specified rule does not exist in this security group.")
                    i = keys.index(rule.key())
                    del current[i], keys[i]
                else:
                    if rule.key() in keys:
                        raise InvalidPermissionDuplicate(
                            "the specified rule already exists")
                    current.append(rule)
                    keys.append(rule.key())
            field = "egress" if req.egress else "ingress"
            return msgspec.structs.replace(g, **{field: tuple(current)})

        return await self.store.change(group.group_id, group, edit)

    # -- key pairs --------------------------------------------------------------------

    async def create_key_pair(self, req: KeyPairRequest) -> CreatedKeyPair:
        if self.store.key_pair(req.name) is not None:
            raise InvalidKeyPairDuplicate(f"The keypair '{req.name}' already exists.")
        made = new_key_pair(req.key_type)
        pair = KeyPair(req.name, _new_id("key"), made.fingerprint, made.public_key,
                       req.key_type, _now(), dict(req.tags))
        if not await self.store.create_key_pair(pair):
            raise InvalidKeyPairDuplicate(f"The keypair '{req.name}' already exists.")
        return CreatedKeyPair(pair, made.private_key)

    async def import_key_pair(self, req: KeyPairRequest) -> KeyPair:
        key_type, fingerprint = import_public_key(req.public_key)
        if self.store.key_pair(req.name) is not None:
            raise InvalidKeyPairDuplicate(f"The keypair '{req.name}' already exists.")
        pair = KeyPair(req.name, _new_id("key"), fingerprint, req.public_key, key_type,
                       _now(), dict(req.tags))
        if not await self.store.create_key_pair(pair):
            raise InvalidKeyPairDuplicate(f"The keypair '{req.name}' already exists.")
        return pair

    async def delete_key_pair(self, name: str, pair_id: str) -> None:
        """Deleting a key that does not exist succeeds, as on EC2."""
        if pair_id and not name:
            found = next((k for k in self.store.key_pairs() if k.key_pair_id == pair_id), None)
            if found is None:
                raise InvalidKeyPairNotFound(f"The key pair '{pair_id}' does not exist")
            name = found.key_name
        found = self.store.key_pair(name)
        if found is not None:
            await self.store.delete_key_pair(found)

    async def set_groups(self, rec: InstanceRecord, group_ids: Sequence[str]) -> None:
        """ModifyInstanceAttribute GroupId.N: groups of the instance's own VPC."""
        if rec.network is None or rec.state == "terminated":
            raise IncorrectInstanceState(
                f"The instance '{rec.instance_id}' has no network interface to change.")
        for gid in group_ids:
            group = self.group(GroupRef(group_id=gid))
            if group.vpc_id != rec.network.vpc_id:
                raise InvalidParameter(f"Security group {gid} and instance "
                                       f"{rec.instance_id} belong to different networks.")
        await self.store.set_instance_groups(rec.instance_id, list(dict.fromkeys(group_ids)))

    # -- launches ---------------------------------------------------------------------

    def default_subnet(self, zone: str) -> Subnet:
        """The subnet a launch that names none goes to: the zone's default subnet, or
        EC2's errors when there is none."""
        if not self.store.has_default_vpc:
            raise VPCIdNotSpecified(NO_DEFAULT_VPC)
        found = self.store.default_subnet_for(zone)
        if found is not None:
            return found
        if not self.store.default_subnets():
            raise MissingInput(f"No subnets found for the default VPC "
                               f"'{self.store.default_vpc.vpc_id}'. Please specify a subnet.")
        raise InvalidInput(f"No default subnet for availability zone: '{zone}'.")

    def resolve(self, req: LaunchNetwork, zone: str, image: Image
                ) -> tuple[Subnet, InstanceNetwork]:
        """Check what a launch names (subnet, groups, key) and fill EC2's defaults.
        ``zone`` is the zone asked for, or the one chosen, when no subnet is given.
        The mappings are checked first: they are the request's own form, which EC2
        checks before it looks anything up."""
        root, volumes = req.devices(image)
        if req.subnet_id:
            subnet = self.subnet(req.subnet_id)
            if zone and zone != subnet.availability_zone:
                raise InvalidParameterValue(
                    f"Value ({zone}) for parameter availabilityZone is invalid. Subnet "
                    f"'{subnet.subnet_id}' is in the availability zone "
                    f"{subnet.availability_zone}")
        else:
            subnet = self.default_subnet(zone)
        if req.ipv6_count and not subnet.ipv6_cidr:
            raise InvalidParameterValue(
                f"The subnet '{subnet.subnet_id}' has no IPv6 CIDR block: it cannot give "
                f"{req.ipv6_count} IPv6 address(es).")
        groups = [self.group(GroupRef(group_id=g)) for g in req.group_ids]
        for name in req.group_names:
            found = self.store.group_named(subnet.vpc_id, name)
            if found is None:
                raise InvalidGroupNotFound(f"The security group '{name}' does not exist in "
                                           f"VPC '{subnet.vpc_id}'")
            groups.append(found)
        for g in groups:
            if g.vpc_id != subnet.vpc_id:
                raise InvalidParameter(f"Security group {g.group_id} and subnet "
                                       f"{subnet.subnet_id} belong to different networks.")
        if not groups:
            default = self.store.group_named(subnet.vpc_id, "default")
            groups = [default] if default is not None else []
        public_key = self.key_pair(req.key_name).public_key if req.key_name else ""
        network = InstanceNetwork(
            subnet_id=subnet.subnet_id, vpc_id=subnet.vpc_id,
            security_group_ids=list(dict.fromkeys(g.group_id for g in groups)),
            key_name=req.key_name, public_key=public_key,
            root_device_name=image.root_device_name,
            root_volume_size=root.size or image.root_volume_size,
            root_volume_type=root.volume_type or "gp2", root_volume_iops=root.iops,
            root_volume_throughput=root.throughput, root_volume_encrypted=root.encrypted,
            root_delete_on_termination=root.delete_on_termination,
            volumes=list(volumes), volume_tags=dict(req.volume_tags),
            tenancy=req.tenancy,
            monitoring=req.monitoring, ebs_optimized=req.ebs_optimized,
            hibernation=req.hibernation,
            associate_public_ip=(subnet.map_public_ip_on_launch
                                 if req.associate_public_ip is None
                                 else req.associate_public_ip),
        )
        return subnet, network

    async def place(self, subnet: Subnet, launch_ids: Sequence[str], wanted: str = ""
                    ) -> list[str]:
        """One address per launch id, `CLAIMS_AT_ONCE` claimed at a time (the store
        keeps this gateway's concurrent claims on different addresses); on a failure
        the ones taken are given back."""
        taken: list[str] = []
        for start in range(0, len(launch_ids), CLAIMS_AT_ONCE):
            got = await asyncio.gather(
                *(self.store.allocate(subnet, lid, wanted if i == 0 else "")
                  for i, lid in enumerate(launch_ids[start:start + CLAIMS_AT_ONCE],
                                          start)), return_exceptions=True)
            taken += [ip if isinstance(ip, str) else "" for ip in got]
            failed = next((e for e in got if isinstance(e, BaseException)), None)
            if failed is not None:
                await self.release(subnet, launch_ids, taken)
                raise failed
        return taken

    async def place_both(self, subnet: Subnet, network: InstanceNetwork,
                         launch_ids: Sequence[str], wanted: str = ""
                         ) -> tuple[list[str], list[str]]:
        """`place` and `place_public` at once; on a failure of either, both given back."""
        private, public = await asyncio.gather(
            self.place(subnet, launch_ids, wanted), self.place_public(network, launch_ids),
            return_exceptions=True)
        if isinstance(private, BaseException) or isinstance(public, BaseException):
            await self.release_both(subnet, launch_ids,
                                    private if isinstance(private, list) else [],
                                    public if isinstance(public, list) else [])
            raise private if isinstance(private, BaseException) else public  # type: ignore[misc]
        return private, public

    async def release(self, subnet: Subnet, launch_ids: Sequence[str],
                      addresses: Sequence[str]) -> None:
        for lid, ip in zip(launch_ids, addresses, strict=False):
            if ip:
                await self.store.release(subnet.subnet_id, ip, lid)

    async def place_public(self, network: InstanceNetwork, launch_ids: Sequence[str]
                           ) -> list[str]:
        """One public IPv4 address per launch id from the pool when the launch has
        them (`InstanceNetwork.associate_public_ip`), else ``""`` for each."""
        if not network.associate_public_ip:
            return [""] * len(launch_ids)
        return await self.place(self.store.public_pool, launch_ids)

    async def release_both(self, subnet: Subnet, launch_ids: Sequence[str],
                           private: Sequence[str], public: Sequence[str]) -> None:
        await self.release(subnet, launch_ids, private)
        await self.release(self.store.public_pool, launch_ids, public)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
