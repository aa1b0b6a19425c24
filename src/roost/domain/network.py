"""EC2's network identity as roost records it: VPCs, subnets, security groups, key pairs.

Pure data and rules (CIDR checks, the derived defaults, address choice); the buckets
that hold them are the gateway's (`roost.gateway.network`). roost records these and
reports them back as EC2 would; it does not route packets or filter them (see
docs/gateway.md for what is enforced where).
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import itertools
from collections.abc import Container
from typing import Literal

import msgspec

DEFAULT_VPC_CIDR = "172.31.0.0/16"
RESERVED_LOW = 4
"""EC2 keeps the network address and the next three of every subnet (router, DNS,
future use), and the broadcast address at the top."""
Kind = Literal["vpc", "subnet", "security-group"]


@functools.lru_cache(maxsize=4096)
def _network(cidr: str) -> ipaddress.IPv4Network:
    """A subnet's block, parsed once (each address claim and release reads it)."""
    return ipaddress.IPv4Network(cidr)


def default_subnet(vpc: Vpc, region: str, zone: str) -> Subnet:
    """The zone's default subnet of ``vpc``: the same on every gateway."""
    return _default_subnet(vpc.vpc_id, vpc.cidr, vpc.owner_id, region, zone)


def derived_id(prefix: str, *parts: str) -> str:
    """A stable 17-hex id from ``parts``: every gateway derives the same default ids."""
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()
    return f"{prefix}-{digest[:17]}"


class Rule(msgspec.Struct, frozen=True, omit_defaults=True):
    """One permission of a security group, flattened to one source each, as EC2's
    SecurityGroupRules are."""

    protocol: str  # "-1", "tcp", "udp", "icmp" or a number
    from_port: int | None = None
    to_port: int | None = None
    cidr: str = ""
    cidr_v6: str = ""
    group_id: str = ""
    description: str = ""

    def key(self) -> tuple[object, ...]:
        """What makes two rules the same (the description does not)."""
        return (self.protocol, self.from_port, self.to_port, self.cidr, self.cidr_v6,
                self.group_id)


class Vpc(msgspec.Struct, frozen=True, tag="vpc"):
    vpc_id: str
    cidr: str
    owner_id: str
    is_default: bool = False
    tags: dict[str, str] = {}
    tenancy: str = "default"
    ipv6_cidr: str = ""
    """The /56 CreateVpc's AmazonProvidedIpv6CidrBlock gave it (`IPV6_POOL`)."""
    removed: bool = False
    """The region's default VPC, deleted: stored under its id so the derived default
    stays gone until CreateDefaultVpc."""


class Subnet(msgspec.Struct, frozen=True, tag="subnet"):
    subnet_id: str
    vpc_id: str
    cidr: str
    availability_zone: str
    owner_id: str
    default_for_az: bool = False
    tags: dict[str, str] = {}
    map_public_ip_on_launch: bool = False
    """Whether instances launched into it get a public IPv4 address (true for default
    subnets, as on EC2; `ModifySubnetAttribute` changes it)."""
    ipv6_cidr: str = ""
    """A /64 of its VPC's IPv6 block (CreateSubnet's Ipv6CidrBlock), or none."""
    removed: bool = False
    """A zone's default subnet, deleted: stored under its id so the derived default
    stays gone until CreateDefaultSubnet (or CreateDefaultVpc)."""

    @property
    def network(self) -> ipaddress.IPv4Network:
        return _network(self.cidr)

    @property
    def capacity(self) -> int:
        """Usable addresses: all but the four lowest and the broadcast address."""
        return self.network.num_addresses - RESERVED_LOW - 1


class SecurityGroup(msgspec.Struct, frozen=True, tag="security-group"):
    group_id: str
    group_name: str
    description: str
    vpc_id: str
    owner_id: str
    ingress: tuple[Rule, ...] = ()
    egress: tuple[Rule, ...] = ()
    tags: dict[str, str] = {}
    is_default: bool = False


