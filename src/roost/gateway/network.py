"""The gateway's mirror of the network buckets, and the writes that change them.

`roost_network` holds VPCs, subnets and security groups (id -> record) and the names
that must be unique (``sgname.<vpc>.<name>`` -> group id); `roost_addresses` holds one
key per private address in use (``<subnet>.<a_b_c_d>`` -> who took it); `roost_key_pairs`
holds key pairs by name. Gateways are the only writers, with compare-and-set wherever
two of them could race; docs/architecture.md has the design (release, crash, restart).

The region's default VPC, its default group and the default subnet of each zone are
derived (`roost.domain.network`), not stored, so no gateway has to create them first. A
stored record under a default's id (a default group with rules added) replaces it; one
marked ``removed`` (a deleted default VPC or default subnet) hides it until
CreateDefaultVpc or CreateDefaultSubnet marks it back, by compare-and-set.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import logging
import socket
import time
from collections.abc import Callable, Container, Coroutine, Iterable
from typing import Any, TypeVar

import msgspec
import nats.errors
import nats.js.errors
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from roost.bus.connect import follow_bucket
from roost.bus.failures import BUS_DOWN
from roost.bus.schemas import InstanceRecord
from roost.decide.placement import share_of
from roost.domain.accounts import DEFAULT_ACCOUNT
from roost.domain.errors import (
    InsufficientFreeAddressesInSubnet,
    InvalidIPAddressInUse,
    InvalidParameterValue,
    ServiceUnavailable,
)
from roost.domain.network import (
    PUBLIC_IPV4_POOL,
    PUBLIC_POOL_ID,
    KeyPair,
    NetworkRecord,
    SecurityGroup,
    Subnet,
    Vpc,
    default_group,
    default_subnet,
    default_vpc,
    first_free,
    ipv6_block,
    public_pool_subnet,
    scan_position,
    usable,
)
from roost.gateway.tenancy import account, visible

log = logging.getLogger(__name__)
WRONG_LAST_SEQUENCE = (10071, 10164)
"""JetStream's error codes for a conditional write whose expected revision moved on:
10071 names the sequence found; 10164, without it, is what a clustered stream answered
(seen with 4 gateway processes releasing one address on a 3-server cluster)."""


class _AnyOf:
    """Membership in any of several sets, without building their union (a subnet's
    taken addresses run to tens of thousands)."""

    def __init__(self, *parts: Container[int]) -> None:
        self.parts = parts

    def __contains__(self, n: object) -> bool:
        return any(n in p for p in self.parts)


R = TypeVar("R", Vpc, Subnet, SecurityGroup)
D = TypeVar("D", Vpc, Subnet)
ORPHAN_AFTER = 600.0
"""Seconds after which an address no instance names is taken back (a gateway died
between allocating it and launching); longer than any launch may take."""
SWEEP_EVERY = 60.0
SWEEP_SLICE = 2_000
"""A sweep lets the event loop run other work after this many records or addresses:
at 100,000 instances a sweep in one piece held every request behind it."""
CHORES_AT_ONCE = 64
"""Background writes (address releases, group records) in flight at once, per process."""
_RETRIES = 20
_ADDRESS_RETRIES = 64
"""Each lost race moves on to another address, so only a crowd of gateways allocating
in one subnet at once needs many."""
_DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, ValueError)
_RECORD = msgspec.json.Decoder(NetworkRecord)


class AddressClaim(msgspec.Struct, frozen=True):
    launch_id: str
    at: float  # wall clock, seconds


def name_key(vpc_id: str, name: str, owner_id: str) -> str:
    """A KV key for a group name: any text, so base32 (letters, digits, ``=``). Names
    are unique per account, as on EC2: the region's default VPC is shared."""
    return f"sgname.{vpc_id}.{owner_id}.{base64.b32encode(name.encode()).decode()}"


def key_pair_key(owner_id: str, name: str) -> str:
    """``<account>.<base32 name>``; a key without the account (from before accounts)
    belongs to the default one."""
    return f"{owner_id}.{base64.b32encode(name.encode()).decode() or '='}"


def _key_pair_name(key: str) -> tuple[str, str]:
    owner, _, b32 = key.rpartition(".")
    return owner or DEFAULT_ACCOUNT, base64.b32decode(b32.encode()).decode() if b32 != "=" else ""


