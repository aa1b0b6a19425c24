"""Typed requests for the network side: VPCs, subnets, security groups, key pairs, and
what RunInstances says about an instance's network and root volume.

As in `requests`, everything EC2 checks without looking at state is checked here.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from ipaddress import IPv4Network

from roost.domain.errors import (
    InvalidBlockDeviceMapping,
    InvalidGroupIdMalformed,
    InvalidParameterCombination,
    InvalidParameterValue,
    InvalidPermissionMalformed,
    InvalidRequest,
    InvalidSubnetIDMalformed,
    InvalidVpcIDMalformed,
    MissingParameter,
)
from roost.domain.images import Image
from roost.domain.network import Rule
from roost.domain.volumes import VOLUME_TYPES, LaunchVolume, size_error, valid_device
from roost.gateway.query import Params
from roost.gateway.tagging import Tags, specified

IMAGE_ROOT_GIB = 8
"""The size of every roost image's root snapshot: EC2's default root volume size."""
_ID = {"vpc": re.compile(r"vpc-[0-9a-f]{8,17}"), "subnet": re.compile(r"subnet-[0-9a-f]{8,17}"),
       "sg": re.compile(r"sg-[0-9a-f]{8,17}")}
PROTOCOLS = {"-1": "-1", "all": "-1", "tcp": "tcp", "6": "tcp", "udp": "udp", "17": "udp",
             "icmp": "icmp", "1": "icmp", "icmpv6": "icmpv6", "58": "icmpv6"}


@dataclass(frozen=True, slots=True)
class RootVolume:
    size: int | None = None  # None: the image's size
    volume_type: str | None = None  # None: gp2
    iops: int | None = None
    throughput: int | None = None
    encrypted: bool = False
    delete_on_termination: bool = True


@dataclass(frozen=True, slots=True)
class DeviceMapping:
    """One BlockDeviceMapping.N of a launch, checked alone; which one is the root
    depends on the image (`LaunchNetwork.devices`)."""

    device: str
    size: int | None
    volume_type: str | None
    iops: int | None
    throughput: int | None
    encrypted: bool
    delete_on_termination: bool | None  # None: not given (the image's, or EC2's true)


@dataclass(frozen=True, slots=True)
class LaunchNetwork:
    """What RunInstances asks of the network: all optional, EC2 fills the defaults."""

    subnet_id: str = ""
    private_ip: str = ""
    group_ids: tuple[str, ...] = ()
    group_names: tuple[str, ...] = ()
    key_name: str = ""
    mappings: tuple[DeviceMapping, ...] = ()
    volume_tags: tuple[tuple[str, str], ...] = ()
    tenancy: str = "default"
    monitoring: bool = False
    ebs_optimized: bool = False
    hibernation: bool = False
    associate_public_ip: bool | None = None
    """NetworkInterface.1.AssociatePublicIpAddress; None: the subnet's
    MapPublicIpOnLaunch decides."""
    ipv6_count: int = 0  # Ipv6AddressCount (or NetworkInterface.1.Ipv6AddressCount)

    def devices(self, image: Image) -> tuple[RootVolume, tuple[LaunchVolume, ...]]:
        """The mappings as the image sees them: the one of its root device changes the
        image's root volume; any other is a new, empty volume (recorded, not provided:
        docs/gateway.md)."""
        root = RootVolume(image.root_volume_size, image.root_volume_type,
                          delete_on_termination=image.root_delete_on_termination)
        extra: list[LaunchVolume] = []
        for m in self.mappings:
            if m.device == image.root_device_name:
                if m.size is not None and m.size < image.root_volume_size:
                    raise InvalidBlockDeviceMapping(
                        f"Volume of size {m.size}GB is smaller than snapshot, expect size "
                        f">= {image.root_volume_size}GB")
                root = RootVolume(m.size or root.size, m.volume_type or root.volume_type,
                                  m.iops, m.throughput, m.encrypted,
                                  root.delete_on_termination
                                  if m.delete_on_termination is None
                                  else m.delete_on_termination)
                continue
            if m.size is None:
                raise MissingParameter("The request must contain the parameter size or "
                                       "snapshotId")
            extra.append(LaunchVolume(m.device, m.size, m.volume_type or "gp2", m.iops,
                                      m.throughput, m.encrypted,
                                      m.delete_on_termination is not False))
        return root, tuple(extra)


def check_id(kind: str, value: str) -> str:
    if not _ID[kind].fullmatch(value):
        error = {"vpc": InvalidVpcIDMalformed, "subnet": InvalidSubnetIDMalformed,
                 "sg": InvalidGroupIdMalformed}[kind]
        raise error(f"Invalid id: \"{value}\" (expecting \"{kind}-...\")")
    return value


def _ebs_checks(m: Params, vtype: str | None) -> tuple[int | None, int | None]:
    """Iops and throughput of one mapping, where its type allows them."""
    iops = m.integer("Ebs.Iops")
    if iops is not None and (vtype or "gp2") not in ("io1", "io2", "gp3"):
        raise InvalidParameterCombination(
            f"The parameter iops is not supported for {vtype or 'gp2'} volumes.")
    throughput = m.integer("Ebs.Throughput")
    if throughput is not None and vtype != "gp3":
        raise InvalidParameterCombination(
            "The parameter throughput is supported only for gp3 volumes.")
    return iops, throughput


def _block_devices(p: Params) -> tuple[DeviceMapping, ...]:
    """BlockDeviceMapping.N, each checked alone (the last one for a device wins)."""
    found: dict[str, DeviceMapping] = {}
    for m in p.members("BlockDeviceMapping"):
        device = m.get("DeviceName")
        if not device:
            raise MissingParameter("The request must contain the parameter "
                                   "BlockDeviceMapping.DeviceName")
        if m.has("NoDevice"):
            if m.get("NoDevice"):
                raise InvalidRequest("The request received was invalid")
            continue  # suppresses a device of the image: nothing to record
        if m.get("VirtualName"):
            continue  # names an instance-store device: nothing to record
        if not m.has("Ebs"):
            raise MissingParameter("The request must contain the parameter ebs")
        if not valid_device(device):
            raise InvalidBlockDeviceMapping(f"Invalid device name {device[:80]}")
        vtype = m.get("Ebs.VolumeType")
        if vtype is not None and vtype not in VOLUME_TYPES:
            raise InvalidParameterValue(
                f"Value ({vtype[:80]}) for parameter volumeType is invalid. "
                f"Valid values: {', '.join(VOLUME_TYPES)}.")
        size = m.integer("Ebs.VolumeSize")
        if size is not None and (why := size_error(vtype or "gp2", size)):
            raise InvalidParameterValue(why)
        iops, throughput = _ebs_checks(m, vtype)
        encrypted = m.flag("Ebs.Encrypted")
        delete = (m.flag("Ebs.DeleteOnTermination") if m.get("Ebs.DeleteOnTermination")
                  else None)
        found[device] = DeviceMapping(device, size, vtype, iops, throughput, encrypted,
                                      delete)
    return tuple(found.values())


def _nic_private_ip(nic: Params) -> str:
    """An interface's primary private address: ``PrivateIpAddress``, or the one of
    ``PrivateIpAddresses.N`` marked ``Primary`` (or the only one). roost instances have
    no secondary addresses, so asking for any is refused rather than dropped."""
    listed = nic.members("PrivateIpAddresses")
    if len(listed) > 1 or (nic.integer("SecondaryPrivateIpAddressCount") or 0) > 0:
        raise InvalidParameterValue("roost instances have one private IPv4 address: "
                                    "secondary private addresses cannot be given.")
    plain = nic.get("PrivateIpAddress") or ""
    primary = listed[0].get("PrivateIpAddress") or "" if listed else ""
    if listed and not listed[0].flag("Primary", default=True):
        raise InvalidParameterValue("The only private address given must be the primary.")
    if plain and primary and plain != primary:
        raise InvalidParameterCombination(
            "The primary private IP address is given twice, with different values.")
    return plain or primary


def parse_launch_network(p: Params, *, max_count: int, volume_tags: Tags = ()
                         ) -> LaunchNetwork:
    """``volume_tags``: TagSpecification.N's ``volume`` entries, which RunInstances
    reads along with its ``instance`` ones."""
    subnet = p.get("SubnetId") or ""
    private_ip = p.get("PrivateIpAddress") or ""
    group_ids = list(p.values("SecurityGroupId"))
    # The first network interface may carry the same (Terraform sends it this way when
    # it sets associate_public_ip_address).
    nics = p.members("NetworkInterface")
    public: bool | None = None
    ipv6_count = p.integer("Ipv6AddressCount") or 0
    if subnet and nics:
        raise InvalidParameterCombination(
            "Network interfaces and an instance-level subnet ID may not be specified on "
            "the same request")
    for nic in nics:
        if (nic.get("DeviceIndex") or "0") != "0":
            raise InvalidParameterValue("roost instances have one network interface.")
        subnet = nic.get("SubnetId") or subnet
        private_ip = _nic_private_ip(nic) or private_ip
        group_ids += nic.values("SecurityGroupId")
        if nic.has("AssociatePublicIpAddress"):
            public = nic.flag("AssociatePublicIpAddress")
        ipv6_count = nic.integer("Ipv6AddressCount") or ipv6_count
    if not 0 <= ipv6_count <= 10:
        raise InvalidParameterValue(f"Value ({ipv6_count}) for parameter Ipv6AddressCount "
                                    "is invalid: roost gives 0 to 10.")
    if p.has("Ipv6Address") or any(nic.has("Ipv6Addresses") for nic in nics):
        raise InvalidParameterValue("roost assigns IPv6 addresses itself: give "
                                    "Ipv6AddressCount, not Ipv6Address.N.")
    if subnet:
        check_id("subnet", subnet)
    for gid in group_ids:
        check_id("sg", gid)
    if private_ip and max_count > 1:
        raise InvalidParameterCombination(
            "Cannot specify a private IP address when launching more than one instance.")
    mappings = _block_devices(p)
    tenancy = p.get("Placement.Tenancy") or "default"
    if tenancy not in ("default", "dedicated", "host"):
        raise InvalidParameterValue(f"Value ({tenancy[:80]}) for parameter tenancy is invalid.")
    if tenancy != "default":
        raise InvalidParameterValue(f"roost cannot launch instances with {tenancy} tenancy.")
    return LaunchNetwork(
        subnet_id=subnet, private_ip=private_ip,
        group_ids=tuple(dict.fromkeys(group_ids)),
        group_names=tuple(dict.fromkeys(p.values("SecurityGroup"))),
        key_name=p.get("KeyName") or "", mappings=mappings,
        volume_tags=volume_tags,
        tenancy=tenancy,
        monitoring=p.flag("Monitoring.Enabled"), ebs_optimized=p.flag("EbsOptimized"),
        hibernation=p.flag("HibernationOptions.Configured"), associate_public_ip=public,
        ipv6_count=ipv6_count,
    )


# -- VPCs and subnets ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CreateVpcRequest:
    cidr: str
    tags: tuple[tuple[str, str], ...] = ()
    tenancy: str = "default"
    ipv6: bool = False  # AmazonProvidedIpv6CidrBlock


@dataclass(frozen=True, slots=True)
class CreateSubnetRequest:
    vpc_id: str
    cidr: str
    availability_zone: str = ""
    tags: tuple[tuple[str, str], ...] = ()
    ipv6_cidr: str = ""


@dataclass(frozen=True, slots=True)
class CreateGroupRequest:
    name: str
    description: str
    vpc_id: str = ""
    tags: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class GroupRef:
    """A group by id, or by name (in the default VPC, as EC2 takes it)."""

    group_id: str = ""
    group_name: str = ""


@dataclass(frozen=True, slots=True)
class PermissionsRequest:
    group: GroupRef
    rules: tuple[Rule, ...]
    egress: bool


@dataclass(frozen=True, slots=True)
class KeyPairRequest:
    name: str
    key_type: str = "rsa"
    public_key: str = ""  # ImportKeyPair: the decoded key material
    tags: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class NamedDescribe:
    ids: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    filters: tuple[tuple[str, tuple[str, ...]], ...] = field(default_factory=tuple)


def resource_tags(p: Params, resource_type: str) -> Tags:
    """TagSpecification.N entries for ``resource_type`` (others are refused as EC2 does)."""
    return specified(p, (resource_type,), default=resource_type)[resource_type]


def parse_create_vpc(p: Params) -> CreateVpcRequest:
    tenancy = p.get("InstanceTenancy") or "default"
    if tenancy not in ("default", "dedicated", "host"):
        raise InvalidParameterValue(f"Value ({tenancy[:80]}) for parameter "
                                    "instanceTenancy is invalid.")
    return CreateVpcRequest(p.require("CidrBlock"), resource_tags(p, "vpc"), tenancy,
                            p.flag("AmazonProvidedIpv6CidrBlock"))


def parse_create_subnet(p: Params) -> CreateSubnetRequest:
    vpc = check_id("vpc", p.require("VpcId"))
    return CreateSubnetRequest(vpc, p.require("CidrBlock"), p.get("AvailabilityZone") or "",
                               resource_tags(p, "subnet"), p.get("Ipv6CidrBlock") or "")


_SUBNET_ATTRIBUTES = ("AssignIpv6AddressOnCreation", "MapCustomerOwnedIpOnLaunch",
                      "EnableDns64", "PrivateDnsHostnameTypeOnLaunch",
                      "EnableResourceNameDnsARecordOnLaunch",
                      "EnableResourceNameDnsAAAARecordOnLaunch", "EnableLniAtDeviceIndex",
                      "DisableLniAtDeviceIndex", "CustomerOwnedIpv4Pool")


def parse_modify_subnet_attribute(p: Params) -> tuple[str, bool]:
    """ModifySubnetAttribute: the subnet and its new MapPublicIpOnLaunch (the one
    attribute roost keeps; EC2 takes one attribute per call)."""
    subnet = check_id("subnet", p.require("SubnetId"))
    others = [a for a in _SUBNET_ATTRIBUTES if p.has(a)]
    if others:
        raise InvalidParameterValue(f"roost cannot modify the subnet attribute {others[0]}: "
                                    "only MapPublicIpOnLaunch.")
    if not p.has("MapPublicIpOnLaunch.Value"):
        raise MissingParameter("The request must contain the parameter "
                               "MapPublicIpOnLaunch")
    return subnet, p.flag("MapPublicIpOnLaunch.Value")


def parse_id(p: Params, name: str, kind: str) -> str:
    return check_id(kind, p.require(name))


def parse_create_group(p: Params) -> CreateGroupRequest:
    name = p.require("GroupName")
    description = p.require("GroupDescription")
    if len(name) > 255 or len(description) > 255:
        raise InvalidParameterValue("Group names and descriptions are at most 255 characters.")
    if name.startswith("sg-"):
        raise InvalidParameterValue("Group names may not be in the format sg-*.")
    vpc = p.get("VpcId") or ""
    if vpc:
        check_id("vpc", vpc)
    return CreateGroupRequest(name, description, vpc, resource_tags(p, "security-group"))


def parse_group_ref(p: Params) -> GroupRef:
    gid, name = p.get("GroupId") or "", p.get("GroupName") or ""
    if not gid and not name:
        raise MissingParameter("The request must contain the parameter groupName or groupId")
    return GroupRef(check_id("sg", gid) if gid else "", name)


def _port(m: Params, name: str, protocol: str) -> int | None:
    value = m.integer(name)
    if protocol == "-1":
        return None
    if value is None:
        if protocol in ("tcp", "udp"):
            raise InvalidPermissionMalformed(f"The parameter {name} must be given for "
                                             f"{protocol}.")
        return -1
    if protocol in ("tcp", "udp") and not 0 <= value <= 65535:
        raise InvalidParameterValue(f"Invalid {name}: {value}; ports are 0 to 65535.")
    return value


def parse_permissions(p: Params, *, egress: bool) -> PermissionsRequest:
    group = parse_group_ref(p)
    rules: list[Rule] = []
    perms = p.members("IpPermissions")
    if not perms and p.get("IpProtocol"):  # the old flat form: one rule
        perms = [p]
    if not perms:
        raise MissingParameter("The request must contain the parameter ipPermissions")
    for m in perms:
        raw = m.require("IpProtocol").lower()
        protocol = PROTOCOLS.get(raw)
        if protocol is None:
            if not raw.isdigit() or not 0 <= int(raw) <= 255:
                raise InvalidPermissionMalformed(f"Invalid IP protocol: {raw[:80]}")
            protocol = raw
        low, high = _port(m, "FromPort", protocol), _port(m, "ToPort", protocol)
        if low is not None and high is not None and protocol in ("tcp", "udp") and low > high:
            raise InvalidParameterValue(f"Invalid port range {low}-{high}.")
        sources: list[Rule] = []
        for r in m.members("IpRanges"):
            sources.append(Rule(protocol, low, high, cidr=_cidr(r.require("CidrIp")),
                                description=r.get("Description") or ""))
        for r in m.members("Ipv6Ranges"):
            sources.append(Rule(protocol, low, high, cidr_v6=r.require("CidrIpv6"),
                                description=r.get("Description") or ""))
        for r in m.members("Groups"):
            gid = r.get("GroupId") or ""
            if not gid:
                raise MissingParameter("The request must contain the parameter groupId")
            sources.append(Rule(protocol, low, high, group_id=check_id("sg", gid),
                                description=r.get("Description") or ""))
        if not sources and p.get("CidrIp"):
            sources.append(Rule(protocol, low, high, cidr=_cidr(p.require("CidrIp"))))
        if not sources:
            raise MissingParameter("A rule must name a source: IpRanges, Ipv6Ranges or "
                                   "Groups.")
        rules.extend(sources)
    return PermissionsRequest(group, tuple(rules), egress)


def _cidr(value: str) -> str:
    try:
        return str(IPv4Network(value, strict=False))
    except ValueError:
        raise InvalidParameterValue(f"CIDR block {value[:80]} is malformed") from None


def parse_create_key_pair(p: Params) -> KeyPairRequest:
    name = p.require("KeyName")
    if len(name) > 255:
        raise InvalidParameterValue("Key names are at most 255 characters.")
    key_type = p.get("KeyType") or "rsa"
    if key_type not in ("rsa", "ed25519"):
        raise InvalidParameterValue(f"Value ({key_type[:80]}) for parameter keyType is "
                                    "invalid. Valid values: rsa, ed25519.")
    key_format = p.get("KeyFormat") or "pem"
    if key_format not in ("pem", "ppk"):
        raise InvalidParameterValue(f"Value ({key_format[:80]}) for parameter keyFormat is "
                                    "invalid. Valid values: pem, ppk.")
    return KeyPairRequest(name, key_type, tags=resource_tags(p, "key-pair"))


def parse_import_key_pair(p: Params) -> KeyPairRequest:
    name = p.require("KeyName")
    raw = p.require("PublicKeyMaterial")
    try:
        material = base64.b64decode(raw, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        material = raw  # some clients send the key as text rather than base64
    return KeyPairRequest(name, public_key=material.strip(),
                          tags=resource_tags(p, "key-pair"))


def parse_key_names(p: Params) -> NamedDescribe:
    return NamedDescribe(ids=tuple(p.values("KeyPairId")), names=tuple(p.values("KeyName")))