NetworkRecord = Vpc | Subnet | SecurityGroup


class KeyPair(msgspec.Struct, frozen=True):
    key_name: str
    key_pair_id: str
    fingerprint: str
    public_key: str
    key_type: str = "rsa"
    created: str = ""
    tags: dict[str, str] = {}


ALLOW_ALL_EGRESS = Rule("-1", cidr="0.0.0.0/0")


def default_vpc(region: str, owner_id: str) -> Vpc:
    return Vpc(derived_id("vpc", region), DEFAULT_VPC_CIDR, owner_id, is_default=True)


def default_group(vpc: Vpc) -> SecurityGroup:
    """A VPC's ``default`` group: instances in it may reach each other, anything may
    leave (EC2's initial rules)."""
    gid = derived_id("sg", vpc.vpc_id, "default")
    return SecurityGroup(gid, "default", "default VPC security group", vpc.vpc_id,
                         vpc.owner_id, ingress=(Rule("-1", group_id=gid),),
                         egress=(ALLOW_ALL_EGRESS,), is_default=True)


def zone_slot(region: str, zone: str) -> int:
    """Which /20 of the default VPC a zone's default subnet takes: its letter when the
    zone is ``<region><letter>`` (as EC2 names them), else a stable hash."""
    suffix = zone[len(region):] if zone.startswith(region) else ""
    if len(suffix) == 1 and "a" <= suffix <= "p":
        return ord(suffix) - ord("a")
    return int(hashlib.sha256(zone.encode()).hexdigest(), 16) % 16


@functools.lru_cache(maxsize=1024)
def _default_subnet(vpc_id: str, cidr: str, owner_id: str, region: str, zone: str) -> Subnet:
    """Made once per VPC, region and zone (every launch without a subnet asks)."""
    base = _network(cidr).network_address + zone_slot(region, zone) * 4096
    return Subnet(derived_id("subnet", vpc_id, zone), vpc_id, f"{base}/20", zone,
                  owner_id, default_for_az=True, map_public_ip_on_launch=True)


def check_block(cidr: str, *, low: int = 16, high: int = 28) -> ipaddress.IPv4Network | None:
    """``cidr`` as a network if it is a valid IPv4 block with a /``low``../``high``
    prefix (EC2's limits for VPCs and subnets), else None. Host bits must be zero."""
    try:
        net = ipaddress.IPv4Network(cidr, strict=True)
    except ValueError:
        return None
    return net if low <= net.prefixlen <= high else None


def _scan(subnet: Subnet, stripe: tuple[int, int]) -> tuple[int, int, int]:
    """(low, high, start) of `first_free`'s search: it runs start..high-1, then
    low..start-1."""
    net = subnet.network
    low = int(net.network_address) + RESERVED_LOW
    high = int(net.broadcast_address)
    index, count = stripe
    return low, high, low + (high - low) * index // max(count, 1)


def scan_position(subnet: Subnet, n: int, *, stripe: tuple[int, int] = (0, 1)) -> int:
    """Where address ``n`` comes in `first_free`'s search order (0: first)."""
    low, high, start = _scan(subnet, stripe)
    return n - start if n >= start else (high - start) + (n - low)


def first_free(subnet: Subnet, used: Container[int], *, stripe: tuple[int, int] = (0, 1),
               skip: int = 0) -> str | None:
    """The lowest usable address of ``subnet`` not in ``used`` (addresses as ints).

    ``stripe`` (i, n) starts the search i/n of the way into the usable range and wraps
    around, so that n processes claiming addresses at once do not all race for the
    same lowest one; (0, 1) is plain lowest-first. ``skip`` leaves out the first
    positions of the search (see `scan_position`), which the caller knows are used: a
    subnet with thousands taken is then not walked from its bottom on every claim."""
    low, high, start = _scan(subnet, stripe)
    # Start at position ``skip`` directly: islice would step over the skipped positions
    # one by one, which at 100,000 taken cost every claim a walk of them all.
    first = start + skip
    order = (itertools.chain(range(first, high), range(low, start)) if first < high
             else range(low + (first - high), start))
    for n in order:
        if n not in used:
            return str(ipaddress.IPv4Address(n))
    return None


