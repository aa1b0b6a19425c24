"""The EC2 model behind the actions: typed requests in, results or `RoostError`s out.

Nothing here sees HTTP or XML (see `actions`); nothing here builds a subject (see
`nodes`). Launch placement lives in `launch`; what is described comes from the mirror in
`index`, so a Describe never waits on a node.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Literal

import msgspec

from roost.bus.schemas import (
    DEFAULT_OPTIONS,
    CommandReply,
    InstanceCommand,
    InstanceNetwork,
    InstanceRecord,
    LaunchRequest,
    NodeOrder,
    now_iso,
)
from roost.domain.accounts import DEFAULT_ACCOUNT, demand
from roost.domain.catalog import InstanceType
from roost.domain.commands import Protection, refusal
from roost.domain.errors import (
    DryRunOperation,
    IncorrectInstanceState,
    InsufficientInstanceCapacity,
    InternalError,
    InvalidParameterValue,
    OperationNotPermitted,
    RoostError,
    ServiceUnavailable,
)
from roost.domain.images import Image
from roost.domain.lifecycle import InstanceState
from roost.domain.network import Subnet, ipv6_addresses
from roost.gateway.capacity import CapacityView
from roost.gateway.images import ImageStore
from roost.gateway.index import InstanceIndex
from roost.gateway.launch import Launcher
from roost.gateway.metrics import GatewayMetrics
from roost.gateway.model import (
    FIXED_ATTRIBUTES,
    RECORDED_ATTRIBUTES,
    Reservation,
    StateChange,
    recorded_attributes,
)
from roost.gateway.netservice import NetworkService
from roost.gateway.nodes import BadReply, NodeClient, NodeTimeout, NoResponders, error_for_code
from roost.gateway.quotas import QuotaBook
from roost.gateway.requests import (
    ConsoleOutputRequest,
    InstanceIdsRequest,
    ModifyInstanceRequest,
    RunInstancesRequest,
)
from roost.gateway.tagging import changed
from roost.gateway.templates import TemplateStore
from roost.gateway.tenancy import account
from roost.gateway.tokens import Claim, TokenEntry, TokenStore, fingerprint
from roost.gateway.types import TypeRegistry
from roost.gateway.volservice import VolumeService

log = logging.getLogger(__name__)

Op = Literal["stop", "start", "terminate", "reboot"]
DRY_RUN = "Request would have succeeded, but DryRun flag is set."
PARALLEL_COMMANDS = 32
"""Stop, start and terminate commands of one request in flight at once (as
`roost.gateway.launch.PARALLEL_LAUNCHES` for launches)."""
_VERBS = {"stop": "stopped", "start": "started", "terminate": "terminated",
          "reboot": "rebooted"}


@dataclass(frozen=True, slots=True)
class Site:
    """Where this gateway is: its region, the owner id it stamps, its request limits."""

    region: str = "roost-1"
    owner_id: str = "000000000000"
    max_instances_per_request: int = 500

    @property
    def default_zone(self) -> str:
        return f"{self.region}a"


def _with_ipv6(target: Target, launch_id: str, count: int) -> InstanceNetwork:
    """The launch's network identity, with its IPv6 addresses when it asked for any."""
    if not count:
        return target.network
    return msgspec.structs.replace(target.network, ipv6_addresses=ipv6_addresses(
        target.subnet.ipv6_cidr, launch_id, count))


def new_reservation_id() -> str:
    return "r-" + secrets.token_hex(9)[:17]


