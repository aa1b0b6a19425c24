"""The node agent: the authority on one host's capacity.

Start-up order matters: local state is read and running instances are re-adopted into
the ledger *before* the agent subscribes to anything, so a restarted node never
advertises room that its surviving instances already hold.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import secrets
import shutil
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

import msgspec
from nats.aio.client import Client
from nats.js.kv import KeyValue

from roost.bus import schemas as s
from roost.bus import subjects
from roost.bus.auth import NatsAuth
from roost.bus.connect import NoDirectGet, connect, key_value, last_values
from roost.bus.contents import live_entries
from roost.bus.failures import BUS_DOWN
from roost.domain.catalog import BUILTIN, Catalog
from roost.domain.commands import Protection, instance_shutdown, refusal
from roost.domain.host import HostCapacity
from roost.domain.images import IMAGES
from roost.domain.lifecycle import TRANSITIONS, InstanceState, check_transition
from roost.node.console import console_tail, trim_consoles
from roost.node.drivers import (
    DriverError,
    Exit,
    InstanceDriver,
    SimDriver,
    StartSpec,
    keep_image,
    kept_image,
    launch_refusal,
)
from roost.node.handlers import BusHandlers
from roost.node.isolation import Level, make_isolation
from roost.node.ledger import Ledger
from roost.node.metadata import ENDPOINT_ENV, NodeMetadata
from roost.node.metrics import InstanceUsageCollector, serve_metrics
from roost.node.process import ProcessDriver
from roost.node.state import NodeState
from roost.node.subscriptions import TypeSubscriptions

log = logging.getLogger(__name__)
St = InstanceState
MOVE_ENDS = {St.SHUTTING_DOWN: St.TERMINATED, St.STOPPING: St.STOPPED}
"""Where a stop or termination under way ends."""
ORDERS_EVERY = 20.0
"""Seconds (at least ten heartbeats) between two reads of a node's orders while it runs."""
FENCE_SECONDS = 600.0
"""How long a lookup's fence is kept: far past any launch timeout and its retries, so
an attempt stuck behind a stall that long is still refused."""
FENCES_KEPT = 10_000
"""At most this many fences at once (a few MiB), the oldest dropped first: a fan-out
lookup fences its id on every node, and only a storm of them fills this."""
EXPIRE_BATCH = 64
"""Expired records forgotten at once: their KV deletes together, one SQLite commit."""
ORDERS_READ_TIMEOUT = 10.0
"""Seconds one read of the orders may take; past it the node starts (or beats) without
them and reads them again later."""


@dataclass
class NodeConfig:
    node_id: str
    nats_urls: list[str]
    data_dir: Path
    host: HostCapacity
    catalog: Catalog = field(default_factory=lambda: BUILTIN)
    driver: str = "process"
    availability_zone: str = "roost-1a"
    heartbeat_seconds: float = 2.0
    stop_grace_seconds: float = 10.0
    isolation: Level = "cgroup"
    max_inflight: int = 256
    """Messages handled at once; past it a subscription waits (NATS buffers, then tells
    the sender it is slow) instead of the agent spawning without bound."""
    terminated_retention_seconds: float = 3600.0
    """How long a terminated instance stays describable (EC2: about an hour); then its
    record, KV entry, user data and directory are removed."""
    imds_port: int | None = 0
    """Loopback port of the metadata service: 0 picks one once and keeps it in the data
    dir; None runs no metadata service."""
    metrics_port: int | None = None
    nats_auth: NatsAuth | None = None
    """This node's NATS user (`roost.bus.auth`); None connects anonymously."""

    def __post_init__(self) -> None:
        subjects.check_node_id(self.node_id)


now_iso = s.now_iso


def new_instance_id() -> str:
    return "i-" + secrets.token_hex(9)[:17]


def make_driver(config: NodeConfig) -> InstanceDriver:
    if config.driver == "process":
        iso = make_isolation(config.isolation, node_id=config.node_id,
                             data_dir=config.data_dir)
        return ProcessDriver(iso)
    if config.driver == "vm":
        from roost.node.vm.driver import make_vm_driver  # QEMU's client only when used

        return make_vm_driver(node_id=config.node_id, isolation=config.isolation,
                              data_dir=config.data_dir)
    if config.driver == "sim":
        return SimDriver()
    raise ValueError(f"unknown driver {config.driver!r}: expected 'process', 'vm' or 'sim'")