def usable(subnet: Subnet, ip: str) -> bool:
    """Whether ``ip`` is an address an instance in ``subnet`` may have."""
    try:
        addr = ipaddress.IPv4Address(ip)
    except ValueError:
        return False
    net = subnet.network
    return (addr in net and int(addr) - int(net.network_address) >= RESERVED_LOW
            and addr != net.broadcast_address)


PUBLIC_IPV4_POOL = "198.18.0.0/15"
"""Where roost's public IPv4 addresses come from unless the gateway is configured with
another pool: RFC 2544's benchmarking block, which the internet does not route. The
addresses are recorded, not routed (docs/gateway.md)."""
PUBLIC_POOL_ID = "public-ipv4"
"""The pool's name in the address bucket, beside the subnets' (it is one, to the
allocator: a block whose addresses are claimed once each)."""


def public_pool_subnet(cidr: str) -> Subnet:
    """The public IPv4 pool as the address allocator sees it."""
    return Subnet(PUBLIC_POOL_ID, "", cidr, "", "")


IPV6_POOL = ipaddress.IPv6Network("2001:db8::/32")
"""Where VPCs' IPv6 blocks come from: RFC 3849's documentation prefix, which nothing
routes. Recorded, not routed (docs/gateway.md)."""
IPV6_BLOCKS = 1 << (56 - 32)


def ipv6_block(vpc_id: str, attempt: int) -> tuple[int, str]:
    """The ``attempt``-th candidate /56 for ``vpc_id`` (its number in the pool, and the
    block): spread by a hash, claimed with compare-and-set by the caller."""
    digest = hashlib.sha256(f"{vpc_id}/{attempt}".encode()).digest()
    n = int.from_bytes(digest[:8], "big") % IPV6_BLOCKS
    base = int(IPV6_POOL.network_address) + (n << (128 - 56))
    return n, str(ipaddress.IPv6Network((base, 56)))


def check_ipv6_subnet(cidr: str, vpc_block: str) -> ipaddress.IPv6Network | None:
    """``cidr`` as a /64 inside ``vpc_block`` (EC2's only size for a subnet), else None."""
    try:
        net = ipaddress.IPv6Network(cidr, strict=True)
    except ValueError:
        return None
    if not vpc_block or net.prefixlen != 64 or not net.subnet_of(
            ipaddress.IPv6Network(vpc_block)):
        return None
    return net


def ipv6_addresses(subnet_cidr: str, launch_id: str, count: int) -> list[str]:
    """``count`` addresses of a /64 for one launch: derived from its launch id (2^64
    addresses a subnet, so two launches meet with odds far below any hardware fault's),
    never the four lowest or the highest, which EC2 reserves."""
    net = ipaddress.IPv6Network(subnet_cidr)
    out: list[str] = []
    k = 0
    while len(out) < count:
        digest = hashlib.sha256(f"{launch_id}/{k}".encode()).digest()
        suffix = int.from_bytes(digest[:8], "big")
        k += 1
        if RESERVED_LOW <= suffix < (1 << 64) - 1:
            out.append(str(net.network_address + suffix))
    return out


def public_dns_name(ip: str) -> str:
    """EC2's form for public names (``ec2-198-18-0-5.<domain>``) under roost's domain."""
    return f"ec2-{ip.replace('.', '-')}.roost.public" if ip else ""


def private_dns_name(ip: str) -> str:
    """EC2's form (``ip-10-0-0-5.<domain>``) under roost's domain, as the node's
    metadata service also names the instance (``local-hostname``)."""
    return f"ip-{ip.replace('.', '-')}.roost.internal" if ip else ""