def address_key(subnet_id: str, ip: str) -> str:
    return f"{subnet_id}.{ip.replace('.', '_')}"


def _unavailable(what: str, exc: BaseException) -> ServiceUnavailable:
    return ServiceUnavailable(f"The {what} store is unreachable: {exc!r}")


def _address(dotted: str) -> int:
    """An IPv4 address as an int; ``socket.inet_aton`` is about ten times cheaper than
    `ipaddress.IPv4Address` for a sweep that reads every address of 100,000 instances.
    Addresses on records were written by roost, so they are well formed."""
    return int.from_bytes(socket.inet_aton(dotted), "big")


class NetworkStore:
    def __init__(self, network: KeyValue, addresses: KeyValue, key_pairs: KeyValue, *,
                 region: str, owner_id: str, zones: Callable[[], list[str]],
                 stripe: tuple[int, int] = (0, 1), public_pool: str = PUBLIC_IPV4_POOL
                 ) -> None:
        self._kvs = {"network": network, "addresses": addresses, "key_pairs": key_pairs}
        self.stripe = stripe
        """Where this process starts looking for a free address (`first_free`): worker
        i of a pool of n starts i/n into each subnet, so the workers do not race."""
        self.region = region
        self.owner_id = owner_id
        self._zones = zones
        self.default_vpc = default_vpc(region, owner_id)
        self._default_group = default_group(self.default_vpc)
        self.public_pool = public_pool_subnet(public_pool)
        self._records: dict[str, tuple[int, NetworkRecord]] = {}
        self._names: dict[str, str] = {}  # name key -> group id
        self._addresses: dict[str, dict[int, tuple[int, AddressClaim]]] = {}
        self._pending: dict[str, set[int]] = {}
        self._scanned: dict[str, tuple[Subnet, int]] = {}
        """Subnet -> the positions of this process's search (`first_free`) known to be in
        use: each claim starts where the last one found a free address, not at the
        bottom of a subnet that may hold thousands; anything given back moves it down."""
        self._freed: dict[str, dict[int, int]] = {}
        """Subnet -> address -> the revision of the delete that freed it: claimed again
        over that revision in one write (a create of a deleted key costs three)."""
        self.instance_groups: dict[str, list[str]] = {}
        """``igroups.<instance id>`` -> the groups ModifyInstanceAttribute set."""
        self._key_pairs: dict[tuple[str, str], KeyPair] = {}  # (owner, name) ->
        self._legacy_pairs: set[str] = set()
        """Key pair keys from before accounts (no account prefix): the default one's."""
        self._synced = {k: asyncio.Event() for k in self._kvs}
        self._tasks: list[asyncio.Task[None]] = []
        self._chores: set[asyncio.Task[None]] = set()
        self._chore_slots = asyncio.Semaphore(CHORES_AT_ONCE)

    # -- reading ---------------------------------------------------------------------

    def _stored(self, kind: type[R]) -> list[R]:
        """The caller's records of ``kind`` (`roost.gateway.tenancy`). The region's
        derived defaults are everyone's and are added by the readers below."""
        return [r for _, r in self._records.values()
                if isinstance(r, kind) and not (isinstance(r, Vpc | Subnet) and r.removed)
                and (self._shared(r) or visible(r.owner_id))]

    def _shared(self, rec: NetworkRecord) -> bool:
        """The region's default VPC, its default subnets and its default group: every
        account launches into them (stored once one is tagged or given rules)."""
        if isinstance(rec, Vpc):
            return rec.vpc_id == self.default_vpc.vpc_id
        flag = rec.default_for_az if isinstance(rec, Subnet) else rec.is_default
        return flag and rec.vpc_id == self.default_vpc.vpc_id

    def removed(self, record_id: str) -> bool:
        """Whether the derived default under ``record_id`` was deleted."""
        found = self._records.get(record_id)
        return found is not None and isinstance(found[1], Vpc | Subnet) and found[1].removed

    @property
    def has_default_vpc(self) -> bool:
        return not self.removed(self.default_vpc.vpc_id)

    def vpcs(self) -> list[Vpc]:
        stored = {v.vpc_id: v for v in self._stored(Vpc)}
        default = stored.pop(self.default_vpc.vpc_id, self.default_vpc)
        return [default, *stored.values()] if self.has_default_vpc else list(stored.values())

    def default_subnets(self) -> list[Subnet]:
        """The default subnet of each zone that has one (none without a default VPC)."""
        if not self.has_default_vpc:
            return []
        stored = {s.subnet_id: s for s in self._stored(Subnet)}
        derived = (default_subnet(self.default_vpc, self.region, z) for z in self._zones())
        return [stored.get(d.subnet_id, d) for d in derived if not self.removed(d.subnet_id)]

    def subnets(self) -> list[Subnet]:
        defaults = self.default_subnets()
        ids = {d.subnet_id for d in defaults}
        gone = "" if self.has_default_vpc else self.default_vpc.vpc_id
        return defaults + [s for s in self._stored(Subnet)
                           if s.subnet_id not in ids and s.vpc_id != gone]

    def groups(self) -> list[SecurityGroup]:
        stored = {g.group_id: g for g in self._stored(SecurityGroup)}
        base = self._default_group
        default = stored.pop(base.group_id, base)
        return [default, *stored.values()] if self.has_default_vpc else list(stored.values())

    def vpc(self, vpc_id: str) -> Vpc | None:
        return next((v for v in self.vpcs() if v.vpc_id == vpc_id), None)

    def subnet(self, subnet_id: str) -> Subnet | None:
        found = self._records.get(subnet_id)
        if found is not None and isinstance(rec := found[1], Subnet) and not self._shared(rec):
            # An account's own subnet, read as `subnets` would list it, without building
            # the list: every launch into a subnet asks, and the list walks every record
            # and every live node's zone.
            shown = (not rec.removed and visible(rec.owner_id)
                     and (self.has_default_vpc or rec.vpc_id != self.default_vpc.vpc_id))
            return rec if shown else None
        return next((s for s in self.subnets() if s.subnet_id == subnet_id), None)

    def group(self, group_id: str) -> SecurityGroup | None:
        found = self._records.get(group_id)
        if found is not None and isinstance(rec := found[1], SecurityGroup) \
                and not self._shared(rec):
            return rec if visible(rec.owner_id) else None  # as `groups` would list it
        return next((g for g in self.groups() if g.group_id == group_id), None)

    def group_named(self, vpc_id: str, name: str) -> SecurityGroup | None:
        if vpc_id == self.default_vpc.vpc_id and name == "default" and self.has_default_vpc:
            # Every launch into a default subnet with no group named asks for this one:
            # read it, as stored or derived, without listing every group.
            base = self._default_group
            found = self._records.get(base.group_id)
            return found[1] if found is not None and isinstance(found[1], SecurityGroup) \
                else base
        return next((g for g in self.groups()
                     if g.vpc_id == vpc_id and g.group_name == name), None)

    def default_subnet_for(self, zone: str) -> Subnet | None:
        """The zone's default subnet (as stored once an attribute or tag was changed);
        None once it, or the default VPC, was deleted."""
        derived = default_subnet(self.default_vpc, self.region, zone)
        if not self.has_default_vpc or self.removed(derived.subnet_id):
            return None
        rec = self._records.get(derived.subnet_id)
        return rec[1] if rec is not None and isinstance(rec[1], Subnet) else derived

    def key_pairs(self) -> list[KeyPair]:
        return [k for (owner, _), k in self._key_pairs.items() if visible(owner)]

    def key_pair(self, name: str) -> KeyPair | None:
        """The caller's key named ``name`` (an admin's own first, then any account's)."""
        found = self._key_pairs.get((account(self.owner_id), name))
        if found is not None:
            return found
        return next((k for (owner, n), k in self._key_pairs.items()
                     if n == name and visible(owner)), None)

    def addresses_in_use(self, subnet_id: str) -> int:
        return len(self._addresses.get(subnet_id, {}))

    @property
    def synced(self) -> bool:
        return all(e.is_set() for e in self._synced.values())

    # -- network records -------------------------------------------------------------

    @staticmethod
    def record_id(rec: NetworkRecord) -> str:
        if isinstance(rec, Vpc):
            return rec.vpc_id
        if isinstance(rec, Subnet):
            return rec.subnet_id
        return rec.group_id

    async def create(self, rec: NetworkRecord) -> None:
        """Write a record under a new id (a collision of random ids is a retry)."""
        key = self.record_id(rec)
        try:
            rev = await self._kvs["network"].create(key, msgspec.json.encode(rec))
        except nats.js.errors.KeyWrongLastSequenceError:
            raise ServiceUnavailable(f"The id {key} was taken meanwhile; retry.") from None
        except BUS_DOWN as exc:
            raise _unavailable("network", exc) from None
        self._records[key] = (rev, rec)

    async def change(self, key: str, base: R, edit: Callable[[R], R]) -> R:
        """Apply ``edit`` to the record under ``key`` with CAS retries; ``base`` is what
        a derived default looks like before anything was stored for it."""
        kv = self._kvs["network"]
        for _ in range(_RETRIES):
            rev, current = self._records.get(key, (0, base))
            if not isinstance(current, type(base)):
                raise ServiceUnavailable(f"{key} holds an unexpected record; retry.")
            updated = edit(current)
            data = msgspec.json.encode(updated)
            try:
                if rev:
                    rev = await kv.update(key, data, last=rev)
                else:
                    rev = await kv.create(key, data)
            except nats.js.errors.KeyWrongLastSequenceError:
                await self._reload(key)
                continue
            except BUS_DOWN as exc:
                raise _unavailable("network", exc) from None
            self._records[key] = (rev, updated)
            return updated
        raise ServiceUnavailable(f"{key} is changing too fast; retry.")

    async def mark_removed(self, base: D, *, removed: bool,
                           already: Exception | None = None) -> D:
        """Delete (``removed``) or create again a derived default, by compare-and-set
        on the record under its id; ``already`` is raised when it is so already (a
        gateway that raced this one won; None: it stays as it is). Created again, it
        is as derived: no tags."""
        def edit(current: D) -> D:
            if current.removed == removed:
                if already is None:
                    return current
                raise already
            return msgspec.structs.replace(base, removed=removed)
        return await self.change(self.record_id(base), base, edit)

    async def _reload(self, key: str) -> None:
        try:
            entry = await self._kvs["network"].get(key)
        except nats.js.errors.KeyNotFoundError:
            self._records.pop(key, None)
            return
        except BUS_DOWN as exc:
            raise _unavailable("network", exc) from None
        try:
            self._records[key] = (entry.revision or 0, _RECORD.decode(entry.value or b""))
        except _DECODE_ERRORS:
            self._records.pop(key, None)

    async def remove(self, key: str) -> None:
        try:
            await self._kvs["network"].delete(key)
        except BUS_DOWN as exc:
            raise _unavailable("network", exc) from None
        self._records.pop(key, None)

    async def claim_name(self, vpc_id: str, name: str, group_id: str) -> bool:
        """Reserve ``name`` in ``vpc_id`` for ``group_id``; False if it is taken."""
        key = name_key(vpc_id, name, account(self.owner_id))
        try:
            await self._kvs["network"].create(key, group_id.encode())
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        except BUS_DOWN as exc:
            raise _unavailable("network", exc) from None
        self._names[key] = group_id
        return True

    async def claim_ipv6_block(self, vpc_id: str) -> str:
        """A /56 of the IPv6 pool for ``vpc_id``, claimed under ``ipv6block.<n>`` with
        compare-and-set (two gateways never give one block twice)."""
        for attempt in range(_RETRIES):
            n, block = ipv6_block(vpc_id, attempt)
            try:
                await self._kvs["network"].create(f"ipv6block.{n}", vpc_id.encode())
            except nats.js.errors.KeyWrongLastSequenceError:
                continue
            except BUS_DOWN as exc:
                raise _unavailable("network", exc) from None
            return block
        raise ServiceUnavailable("No free IPv6 block was found; retry.")

    async def release_ipv6_block(self, vpc_id: str, block: str) -> None:
        for attempt in range(_RETRIES):
            n, candidate = ipv6_block(vpc_id, attempt)
            if candidate == block:
                try:
                    await self._kvs["network"].delete(f"ipv6block.{n}")
                except BUS_DOWN as exc:
                    log.warning("could not release %s of %s: %r", block, vpc_id, exc)
                return

    async def release_name(self, vpc_id: str, name: str, owner_id: str) -> None:
        key = name_key(vpc_id, name, owner_id)
        try:
            await self._kvs["network"].delete(key)
        except BUS_DOWN as exc:
            log.warning("could not release group name %s: %r", key, exc)
        self._names.pop(key, None)

    async def set_instance_groups(self, instance_id: str, group_ids: list[str]) -> None:
        """ModifyInstanceAttribute GroupId.N replaces the set: the last write wins, as
        two such calls on EC2 would."""
        try:
            await self._kvs["network"].put(f"igroups.{instance_id}",
                                           msgspec.json.encode(group_ids))
        except BUS_DOWN as exc:
            raise _unavailable("network", exc) from None
        self.instance_groups[instance_id] = list(group_ids)

    # -- key pairs -------------------------------------------------------------------

    async def create_key_pair(self, pair: KeyPair) -> bool:
        """False when the name is taken in the caller's account."""
        owner = account(self.owner_id)
        try:
            await self._kvs["key_pairs"].create(key_pair_key(owner, pair.key_name),
                                                msgspec.json.encode(pair))
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        except BUS_DOWN as exc:
            raise _unavailable("key pair", exc) from None
        self._key_pairs[(owner, pair.key_name)] = pair
        return True

    async def delete_key_pair(self, pair: KeyPair) -> None:
        owner = next((o for (o, _), k in self._key_pairs.items() if k is pair),
                     account(self.owner_id))
        key = key_pair_key(owner, pair.key_name)
        if owner == DEFAULT_ACCOUNT and key.removeprefix(f"{owner}.") in self._legacy_pairs:
            key = key.removeprefix(f"{owner}.")
        try:
            await self._kvs["key_pairs"].delete(key)
        except BUS_DOWN as exc:
            raise _unavailable("key pair", exc) from None
        self._key_pairs.pop((owner, pair.key_name), None)

    # -- addresses -------------------------------------------------------------------

    async def allocate(self, subnet: Subnet, launch_id: str, wanted: str = "") -> str:
        """Claim an address of ``subnet`` for ``launch_id``: ``wanted`` or the lowest
        free one (from this process's `stripe` on). A lost race moves on to the next."""
        if wanted and not usable(subnet, wanted):
            raise InvalidParameterValue(
                f"Address {wanted} is not in the usable range of {subnet.subnet_id} "
                f"({subnet.cidr}).")
        taken = self._addresses.setdefault(subnet.subnet_id, {})
        # Addresses this gateway is claiming right now: its own concurrent launches go
        # to different ones rather than race each other through the bucket.
        pending = self._pending.setdefault(subnet.subnet_id, set())
        tried: set[int] = set()
        claim = msgspec.json.encode(AddressClaim(launch_id, time.time()))
        for _ in range(_ADDRESS_RETRIES):
            skip = self._scanned.get(subnet.subnet_id, (subnet, 0))[1]
            ip = wanted or first_free(subnet, _AnyOf(taken.keys(), tried, pending),
                                      stripe=self.stripe, skip=skip)
            if ip is None and skip:
                self._scanned.pop(subnet.subnet_id, None)
                continue  # look once more from the start before saying it is full
            if ip is None:
                raise InsufficientFreeAddressesInSubnet(
                    f"There are not enough free addresses in subnet '{subnet.subnet_id}' "
                    "to satisfy the requested number of instances.")
            n = int(ipaddress.IPv4Address(ip))
            if wanted and (n in taken or n in pending):
                raise InvalidIPAddressInUse(f"Address {ip} is in use.")
            if not wanted:  # everything before it in the search is in use
                self._scanned[subnet.subnet_id] = (
                    subnet, scan_position(subnet, n, stripe=self.stripe))
            pending.add(n)
            claimed = False
            freed = self._freed.get(subnet.subnet_id, {})
            last = freed.get(n, 0)
            key = address_key(subnet.subnet_id, ip)
            try:
                if last:
                    rev = await self._kvs["addresses"].update(key, claim, last=last)
                else:
                    rev = await self._kvs["addresses"].create(key, claim)
            except nats.js.errors.KeyWrongLastSequenceError:
                if freed.pop(n, None) is not None:
                    continue  # the delete seen here was not the last word: ask anew
                if wanted:
                    raise InvalidIPAddressInUse(f"Address {ip} is in use.") from None
                tried.add(n)
                continue
            except BUS_DOWN as exc:
                raise _unavailable("address", exc) from None
            else:
                claimed = True
            finally:
                pending.discard(n)
                if not claimed:
                    self._unused(subnet.subnet_id, n)
            taken[n] = (rev, AddressClaim(launch_id, time.time()))
            return ip
        raise ServiceUnavailable(f"Addresses in {subnet.subnet_id} are changing too fast.")

    async def release(self, subnet_id: str, ip: str, launch_id: str) -> None:
        """Give back ``ip`` if ``launch_id`` still holds it. The delete is conditional
        on the revision, so a late release never frees an address someone else took."""
        try:
            n = int(ipaddress.IPv4Address(ip))
        except ValueError:
            return
        held = self._addresses.get(subnet_id, {}).get(n)
        if held is None or held[1].launch_id != launch_id:
            return
        try:
            await self._kvs["addresses"].delete(address_key(subnet_id, ip), last=held[0])
        except nats.js.errors.KeyWrongLastSequenceError:
            return
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code in WRONG_LAST_SEQUENCE:  # KV's delete raises it unwrapped:
                return  # another gateway (or worker of this one) released it first
            log.warning("could not release %s in %s: %s", ip, subnet_id, exc)  # names the code
            return
        except BUS_DOWN as exc:
            log.warning("could not release %s in %s: %r", ip, subnet_id, exc)
            return
        self._addresses.get(subnet_id, {}).pop(n, None)
        self._unused(subnet_id, n)

    def _unused(self, subnet_id: str, n: int) -> None:
        """``n`` may be free now: the next search of its subnet starts no later."""
        scanned = self._scanned.get(subnet_id)
        if scanned is not None:
            subnet, skip = scanned
            at = max(0, scan_position(subnet, n, stripe=self.stripe))
            if at < skip:
                self._scanned[subnet_id] = (subnet, at)

    def gives_back(self, launch_id: str) -> bool:
        """Whether this process gives back what ``launch_id`` held when its instance
        ends (and expires its record if its node was forgotten). Every process of a pool
        sees every instance end; one of them (by a stable hash of the launch, over the
        pool's `stripe`) writes the deletes, so a pool of n does not send n for each
        address, n - 1 of them refused. One that missed it (it was restarting) leaves it
        to the sweep of any process."""
        index, count = self.stripe
        return count <= 1 or share_of(launch_id, count) == index

    def instance_gone(self, rec: InstanceRecord) -> None:
        """An instance terminated or expired: its address comes back (in the background;
        deletes are conditional and idempotent, so another gateway trying too is
        harmless)."""
        if not self.gives_back(rec.launch_id):
            return
        if rec.instance_id in self.instance_groups:
            self._chore(self._forget_groups(rec.instance_id))
        if rec.public_ip:
            self._chore(self.release(PUBLIC_POOL_ID, rec.public_ip, rec.launch_id))
        if not rec.private_ip or rec.network is None or not rec.network.subnet_id:
            return
        self._chore(self.release(rec.network.subnet_id, rec.private_ip, rec.launch_id))

    def public_dropped(self, rec: InstanceRecord) -> None:
        """``rec``'s public address is no longer its own (it stopped): give it back."""
        if self.gives_back(rec.launch_id):
            self._chore(self.release(PUBLIC_POOL_ID, rec.public_ip, rec.launch_id))

    async def _forget_groups(self, instance_id: str) -> None:
        try:
            await self._kvs["network"].delete(f"igroups.{instance_id}")
        except BUS_DOWN as exc:
            log.warning("could not drop the groups of %s: %r", instance_id, exc)

    async def sweep(self, records: Iterable[InstanceRecord], now: float) -> int:
        """Take back addresses that no live instance holds and that are older than
        `ORPHAN_AFTER` (a gateway died mid-launch), and at once those of terminated
        instances whose release was missed (the process that gives them back was down).
        Returns how many were freed."""
        live: dict[tuple[str, int], str] = {}
        ended: set[str] = set()
        for k, r in enumerate(records):
            if k % SWEEP_SLICE == SWEEP_SLICE - 1:
                await asyncio.sleep(0)
            if r.state == "terminated":
                ended.add(r.launch_id)
                continue
            if r.network is not None and r.private_ip:
                live[(r.network.subnet_id, _address(r.private_ip))] = r.launch_id
            if r.public_ip:
                live[(PUBLIC_POOL_ID, _address(r.public_ip))] = r.launch_id
        freed = seen = 0
        for subnet_id, held in list(self._addresses.items()):
            for n, (_, claim) in list(held.items()):
                seen += 1  # counted across subnets: many small ones are as long a walk
                if seen % SWEEP_SLICE == 0:
                    await asyncio.sleep(0)
                if live.get((subnet_id, n)) == claim.launch_id:
                    continue
                if now - claim.at < ORPHAN_AFTER and claim.launch_id not in ended:
                    continue  # a launch may still be in flight; an ended one is not
                await self.release(subnet_id, str(ipaddress.IPv4Address(n)), claim.launch_id)
                freed += 1
        return freed

    def _chore(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(self._bounded(coro))
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)

    async def _bounded(self, coro: Coroutine[Any, Any, None]) -> None:
        """At most `CHORES_AT_ONCE` background writes in flight: a TerminateInstances of
        a thousand ids ended a thousand instances at once, and as many KV deletes sent
        together timed out at the server (the sweep then had to take them back)."""
        async with self._chore_slots:
            await coro

    # -- watching --------------------------------------------------------------------

    def start(self, records: Callable[[], list[InstanceRecord]]) -> None:
        self._tasks = [asyncio.create_task(self._follow(kv, what), name=f"watch-{what}")
                       for what, kv in self._kvs.items()]
        self._tasks.append(asyncio.create_task(self._sweeper(records), name="sweep-addresses"))

    async def wait_synced(self, timeout: float | None) -> None:
        await asyncio.wait_for(
            asyncio.gather(*(e.wait() for e in self._synced.values())), timeout)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, *self._chores, return_exceptions=True)

    async def _sweeper(self, records: Callable[[], list[InstanceRecord]]) -> None:
        while True:
            await asyncio.sleep(SWEEP_EVERY)
            try:
                await self.sweep(records(), time.time())
            except Exception as exc:  # a sweep is best effort; the next one retries
                log.warning("address sweep failed: %r", exc)

    def _follow(self, kv: KeyValue, what: str) -> Coroutine[Any, Any, None]:
        return follow_bucket(kv, what, on_entry=lambda e: self._on_entry(what, e),
                             synced=self._synced[what])

    def _on_entry(self, what: str, entry: KeyValue.Entry) -> None:
        removed = entry.operation in (KV_DEL, KV_PURGE)
        key, rev, value = entry.key, entry.revision or 0, entry.value or b""
        try:
            if what == "addresses":
                subnet_id, _, dotted = key.partition(".")
                n = int(ipaddress.IPv4Address(dotted.replace("_", ".")))
                held = self._addresses.setdefault(subnet_id, {})
                freed = self._freed.setdefault(subnet_id, {})
                if removed:
                    held.pop(n, None)
                    self._unused(subnet_id, n)
                    if entry.operation == KV_DEL:
                        freed[n] = rev
                    else:
                        freed.pop(n, None)
                else:
                    held[n] = (rev, msgspec.json.decode(value, type=AddressClaim))
                    freed.pop(n, None)
            elif what == "key_pairs":
                owner, name = _key_pair_name(key)
                if "." not in key:
                    (self._legacy_pairs.discard if removed else self._legacy_pairs.add)(key)
                if removed:
                    self._key_pairs.pop((owner, name), None)
                else:
                    self._key_pairs[(owner, name)] = msgspec.json.decode(value, type=KeyPair)
            elif key.startswith("igroups."):
                iid = key.removeprefix("igroups.")
                if removed:
                    self.instance_groups.pop(iid, None)
                else:
                    self.instance_groups[iid] = msgspec.json.decode(value, type=list[str])
            elif key.startswith("ipv6block."):
                pass  # claims only: the VPC record carries its block
            elif key.startswith("sgname."):
                if removed:
                    self._names.pop(key, None)
                else:
                    self._names[key] = value.decode()
            elif removed:
                self._records.pop(key, None)
            else:
                cur = self._records.get(key)
                if cur is None or rev >= cur[0]:
                    self._records[key] = (rev, _RECORD.decode(value))
        except (*_DECODE_ERRORS, UnicodeError):
            log.warning("undecodable %s entry %s", what, key)