class NodeAgent:
    def __init__(self, config: NodeConfig, *, driver: InstanceDriver | None = None) -> None:
        self.config = config
        self.node_id = config.node_id
        self.driver = driver or make_driver(config)
        self.ledger = Ledger(config.host, config.catalog,
                             overhead_mib=self.driver.overhead_mib)
        self.state = NodeState(config.data_dir / "node.sqlite3")
        self.boot_id = uuid.uuid4().hex
        self.draining = False
        self._rebooting: set[str] = set()
        self._booting: dict[str, asyncio.Task[None]] = {}
        self._stopping = False
        self.stopped = asyncio.Event()
        self._records: dict[str, s.InstanceRecord] = {}
        self._seq = 0
        self._inflight: dict[str, asyncio.Future[s.LaunchReply]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._orders_read: asyncio.Task[None] | None = None
        """The heartbeat's read of this node's orders, while one runs (one at a time)."""
        self._fences: dict[str, tuple[int, float]] = {}
        """Launch id -> (fence_ms, when set): `lookup`'s fences, oldest first."""
        self._unpublished: set[str] = set()  # records whose last KV put failed
        self._nc: Client | None = None
        self._kv: KeyValue | None = None
        self._orders_kv: KeyValue | None = None
        self._ordered: set[str] = set()  # orders being carried out
        self._subs: TypeSubscriptions | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._imds: NodeMetadata | None = None
        self.metrics_server: WSGIServer | None = None
        self.instance_env: dict[str, str] = {}
        """Environment every instance's program gets from this node (where its metadata
        service is), set before `start`."""

    # --- start, drain, stop -------------------------------------------------------

    async def start(self) -> None:
        if self.config.imds_port is not None and self.driver.name != "sim":
            self._imds = NodeMetadata(records=self._records, state=self.state,
                                      driver=self.driver, data_dir=self.config.data_dir,
                                      port=self.config.imds_port)
            await self._imds.start()
            self.instance_env[ENDPOINT_ENV] = self._imds.endpoint
        if self.config.metrics_port is not None:
            self.metrics_server = serve_metrics(
                InstanceUsageCollector(lambda: self._records, self.driver, self.node_id),
                port=self.config.metrics_port)
        await self._readopt()
        self._nc = await connect(self.config.nats_urls, name=f"roost-node-{self.node_id}",
                                 auth=self.config.nats_auth)
        self._kv = await key_value(self._nc, subjects.INSTANCES_BUCKET)
        self._orders_kv = await key_value(self._nc, subjects.NODE_ORDERS_BUCKET, direct=True)
        await self._read_orders()
        for rec in self._records.values():
            await self._publish(rec.instance_id)
        self._subs = await BusHandlers(self).subscribe(self._nc)
        await self._changed()
        self._resume_moves()
        self._heartbeat = asyncio.create_task(self._heartbeat_loop())
        log.info("node %s up: %d instances adopted, %d types fit", self.node_id,
                 self.ledger.count, len(self._subs.types))

    async def _readopt(self) -> None:
        for stored in self.state.all():
            rec = stored.record
            self._records[rec.instance_id] = rec
            state = St(rec.state)
            if not state.holds_capacity:
                continue
            itype = self.config.catalog.get(rec.instance_type)
            if itype is None:
                log.error("instance %s has unknown type %s; not counted", rec.instance_id,
                          rec.instance_type)
                continue
            self.ledger.adopt(rec.instance_id, itype, tuple((d, m) for d, m in rec.gpus))
            spec = self._spec(rec, stored.user_data)
            if self.driver.adopt(spec, stored.process, self._on_exit):
                continue
            # Its process is gone (it ended while the agent was down, or the host
            # rebooted): record what we know instead of advertising a ghost.
            target = MOVE_ENDS.get(state, St.STOPPED)
            await self._move(rec.instance_id, target, reason="Server.InstanceProcessGone",
                             note="the instance's process was gone when the node agent restarted",
                             announce=False)

    def _resume_moves(self) -> None:
        """Finish the stops and terminations a killed agent left under way: a re-adopted
        instance still ``stopping`` or ``shutting-down`` has a live process (one whose
        process was gone was moved on by `_readopt`), and the task that was to stop it
        died with the agent. Without this it stays there: a repeated command finds it
        already stopping or shutting down and changes nothing."""
        for rec in list(self._records.values()):
            target = MOVE_ENDS.get(St(rec.state))
            if target is not None:  # the reason `_terminate` and `_stop` give
                self._track(self._finish(rec.instance_id, target,
                                         "Client.UserInitiatedShutdown"))

    async def _read_orders(self, *, after: float = 0.0) -> None:
        """Carry out this node's orders (docs/architecture.md, "Lost nodes"): those given
        while it was lost. At start this runs before the node re-publishes and
        subscribes, so it never advertises room that an instance its users terminated
        still holds; afterwards the heartbeat reads them again now and then, one read at
        a time, ``after`` seconds from now.

        After a gap in the heartbeat the read waits a random part of a beat: the agents
        of one process stall together (a starved process, a GC pause), and their reads
        would all reach JetStream in the same moment. At 1,000 nodes on loaded cores,
        thousands of these reads timed out beside the nodes' record puts; a new one had
        been started on every late beat while the last was still waiting out its 10 s.

        A read, not a standing watch: a watch is a JetStream consumer per node on one
        stream, and a stream takes at most about a thousand of them, which would cap a
        cluster's nodes (found by `roost bench scale` at 1,000 nodes). The read is one
        batched direct get, which makes no consumer either (so a thousand nodes reading
        at once is no thousand consumers); a bucket made without direct gets is read
        through a short-lived watch."""
        assert self._orders_kv is not None and self._nc is not None
        if after:
            await asyncio.sleep(after)
        orders: dict[str, s.NodeOrder] = {}
        forgotten = False
        try:
            try:
                found = await last_values(self._nc, subjects.NODE_ORDERS_BUCKET,
                                          subjects.node_orders(self.node_id),
                                          timeout=ORDERS_READ_TIMEOUT)
            except NoDirectGet:
                found = await self._watch_orders()
        except BUS_DOWN as exc:  # read again at the next heartbeat that reads them
            log.warning("node %s: its orders could not be read (%r)", self.node_id, exc)
            return
        for key, value in found.items():
            what = key.partition(".")[2]
            if what == subjects.FORGOTTEN:
                forgotten = True
                continue
            try:
                orders[what] = s.decode(value, s.NodeOrder)
            except (msgspec.DecodeError, msgspec.ValidationError):
                log.error("node %s: unreadable order %s", self.node_id, key)
        await asyncio.gather(*(self._carry_out(iid, o) for iid, o in orders.items()))
        if forgotten:
            try:
                await self._orders_kv.delete(subjects.node_order(self.node_id,
                                                                 subjects.FORGOTTEN))
            except BUS_DOWN as exc:  # the marker stays; the next read deletes it
                log.warning("node %s: its forgotten mark could not be cleared (%r)",
                            self.node_id, exc)
            log.warning("node %s had been forgotten (roost node forget): it rejoins with "
                        "%d instances", self.node_id, self.ledger.count)

    async def _watch_orders(self) -> dict[str, bytes]:
        """This node's orders read through a watch (key -> value), for a bucket that
        answers no direct gets: to the end of its contents (`roost.bus.contents`), since
        nats-py's end-of-contents mark can come before them."""
        assert self._orders_kv is not None
        return await live_entries(self._orders_kv, subjects.node_orders(self.node_id),
                                  timeout=ORDERS_READ_TIMEOUT)

    async def _carry_out(self, instance_id: str, order: s.NodeOrder) -> None:
        """Terminate ``instance_id`` as ``order`` says, then delete the order. Delivered
        twice, or for an instance already gone, it changes nothing but the delete."""
        if instance_id in self._ordered:
            return
        self._ordered.add(instance_id)
        try:
            rec = self._records.get(instance_id)
            if rec is not None and St(rec.state) is not St.TERMINATED:
                await self._booted(instance_id)
                if St(self._records[instance_id].state) is not St.SHUTTING_DOWN:
                    await self._move(instance_id, St.SHUTTING_DOWN, note=order.note)
                await self.driver.stop(instance_id, grace=self.config.stop_grace_seconds)
                if St(self._records[instance_id].state) is St.SHUTTING_DOWN:
                    await self._move(instance_id, St.TERMINATED, reason=order.reason,
                                     note=order.note)
                log.info("node %s: terminated %s as ordered while it was lost (%s)",
                         self.node_id, instance_id, order.note)
            assert self._orders_kv is not None
            await self._orders_kv.delete(subjects.node_order(self.node_id, instance_id))
        except Exception:  # the order stays; the next read retries it
            log.exception("node %s: carrying out the order for %s failed", self.node_id,
                          instance_id)
        finally:
            self._ordered.discard(instance_id)

    async def drain(self) -> None:
        """Stop advertising and refuse new launches; running instances keep running."""
        if self.draining:
            return
        self.draining = True
        await self._changed()
        log.info("node %s draining", self.node_id)

    async def stop(self) -> None:
        if self._stopping:
            return  # SIGTERM and a drain request may both ask
        self._stopping = True
        await self.drain()
        if self._heartbeat:
            self._heartbeat.cancel()
        others = self._tasks - {asyncio.current_task()}  # stop() may itself be tracked
        if others:
            await asyncio.gather(*others, return_exceptions=True)
        await self.driver.close()
        if self._imds is not None:
            await self._imds.stop()
        if self.metrics_server is not None:
            await asyncio.to_thread(self.metrics_server.shutdown)  # waits out one poll
            self.metrics_server.server_close()
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.drain()
        self.state.close()
        self.stopped.set()

    @property
    def imds_endpoint(self) -> str:
        return self._imds.endpoint if self._imds is not None else ""

    # --- helpers ----------------------------------------------------------------------

    async def _move(
        self, instance_id: str, target: InstanceState, *, reason: str = "", note: str = "",
        announce: bool = True, **changes: object,
    ) -> s.InstanceRecord:
        rec = self._records[instance_id]
        check_transition(St(rec.state), target)
        if target is St.STOPPED:
            changes.setdefault("public_ip", "")  # EC2 gives the public address back
        rec = msgspec.structs.replace(
            rec, state=target.value, state_reason=reason,
            state_transition_reason=note or rec.state_transition_reason,
            updated_at=now_iso(), **changes,
        )
        self._records[instance_id] = rec
        # In the same step as the state change, with no await between: a describe must
        # never see a stopped or terminated instance whose room is still held.
        released = not target.holds_capacity and self.ledger.release(instance_id)
        self.state.put(rec)
        if released and self._subs is not None:
            # Advertise the room before announcing the state, so a client that saw the
            # instance stop and launches again finds the room already offered.
            try:
                await self._changed()
            except Exception:  # the state change stands; the next heartbeat re-syncs it
                log.exception("node %s: re-advertising after %s failed", self.node_id,
                              instance_id)
            if self._records[instance_id] is not rec:
                return rec  # a later move overtook this one and announces itself
        if announce:
            await self._publish(instance_id)
        return rec

    async def _changed(self) -> None:
        """After any allocate, release or drain: fix subscriptions, then tell the world."""
        assert self._subs is not None
        await self._subs.sync(self._wanted)
        await self._publish_snapshot()

    def _wanted(self) -> frozenset[str]:
        """The launch subscriptions the node should hold now."""
        return frozenset() if self.draining else self.ledger.fitting_types()

    def snapshot(self) -> s.CapacitySnapshot:
        self._seq += 1
        free, alloc = self.ledger.free, self.config.host.allocatable
        return s.CapacitySnapshot(
            node_id=self.node_id, boot_id=self.boot_id, seq=self._seq,
            availability_zone=self.config.availability_zone, draining=self.draining,
            alloc_cpu_milli=alloc.cpu_milli, alloc_mem_mib=alloc.mem_mib,
            free_cpu_milli=free.resources.cpu_milli, free_mem_mib=free.resources.mem_mib,
            gpu_free=list(free.gpu_free), gpu_models=list(free.gpu_models),
            fit={} if self.draining else self.ledger.fit_counts(),
            instances=self.ledger.count,
            heartbeat_seconds=self.config.heartbeat_seconds, sent_at=time.time(),
            isolation=self.driver.isolation, isolation_note=self.driver.isolation_note,
            cannot_launch=self.driver.cannot_launch,
        )

    async def _publish_snapshot(self) -> None:
        if self._nc is not None and self._nc.is_connected:
            await self._nc.publish(subjects.capacity(self.node_id), s.encode(self.snapshot()))

    async def _heartbeat_loop(self) -> None:
        beat = self.config.heartbeat_seconds
        # Housekeeping (expiry, console trims) at a random point of its first period, so
        # that agents started together do not all do it in the same beat.
        next_expiry = time.monotonic() + random.uniform(0.0, self._housekeeping_every())
        next_orders = time.monotonic() + max(ORDERS_EVERY, 10 * beat)
        last = time.monotonic()
        after_gap = False
        while True:
            await asyncio.sleep(beat)
            now = time.monotonic()
            # Gateways count a node silent for three beats as lost and leave it orders.
            # A node that comes back without a restart (a frozen process thawed, a
            # partition healed) reads them after such a gap; every node also reads them
            # now and then, for an order given in the moment it came back. A read still
            # in flight when the gap is seen asked before it, and may miss what was
            # ordered meanwhile: the read after the gap is then the next one, as soon
            # as that one ends.
            if now - last > 2 * beat:
                after_gap, next_orders = True, now
            if now >= next_orders and (self._orders_read is None
                                       or self._orders_read.done()):
                next_orders = now + max(ORDERS_EVERY, 10 * beat)
                self._orders_read = self._track(self._read_orders(
                    after=random.uniform(0.0, beat) if after_gap else 0.0))
                after_gap = False
            last = now
            try:
                # Subscriptions too, not only the snapshot: a sync that failed after a
                # release (see `_move`) is mended here. Nothing changed costs no I/O.
                await self._changed()
                for iid in list(self._unpublished):
                    await self._publish(iid)
                if time.monotonic() >= next_expiry:
                    next_expiry = time.monotonic() + self._housekeeping_every()
                    await self._expire_terminated()
                    await self._trim_consoles()
            except Exception:  # a NATS hiccup must not end the heartbeat for good
                log.exception("node %s: heartbeat failed", self.node_id)

    def _housekeeping_every(self) -> float:
        return min(60.0, self.config.terminated_retention_seconds / 4)

    async def _publish(self, instance_id: str) -> None:
        """Put the instance's record in the KV bucket, as it is now. SQLite is the
        node's truth and is always written first; a put that fails (NATS down, a
        timeout) is not the caller's failure: the record is kept for the heartbeat to
        put again until it lands, so gateways converge without the node losing a step."""
        rec = self._records.get(instance_id)
        if rec is None or self._kv is None:
            return
        try:
            await self._kv.put(instance_id, s.encode(rec))
        except Exception as exc:  # any bus failure: the outbox below retries it
            if instance_id not in self._unpublished:
                log.warning("node %s: publishing %s failed (%r); will retry", self.node_id,
                            instance_id, exc)
            self._unpublished.add(instance_id)
            return
        self._unpublished.discard(instance_id)

    async def _trim_consoles(self) -> None:
        """Cut back consoles grown past their limit, off the event loop: a stat per
        instance, which at a hundred instances a node (and hundreds of agents a process,
        in `roost bench scale`) had been a quarter of the nodes' CPU, on their loops."""
        root = str(self.config.data_dir / "instances")
        paths = {os.path.join(root, iid, "console.log"): iid
                 for iid, rec in self._records.items() if St(rec.state).holds_capacity}
        for path in await asyncio.to_thread(trim_consoles, list(paths)):
            log.info("node %s: console of %s cut back to its last 64 KiB",
                     self.node_id, paths[path])

    async def _expire_terminated(self) -> None:
        """Forget instances terminated longer ago than the retention: the KV entry first
        (gateways drop the instance, its tags and user data when they see it go), then
        the local row and directory. A failure leaves the row for the next round.

        Done in batches, off the event loop where it touches the disk: a node forgetting
        hundreds of instances at once, one KV round trip, one SQLite commit and one
        directory removal after another on its loop, answered no launch or command
        meanwhile (gateways saw NodeTimeout)."""
        cutoff = datetime.now(UTC).timestamp() - self.config.terminated_retention_seconds
        due = [iid for iid, rec in self._records.items()
               if rec.state == St.TERMINATED.value and s.stamp_seconds(rec.updated_at) <= cutoff]
        for start in range(0, len(due), EXPIRE_BATCH):
            batch = due[start:start + EXPIRE_BATCH]
            if self._kv is not None:
                kv = self._kv
                done = await asyncio.gather(*(kv.delete(iid) for iid in batch),
                                            return_exceptions=True)
                failed = [r for r in done if isinstance(r, BaseException)]
                if failed:
                    log.warning("node %s: %d expired records stay for the next round (%r)",
                                self.node_id, len(failed), failed[0])
                batch = [iid for iid, r in zip(batch, done, strict=True)
                         if not isinstance(r, BaseException)]
            self.state.delete_many(batch)
            for iid in batch:
                self._records.pop(iid, None)
            dirs = [self._workdir(iid) for iid in batch]
            await asyncio.to_thread(_remove_all, dirs)
            if batch:
                log.info("node %s: forgot %d instances terminated before %s", self.node_id,
                         len(batch), datetime.fromtimestamp(cutoff, UTC).isoformat())

    # --- launches ---------------------------------------------------------------------

    async def launch(self, req: s.LaunchRequest) -> s.LaunchReply:
        """Launch one instance. Concurrent duplicates of a launch id wait for the first
        and get its answer; a launch id this node has made returns that instance."""
        pending = self._inflight.get(req.launch_id)
        if pending is None:
            pending = asyncio.get_running_loop().create_future()
            self._inflight[req.launch_id] = pending
            try:
                pending.set_result(await self._launch(req))
            except Exception as exc:
                log.exception("node %s: launch %s failed", self.node_id, req.launch_id)
                pending.set_result(s.LaunchReply(launch_id=req.launch_id, ok=False,
                                                 node_id=self.node_id, error="internal",
                                                 message=str(exc)))
            finally:
                del self._inflight[req.launch_id]
        return await asyncio.shield(pending)

    async def _launch(self, req: s.LaunchRequest) -> s.LaunchReply:
        def refuse(error: s.LaunchError, message: str) -> s.LaunchReply:
            return s.LaunchReply(launch_id=req.launch_id, ok=False, node_id=self.node_id,
                                 error=error, message=message)

        seen = self.state.by_launch(req.launch_id)
        if seen is not None:  # a retry of a launch this node already made
            return s.LaunchReply(launch_id=req.launch_id, ok=True, node_id=self.node_id,
                                 instance=self._records[seen.record.instance_id])
        if self.fenced(req):  # from here to the state's put no await: a lookup waits
            return refuse("no_capacity", f"node {self.node_id}: launch {req.launch_id} was "
                          "looked up here and not found after this attempt was sent; "
                          "the asker has placed it elsewhere")
        if self.draining:
            return refuse("no_capacity", f"node {self.node_id} is draining")
        itype = self.config.catalog.get(req.instance_type)
        if itype is None:
            return refuse("unknown_type", f"unknown instance type {req.instance_type!r}")
        image = req.image or IMAGES.get(req.image_id)
        if image is None:
            return refuse("bad_request", f"unknown image {req.image_id!r}")
        instance_id = new_instance_id()
        alloc = self.ledger.allocate(instance_id, itype, req.gpu_devices)
        if alloc is None:
            return refuse("no_capacity", f"node {self.node_id} can't fit {itype.name}")
        try:
            self.driver.prepare(StartSpec(instance_id, itype, image, req.user_data,
                                          self._workdir(instance_id)))
        except DriverError as exc:
            self.ledger.release(instance_id)
            log.error("node %s: launch %s refused: %s", self.node_id, req.launch_id, exc)
            return refuse(launch_refusal(exc), f"node {self.node_id}: {exc}")
        if req.image is not None:  # a registered image: kept for the instance's restarts
            keep_image(self._workdir(instance_id), req.image)
        now = now_iso()
        rec = s.InstanceRecord(
            instance_id=instance_id, node_id=self.node_id, instance_type=itype.name,
            image_id=req.image_id, state=St.PENDING.value, launch_id=req.launch_id,
            reservation_id=req.reservation_id, launch_time=now,
            availability_zone=self.config.availability_zone, tags=dict(req.tags),
            client_token=req.client_token, owner_id=req.owner_id,
            ami_launch_index=req.ami_launch_index, gpus=list(alloc.gpus),
            updated_at=now, options=req.options, private_ip=req.private_ip, network=req.network,
            public_ip=req.public_ip,
        )
        self._records[instance_id] = rec
        self.state.put(rec, user_data=req.user_data)
        await self._publish(instance_id)
        await self._changed()
        self._boot_soon(instance_id, req.user_data)
        return s.LaunchReply(launch_id=req.launch_id, ok=True, node_id=self.node_id,
                             instance=rec)

    def _track(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _workdir(self, instance_id: str) -> Path:
        return self.config.data_dir / "instances" / instance_id

    def _spec(self, rec: s.InstanceRecord, user_data: str) -> StartSpec:
        env = dict(self.instance_env)
        env.update(ROOST_INSTANCE_ID=rec.instance_id, ROOST_INSTANCE_TYPE=rec.instance_type)
        workdir = self._workdir(rec.instance_id)
        return StartSpec(rec.instance_id, self.config.catalog[rec.instance_type],
                         IMAGES.get(rec.image_id) or kept_image(workdir), user_data, workdir,
                         env)

    def _boot_soon(self, instance_id: str, user_data: str) -> None:
        task = asyncio.create_task(self._boot(instance_id, user_data))
        self._tasks.add(task)
        self._booting[instance_id] = task

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            if self._booting.get(instance_id) is t:
                del self._booting[instance_id]

        task.add_done_callback(done)

    async def _booted(self, instance_id: str) -> None:
        """Wait for a start under way: a stop must find the process it is to stop."""
        boot = self._booting.get(instance_id)
        if boot is not None:
            await asyncio.shield(boot)

    async def _boot(self, instance_id: str, user_data: str) -> None:
        spec = self._spec(self._records[instance_id], user_data)
        try:
            ref = await self.driver.start(spec, self._on_exit)
        except (OSError, DriverError) as exc:
            log.error("node %s: %s failed to start: %s", self.node_id, instance_id, exc)
            await self._move(instance_id, St.STOPPED, reason="Server.InternalError",
                             note=f"failed to start: {exc}")
            return
        self.state.set_process(instance_id, ref)
        if St(self._records[instance_id].state) is St.PENDING:
            await self._move(instance_id, St.RUNNING)

    async def _on_exit(self, instance_id: str, ended: Exit) -> None:
        """The instance's program ended on its own: EC2's instance-initiated shutdown,
        which stops or terminates it as its shutdown behaviour says."""
        rec = self._records[instance_id]
        if St(rec.state) not in (St.PENDING, St.RUNNING) or instance_id in self._rebooting:
            return  # a stop, terminate or reboot is already moving it
        out = instance_shutdown(behavior=rec.opts.shutdown_behavior, exit_code=ended.code,
                                oom_limit_mib=ended.oom_limit_mib)
        if ended.oom_limit_mib is not None:
            log.warning("node %s: instance %s %s", self.node_id, instance_id, out.note)
        for target in out.states:
            await self._move(instance_id, target, reason=out.reason, note=out.note,
                             exit_code=ended.code)

    # --- lifecycle commands -------------------------------------------------------------

    async def command(self, cmd: s.InstanceCommand) -> s.CommandReply:
        """Apply one lifecycle command. Stop, terminate and reboot answer at once (with
        the transitional state for the first two, as EC2 does) and finish in the
        background; protection is checked here, where the record is authoritative."""
        iid, op = cmd.instance_id, cmd.op
        if op in ("stop", "reboot", "modify"):
            # A start in progress lands first (milliseconds): EC2 lets an instance be
            # stopped as soon as it runs, and a caller that launches then stops at once
            # should not meet the instant in between.
            await self._booted(iid)
        rec = self._records[iid]
        before = St(rec.state)
        if op == "describe":
            return s.CommandReply(ok=True, instance=rec, previous_state=before.value)
        if op == "console":
            return s.CommandReply(ok=True, instance=rec, previous_state=before.value,
                                  console=console_tail(self._workdir(iid) / "console.log"),
                                  console_at=now_iso())
        opts = rec.opts
        changes = cmd.changes
        refused = refusal(op, iid, before, Protection(opts.disable_api_termination,
                                                      opts.disable_api_stop),
                          rollback=cmd.force, changes_type_or_data=changes is not None and (
                              changes.instance_type is not None
                              or changes.user_data is not None))
        if refused is not None:
            return s.CommandReply(ok=False, previous_state=before.value, error=refused[0],
                                  message=refused[1])
        if op == "modify":
            return await self._modify(iid, before, changes)
        if op == "terminate":
            rec = await self._terminate(iid, before)
        elif op == "stop":
            rec = await self._stop(iid, before)
        elif op == "reboot":
            self._track(self._reboot(iid))
        else:
            started = await self._start(iid, before, cmd.public_ip)
            if started is None:
                return s.CommandReply(ok=False, previous_state=before.value,
                                      error="InsufficientInstanceCapacity",
                                      message=f"node {self.node_id} has no room to start "
                                              f"{iid} as {rec.instance_type}")
            rec = started
        return s.CommandReply(ok=True, instance=rec, previous_state=before.value)

    async def _terminate(self, instance_id: str, before: InstanceState) -> s.InstanceRecord:
        if before in (St.SHUTTING_DOWN, St.TERMINATED):
            return self._records[instance_id]
        rec = await self._move(instance_id, St.SHUTTING_DOWN, note="User initiated")
        self._track(self._finish(instance_id, St.TERMINATED, "Client.UserInitiatedShutdown"))
        return rec

    async def _stop(self, instance_id: str, before: InstanceState) -> s.InstanceRecord:
        if before in (St.STOPPING, St.STOPPED):
            return self._records[instance_id]
        rec = await self._move(instance_id, St.STOPPING, note="User initiated")
        self._track(self._finish(instance_id, St.STOPPED, "Client.UserInitiatedShutdown"))
        return rec

    async def _finish(self, instance_id: str, target: InstanceState, reason: str) -> None:
        await self._booted(instance_id)
        await self.driver.stop(instance_id, grace=self.config.stop_grace_seconds)
        current = St(self._records[instance_id].state)
        if current is target or target not in TRANSITIONS[current]:
            return  # a terminate overtook a stop; its own task finishes the move
        await self._move(instance_id, target, reason=reason)  # gives the room back

    async def _start(self, instance_id: str, before: InstanceState, public_ip: str = ""
                     ) -> s.InstanceRecord | None:
        if before in (St.PENDING, St.RUNNING):
            return self._records[instance_id]
        rec = self._records[instance_id]
        itype = self.config.catalog[rec.instance_type]
        alloc = self.ledger.allocate(instance_id, itype)
        if alloc is None:
            return None
        rec = await self._move(instance_id, St.PENDING, note="User initiated",
                               gpus=list(alloc.gpus), exit_code=None, public_ip=public_ip)
        await self._changed()
        stored = self.state.get(instance_id)
        self._boot_soon(instance_id, stored.user_data if stored else "")
        return rec

    async def _reboot(self, instance_id: str) -> None:
        """Restart the instance's program in place: same id, allocation, devices and
        cgroup; the state stays running, as on EC2."""
        self._rebooting.add(instance_id)
        try:
            await self._booted(instance_id)
            await self.driver.stop(instance_id, grace=self.config.stop_grace_seconds,
                                   keep=True)
            rec = self._records[instance_id]
            if St(rec.state) is not St.RUNNING:
                return  # a stop or terminate overtook the reboot
            stored = self.state.get(instance_id)
            ref = await self.driver.start(self._spec(rec, stored.user_data if stored else ""),
                                          self._on_exit)
            self.state.set_process(instance_id, ref)
            log.info("node %s: rebooted %s", self.node_id, instance_id)
        except (OSError, DriverError) as exc:
            log.error("node %s: %s failed to reboot: %s", self.node_id, instance_id, exc)
            await self._move(instance_id, St.STOPPED, reason="Server.InternalError",
                             note=f"failed to reboot: {exc}")
        finally:
            self._rebooting.discard(instance_id)

    async def _modify(self, instance_id: str, before: InstanceState,
                      changes: s.InstanceChanges | None) -> s.CommandReply:
        """ModifyInstanceAttribute and ModifyInstanceMetadataOptions. The type and the
        user data change only while stopped (EC2's rule); starting again re-checks room
        for the new type."""
        if changes is None:
            return s.CommandReply(ok=False, error="MissingParameter",
                                  message="nothing to modify")
        update: dict[str, object] = {}
        if changes.instance_type is not None:
            if changes.instance_type not in self.config.catalog:
                return s.CommandReply(
                    ok=False, error="InvalidInstanceAttributeValue",
                    message=f"The instance type '{changes.instance_type}' is not supported "
                            f"on node {self.node_id}.")
            update["instance_type"] = changes.instance_type
        if changes.options is not None:
            update["options"] = changes.options
        if changes.network is not None:
            update["network"] = changes.network
        if changes.user_data is not None:
            self.state.set_user_data(instance_id, changes.user_data)
        rec = await self._rewrite(instance_id, **update)
        return s.CommandReply(ok=True, instance=rec, previous_state=before.value)

    async def _rewrite(self, instance_id: str, **changes: object) -> s.InstanceRecord:
        """Change a record without a state transition: stored, then announced."""
        rec = msgspec.structs.replace(self._records[instance_id], updated_at=now_iso(),
                                      **changes)
        self._records[instance_id] = rec
        self.state.put(rec)
        await self._publish(instance_id)
        return rec

    # --- fan-out ----------------------------------------------------------------------

    def describe_types(self) -> s.DescribeTypesReply:
        counts = {} if self.draining else self.ledger.fit_counts()
        types = [
            s.TypeInfo(name=t.name, cpu_milli=t.cpu_milli, mem_mib=t.mem_mib,
                       gpu_count=t.gpu_count, gpu_milli=t.gpu_milli,
                       gpu_model=next(iter(t.gpu_models), ""), gpu_models=list(t.gpu_models),
                       free=counts.get(t.name, 0))
            for t in self.config.catalog.values()
        ]
        return s.DescribeTypesReply(node_id=self.node_id, types=types)

    def lookup(self, launch_id: str, *, fence_ms: int = 0) -> s.LaunchReply | None:
        """The launch this node made under ``launch_id``, if any. With ``fence_ms``, one
        it has not made it will not make from an attempt sent before then (`fenced`):
        an attempt queued here behind a stall, answered for before it ran, would be
        made beside the instance the asker places elsewhere."""
        seen = self.state.by_launch(launch_id)
        if seen is None:
            if fence_ms:
                self._fence(launch_id, fence_ms)
            return None
        return s.LaunchReply(launch_id=launch_id, ok=True, node_id=self.node_id,
                             instance=self._records[seen.record.instance_id])

    def _fence(self, launch_id: str, fence_ms: int) -> None:
        fences = self._fences
        fences[launch_id] = (max(fence_ms, fences.pop(launch_id, (0, 0.0))[0]),
                             time.monotonic())
        cutoff = time.monotonic() - FENCE_SECONDS
        while fences and (len(fences) > FENCES_KEPT
                          or next(iter(fences.values()))[1] < cutoff):
            del fences[next(iter(fences))]

    def fenced(self, req: s.LaunchRequest) -> bool:
        """Whether ``req`` was sent before a lookup found its launch not made here."""
        fence = self._fences.get(req.launch_id)
        return fence is not None and req.sent_ms < fence[0]

    def track(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return self._track(coro)

    def holds(self, instance_id: str) -> bool:
        return instance_id in self._records


def _remove_all(dirs: list[Path]) -> None:
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