class Ec2Service:
    def __init__(
        self,
        *,
        site: Site,
        view: CapacityView,
        types: TypeRegistry,
        launcher: Launcher,
        nodes: NodeClient,
        index: InstanceIndex,
        tokens: TokenStore,
        metrics: GatewayMetrics,
        net: NetworkService,
        templates: TemplateStore,
        images: ImageStore,
        volumes: VolumeService,
        quotas: QuotaBook | None = None,
    ) -> None:
        self.site = site
        self.view = view
        self.types = types
        self.launcher = launcher
        self.nodes = nodes
        self.index = index
        self.tokens = tokens
        self.metrics = metrics
        self.net = net
        self.templates = templates
        self.quotas = quotas
        self.images = images
        self.volumes = volumes

    def zones(self) -> list[str]:
        """Zones with live nodes; the region's default zone while there are none."""
        return sorted(self.view.zones()) or [self.site.default_zone]

    # -- RunInstances ---------------------------------------------------------------

    async def _validate(self, req: RunInstancesRequest) -> tuple[InstanceType, Target]:
        image = self.images.require(req.image_id)
        itype = await self.types.resolve(req.instance_type)
        if req.availability_zone and req.availability_zone not in self.zones():
            raise InvalidParameterValue(
                f"Invalid availability zone: [{req.availability_zone}]"
            )
        if req.min_count > self.site.max_instances_per_request:
            raise InvalidParameterValue(
                f"MinCount may be at most {self.site.max_instances_per_request}."
            )
        if req.dry_run:
            raise DryRunOperation(DRY_RUN)
        return itype, self._target(req, itype, image)

    def _target(self, req: RunInstancesRequest, itype: InstanceType, image: Image) -> Target:
        """The subnet and network identity of a launch, and the zone placement must keep
        to. Without a subnet or a zone, EC2 picks a default subnet; roost picks the zone
        whose nodes last said they have the most room for the type, and keeps placement
        to it only when the cluster has more than one zone."""
        zone = req.availability_zone
        if not req.network.subnet_id and not zone:
            every = self.zones()
            # Only zones with a default subnet (all of them, unless one was deleted).
            zones = [z for z in every
                     if self.net.store.default_subnet_for(z) is not None] or every
            room = self.view.room_by_zone(itype.name)
            zone = max(zones, key=lambda z: (room.get(z, 0), -zones.index(z)))
            placement_zone = zone if len(every) > 1 else ""
        else:
            placement_zone = zone
        subnet, network = self.net.resolve(req.network, zone, image)
        if req.network.subnet_id:
            placement_zone = subnet.availability_zone
        return Target(subnet, network, placement_zone)

    async def run_instances(self, req: RunInstancesRequest) -> Reservation:
        itype, target = await self._validate(req)
        zone = target.zone
        owner = account(self.site.owner_id)
        # Every instance asked for joins the workload the roost and fgd policies learn
        # from, placed or not (a replayed ClientToken is not asked for again).
        count = min(req.max_count, self.site.max_instances_per_request)
        if self.launcher.says_full(itype, zone) and not (
                req.client_token and await self.tokens.known(owner_id=owner,
                                                             token=req.client_token)):
            # A full cluster answers before a token is claimed (and released again); a
            # token already used goes the whole way, so its reservation is replayed.
            try:
                self.launcher.refuse_if_full(itype, zone)
            except InsufficientInstanceCapacity:
                self.metrics.launches.labels("insufficient_capacity").inc(req.min_count)
                self.launcher.observe(itype, count)
                raise
        claim: Claim | None = None
        rid = new_reservation_id()
        fp = fingerprint(req.fingerprint())
        if req.client_token:
            found = await self.tokens.claim(owner_id=owner, token=req.client_token,
                                            fingerprint=fp, reservation_id=rid)
            if isinstance(found, TokenEntry):
                return self._replay(found)
            claim, rid = found, found.reservation_id
        self.launcher.observe(itype, count)
        try:
            count = await self._reserve(owner, rid, itype, req.min_count, count)
        except Exception:
            if claim is not None:
                await self.tokens.release(claim)
            raise
        launches = [self._launch_request(req, rid, i, owner) for i in range(count)]
        launch_ids = [launch.launch_id for launch in launches]
        started = asyncio.get_running_loop().time()
        try:
            addresses, publics = await self.net.place_both(
                target.subnet, target.network, launch_ids, req.network.private_ip)
        except Exception:
            await self._settle(owner, rid, itype, [])
            if claim is not None:
                await self.tokens.release(claim)
            raise
        launches = [msgspec.structs.replace(launch, private_ip=ip, public_ip=pub,
                                            network=_with_ipv6(target, launch.launch_id,
                                                               req.network.ipv6_count))
                    for launch, ip, pub in zip(launches, addresses, publics, strict=True)]
        try:
            records = await self.launcher.launch_many(
                launches, itype, min_count=req.min_count, zone=zone,
                reconcile_first=bool(claim and claim.takeover),
            )
        except Exception as exc:
            await self.net.release_both(target.subnet, launch_ids, addresses, publics)
            await self._settle(owner, rid, itype, [])
            outcome = ("insufficient_capacity" if isinstance(exc, InsufficientInstanceCapacity)
                       else "failed")
            self.metrics.launches.labels(outcome).inc(req.min_count)
            if claim is not None:
                await self.tokens.release(claim)
            raise
        await self._settle(owner, rid, itype, records)
        held = {(r.launch_id, r.private_ip, r.public_ip) for r in records}
        unused = [(lid, ip, pub) for lid, ip, pub in zip(launch_ids, addresses, publics,
                                                         strict=True)
                  if (lid, ip, pub) not in held]
        await self.net.release_both(target.subnet, [u[0] for u in unused],
                                    [u[1] for u in unused], [u[2] for u in unused])
        self.metrics.launch_seconds.observe(asyncio.get_running_loop().time() - started)
        self.metrics.launches.labels("launched").inc(len(records))
        records.sort(key=lambda r: r.ami_launch_index)
        for rec in records:
            self.index.upsert(rec)
        if req.user_data:
            encoded = base64.b64encode(req.user_data.encode()).decode()
            await asyncio.gather(*(self.index.put_user_data(r.instance_id, encoded)
                                   for r in records))
        if claim is not None:
            await self.tokens.finish(claim, fingerprint=fp, owner_id=owner,
                                     instances=records)
        return Reservation(rid, owner, tuple(records))

    async def _reserve(self, owner: str, rid: str, itype: InstanceType, min_count: int,
                       count: int) -> int:
        """Hold the account's quota for up to ``count`` instances before placing any
        (`QuotaBook.reserve`: compare-and-set, so gateways racing cannot overshoot)."""
        if self.quotas is None:
            return count
        now = time.time()
        return await self.quotas.reserve(owner, rid, lambda n: demand(itype, n, now),
                                         min_count=min_count, max_count=count)

    async def _settle(self, owner: str, rid: str, itype: InstanceType,
                      records: list[InstanceRecord]) -> None:
        """The launch's hold becomes what its instances hold (nothing, if it failed)."""
        if self.quotas is None:
            return
        now = time.time()
        await self.quotas.settle(owner, rid, {r.instance_id: demand(itype, 1, now)
                                              for r in records})

    def _launch_request(self, req: RunInstancesRequest, rid: str, index: int,
                        owner: str) -> LaunchRequest:
        return LaunchRequest(
            launch_id=f"{rid}-{index}", instance_type=req.instance_type,
            image_id=req.image_id, reservation_id=rid, user_data=req.user_data,
            image=self.images.registered(req.image_id),
            tags=dict(req.tags), availability_zone=req.availability_zone,
            client_token=req.client_token, owner_id=owner, ami_launch_index=index,
            options=None if req.options == DEFAULT_OPTIONS else req.options,
        )

    def _replay(self, entry: TokenEntry) -> Reservation:
        """The reservation an earlier request with this token made, as it is now."""
        records = [self.index.find(r.instance_id) or r for r in entry.instances]
        return Reservation(entry.reservation_id, entry.owner_id, tuple(records))

    # -- Stop, Start, Terminate -------------------------------------------------------

    async def change_state(self, op: Op, req: InstanceIdsRequest) -> list[StateChange]:
        records = await self.index.require(req.instance_ids)
        if req.dry_run:
            raise DryRunOperation(DRY_RUN)
        _check_protection(op, records)
        # Force means "stop without waiting" and nothing else: termination protection is
        # lifted only by the gateway's own rollback (`Launcher.rollback`).
        force = req.force and op == "stop"
        # A request may name a thousand instances; all sent at once, the nodes' answers
        # came after the command timeout (NodeTimeout, 503) for many of them.
        gate = asyncio.Semaphore(PARALLEL_COMMANDS)

        async def one(rec: InstanceRecord) -> StateChange:
            async with gate:
                return await self._command(op, rec, force=force)

        results = await asyncio.gather(*(one(rec) for rec in records),
                                       return_exceptions=True)
        changes = []
        for res in results:
            if isinstance(res, BaseException):
                raise res
            changes.append(res)
        return changes

    async def _command(self, op: Op, rec: InstanceRecord, *, force: bool) -> StateChange:
        iid = rec.instance_id
        if rec.state == "terminated":
            if op == "terminate":
                return StateChange(iid, "terminated", "terminated")
            raise IncorrectInstanceState(
                f"The instance '{iid}' is not in a state from which it can be {_VERBS[op]}."
            )
        if op == "terminate" and self.view.lost(rec.node_id):
            # Accepted and deferred: the node carries it out when it is back, or
            # `roost node forget` does (docs/architecture.md, "Lost nodes").
            shown = await self.index.order(rec, NodeOrder(
                op="terminate", note=f"User initiated (deferred: node {rec.node_id} is lost)",
                at=now_iso()))
            return StateChange(iid, shown.state, rec.state)
        held = op == "start" and rec.state == "stopped" and await self._hold(rec)
        public = ""
        try:
            if op == "start" and rec.state == "stopped":
                (public,) = await self.net.place_public(rec.net, [rec.launch_id])
            reply = await self._ask(rec, InstanceCommand(op=op, instance_id=iid, force=force,
                                                         public_ip=public))
        except Exception:
            if held:
                await self._release(rec)
            await self.net.release(self.net.store.public_pool, [rec.launch_id], [public])
            raise
        if public and (reply.instance is None or reply.instance.public_ip != public):
            # Started already by a racing call, which claimed its own.
            await self.net.release(self.net.store.public_pool, [rec.launch_id], [public])
        if op == "stop":
            await self._release(rec)
        current = reply.instance.state if reply.instance is not None else rec.state
        return StateChange(iid, current, reply.previous_state or rec.state)

    def health(self, rec: InstanceRecord) -> str:
        """DescribeInstanceStatus's status of ``rec``'s checks."""
        if rec.state != "running":
            return "not-applicable"
        return "impaired" if self.view.lost(rec.node_id) else "ok"

    async def _hold(self, rec: InstanceRecord) -> bool:
        """Quotas count running instances: a start holds again what a stop gave back
        (True if it held anything, to give back should the start fail)."""
        owner = rec.owner_id or DEFAULT_ACCOUNT
        if self.quotas is None or not self.quotas.counts(owner):
            return False
        itype = await self.types.resolve(rec.instance_type)
        return await self.quotas.hold_instance(owner, rec.instance_id,
                                               demand(itype, 1, time.time()))

    async def _release(self, rec: InstanceRecord) -> None:
        if self.quotas is not None:
            await self.quotas.release(rec.owner_id or DEFAULT_ACCOUNT, rec.instance_id)

    async def _ask(self, rec: InstanceRecord, cmd: InstanceCommand) -> CommandReply:
        """Send ``cmd`` to the node that holds ``rec``; its refusal as the EC2 error."""
        if self.view.lost(rec.node_id):
            silent = self.view.silent_for(rec.node_id)
            raise ServiceUnavailable(
                f"Node {rec.node_id}, which holds {rec.instance_id}, is lost (silent "
                f"{f'for {silent:.0f} s' if silent is not None else 'since this gateway started'}"
                "); only TerminateInstances is accepted for its instances until it is back.")
        try:
            reply = await self.nodes.command(rec.node_id, cmd)
        except (NoResponders, NodeTimeout) as exc:
            raise ServiceUnavailable(
                f"Node {rec.node_id}, which holds {rec.instance_id}, did not answer "
                f"({type(exc).__name__})."
            ) from None
        except BadReply as exc:
            raise InternalError(f"Node {rec.node_id} sent an unreadable reply: {exc}") from None
        if not reply.ok:
            raise error_for_code(reply.error, reply.message)
        if reply.instance is not None:
            self.index.upsert(reply.instance)
        return reply

    async def console_output(self, req: ConsoleOutputRequest) -> ConsoleOutput:
        """The last 64 KiB of the instance's console. roost's console is live, so the
        latest output is what either value of ``Latest`` gets."""
        (rec,) = await self.index.require([req.instance_id])
        if req.dry_run:
            raise DryRunOperation(DRY_RUN)
        if rec.state == "terminated":
            return ConsoleOutput(rec.instance_id, "", rec.updated_at)
        reply = await self._ask(rec, InstanceCommand(op="console", instance_id=rec.instance_id))
        return ConsoleOutput(rec.instance_id, reply.console, reply.console_at)

    async def modify_instance(self, req: ModifyInstanceRequest) -> None:
        """ModifyInstanceAttribute and ModifyInstanceMetadataOptions.

        What roost enforces (protection, shutdown behaviour, type, user data, metadata
        options) goes to the node, which owns the record. Attributes roost has no notion
        of may be "set" only to the value they have, which is what Terraform does before
        a destroy; anything else is refused.
        """
        (rec,) = await self.index.require([req.instance_id])
        network = recorded_attributes(rec, req.fixed)
        for name, value in req.fixed.items():
            if network is not None and name in RECORDED_ATTRIBUTES:
                continue
            current = FIXED_ATTRIBUTES.get(name)
            if current is None or value.lower() != current.lower():
                raise InvalidParameterValue(
                    f"roost cannot set {name} to {value!r} on {req.instance_id}."
                )
        if req.instance_type is not None:
            await self.types.resolve(req.instance_type)
        if req.dry_run:
            raise DryRunOperation(DRY_RUN)
        if req.group_ids:
            await self.net.set_groups(rec, req.group_ids)
        if req.delete_on_termination:
            rec = msgspec.structs.replace(rec, network=network or rec.network)
            network = await self.volumes.set_delete_on_termination(
                rec, req.delete_on_termination) or network
        if not (req.options or req.instance_type is not None or req.user_data is not None
                or network is not None):
            return
        changes = msgspec.structs.replace(req.changes(rec.opts), network=network)
        cmd = InstanceCommand(op="modify", instance_id=rec.instance_id, changes=changes)
        await self._ask(rec, cmd)
        if req.user_data is not None:
            encoded = base64.b64encode(req.user_data.encode()).decode()
            await self.index.put_user_data(rec.instance_id, encoded)

    # -- Tags ---------------------------------------------------------------------------

    async def change_tags(self, ids: tuple[str, ...], tags: dict[str, str | None], *,
                          delete: bool, dry_run: bool) -> None:
        """Every resource is checked against the tag limit before any is changed, so a
        call that one resource refuses changes none; each write checks again against
        what it writes over (`tagging.changed`), which a racing call may have grown."""
        instance_ids = [i for i in ids if i.startswith("i-")]
        others = [i for i in ids if not i.startswith("i-")]
        records = await self.index.require(instance_ids)
        held = [(r.instance_id, r.tags) for r in records]
        held += [(n_id, n.tags) for n_id, n in
                 zip(others, self.net.require_taggable(others), strict=True)]
        for rid, current in held:
            changed(rid, current, tags, delete=delete)
        if dry_run:
            raise DryRunOperation(DRY_RUN)
        for rec in records:
            await self.index.set_tags(rec, tags, delete=delete)
        for rid in others:
            await self.net.change_tags(rid, tags, delete=delete)


@dataclass(frozen=True, slots=True)
class Target:
    """Where a launch goes: its subnet, what its instances record of the network, and
    the zone placement keeps to ("" for any)."""

    subnet: Subnet
    network: InstanceNetwork
    zone: str


@dataclass(frozen=True, slots=True)
class ConsoleOutput:
    instance_id: str
    output: str  # base64
    timestamp: str  # ISO 8601, UTC


def _check_protection(op: Op, records: list[InstanceRecord]) -> None:
    """Refuse the whole call, before any instance is touched, when one of them is
    protected against it (as EC2 does). The node checks again, against races."""
    for rec in records:
        opts = rec.opts
        refused = refusal(op, rec.instance_id, InstanceState(rec.state),
                          Protection(opts.disable_api_termination, opts.disable_api_stop))
        if refused is not None and refused[0] == OperationNotPermitted.code:
            raise OperationNotPermitted(refused[1])


def failure_code(exc: BaseException) -> str:
    return exc.code if isinstance(exc, RoostError) else InternalError.code
