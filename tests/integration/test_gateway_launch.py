"""Launch orchestration over a real nats-server, against scripted nodes that lose races,
go quiet or vanish: the cases a healthy cluster rarely shows on demand."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import msgspec
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from roost.bus import schemas as s
from roost.bus import subjects
from roost.bus.connect import key_value
from roost.decide.placement import DEFAULT_POLICY, placements
from roost.decide.workload import parse_workload_toml
from roost.domain.catalog import BUILTIN
from roost.embedded import NatsServer
from roost.gateway.requests import RunInstancesRequest
from roost.gateway.server import Gateway, GatewayConfig
from roost.gateway.tokens import TokenEntry, fingerprint, token_key
from tests.polling import until

RUN = ("Action=RunInstances&Version=2016-11-15&ImageId=ami-00000000000000001"
       "&InstanceType=t3.micro&MinCount=1&MaxCount=1")


class ScriptedNode:
    """A node that speaks the contract and does what the test says, on real NATS."""

    def __init__(self, nc: Client, node_id: str, *, free_cpu: int,
                 on_launch: Callable[[s.LaunchRequest], str | None],
                 gpu_free: tuple[int, ...] = (), own_lookup: str = "answers") -> None:
        self.nc, self.node_id, self.free_cpu, self.gpu_free = nc, node_id, free_cpu, gpu_free
        # "answers"; "absent": a node older than its own lookup subject; "dropped": the
        # server drops the gateway's lookups there (a grant older than the subject)
        self.own_lookup = own_lookup
        self.fanout_lookups = 0
        # "ok", "no_capacity", "unsupported", or None (stay silent)
        self.on_launch = on_launch
        self.launches: list[s.LaunchRequest] = []
        self.held: dict[str, s.InstanceRecord] = {}
        self.cannot_launch = ""

    def record(self, req: s.LaunchRequest) -> s.InstanceRecord:
        return s.InstanceRecord(
            instance_id=f"i-{abs(hash(req.launch_id)) % 16**17:017x}", node_id=self.node_id,
            instance_type=req.instance_type, image_id=req.image_id, state="pending",
            launch_id=req.launch_id, reservation_id=req.reservation_id,
            launch_time="2026-01-01T00:00:00.000Z", availability_zone="roost-1a",
            client_token=req.client_token)

    async def start(self) -> None:
        await self.nc.subscribe(subjects.node_launch(self.node_id), cb=self._launch)
        await self.nc.subscribe(subjects.LAUNCH_LOOKUP, cb=self._lookup)
        if self.own_lookup != "absent":
            await self.nc.subscribe(subjects.node_lookup(self.node_id), cb=self._own_lookup)
        await self.publish(1)

    async def publish(self, seq: int) -> None:
        snap = s.CapacitySnapshot(
            node_id=self.node_id, boot_id="b", seq=seq, availability_zone="roost-1a",
            draining=False, alloc_cpu_milli=16000, alloc_mem_mib=65536,
            free_cpu_milli=self.free_cpu, free_mem_mib=65536, heartbeat_seconds=30.0,
            sent_at=time.time(),
            fit={"t3.micro": self.free_cpu // 2000,
                 "gs1.quarter": sum(f // 250 for f in self.gpu_free)},
            gpu_free=list(self.gpu_free), gpu_models=["A10G"] * len(self.gpu_free),
            cannot_launch=self.cannot_launch)
        await self.nc.publish(subjects.capacity(self.node_id), s.encode(snap))

    async def _launch(self, msg: Msg) -> None:
        req = s.decode(msg.data, s.LaunchRequest)
        self.launches.append(req)
        outcome = self.on_launch(req)
        rec = self.record(req)
        if outcome == "ok" or outcome == "silent-but-launched":
            self.held[req.launch_id] = rec
        if outcome == "ok":
            await msg.respond(s.encode(s.LaunchReply(launch_id=req.launch_id, ok=True,
                                                     node_id=self.node_id, instance=rec)))
        elif outcome in ("no_capacity", "unsupported"):
            await msg.respond(s.encode(s.LaunchReply(
                launch_id=req.launch_id, ok=False, node_id=self.node_id, error=outcome,
                message=f"node {self.node_id}: no QEMU here")))

    async def _own_lookup(self, msg: Msg) -> None:
        if self.own_lookup == "dropped":
            return
        req = s.decode(msg.data, s.LaunchLookup)
        await msg.respond(s.encode(s.LaunchesFound(node_id=self.node_id, instances=[
            self.held[lid] for lid in req.launch_ids if lid in self.held])))

    async def _lookup(self, msg: Msg) -> None:
        req = s.decode(msg.data, s.LaunchLookup)
        self.fanout_lookups += 1
        rec = self.held.get(req.launch_id)
        if rec is not None:
            await msg.respond(s.encode(s.LaunchReply(launch_id=req.launch_id, ok=True,
                                                     node_id=self.node_id, instance=rec)))


@pytest.fixture
async def bus(nats_server: NatsServer) -> AsyncIterator[Client]:
    nc = await nats.connect(nats_server.url)
    yield nc
    await nc.close()


@pytest.fixture
async def gateway(nats_server: NatsServer) -> AsyncIterator[Gateway]:
    gw = Gateway(GatewayConfig(nats_urls=[nats_server.url], port=0, auth=False,
                               launch_timeout=0.5, full_after=0.0))
    await gw.start()
    yield gw
    await gw.stop()


async def post(gw: Gateway, body: str) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.post(gw.endpoint + "/", content=body.encode(), timeout=30)


async def until_live(gw: Gateway, count: int) -> None:
    service = gw.service
    assert service is not None
    await until(f"{count} nodes show up in the capacity view",
                lambda: service.view.live_count() >= count, timeout=2.0, interval=0.01,
                detail=lambda: f"{service.view.live_count()} live")


def attempts(gw: Gateway) -> dict[tuple[str, str], float]:
    out = {}
    for metric in gw.metrics.placement_attempts.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                out[(sample.labels["route"], sample.labels["outcome"])] = sample.value
    return out


async def test_no_capacity_fails_over_to_the_next_node(gateway: Gateway, bus: Client) -> None:
    # Under "pack" the fuller node ranks first; it loses the race and says so.
    full = ScriptedNode(bus, "full", free_cpu=2000, on_launch=lambda r: "no_capacity")
    roomy = ScriptedNode(bus, "roomy", free_cpu=16000, on_launch=lambda r: "ok")
    for n in (full, roomy):
        await n.start()
    await until_live(gateway, 2)
    resp = await post(gateway, RUN)
    assert resp.status_code == 200, resp.text
    assert "<instanceId>" in resp.text and len(full.launches) == len(roomy.launches) == 1
    assert attempts(gateway) == {("node", "no_capacity"): 1, ("node", "ok"): 1}


@pytest.mark.parametrize("own_lookup", ["answers", "absent", "dropped"])
async def test_timeout_is_reconciled_by_launch_id(gateway: Gateway, bus: Client,
                                                  own_lookup: str) -> None:
    """The node that did not answer is asked alone whether it made the launch; only a
    node that does not answer there (an older one without the subject, or a lookup the
    server dropped) makes it a fan-out to all."""
    slow = ScriptedNode(bus, "slow", free_cpu=2000, on_launch=lambda r: "silent-but-launched",
                        own_lookup=own_lookup)
    other = ScriptedNode(bus, "other", free_cpu=16000, on_launch=lambda r: "ok")
    for n in (slow, other):
        await n.start()
    await until_live(gateway, 2)
    resp = await post(gateway, RUN)
    assert resp.status_code == 200, resp.text
    (launched,) = slow.held.values()
    assert launched.instance_id in resp.text
    assert other.launches == []  # found by lookup, never launched twice
    assert other.fanout_lookups == (0 if own_lookup == "answers" else 1)


async def test_a_node_that_cannot_run_it_is_passed_over(gateway: Gateway,
                                                        bus: Client) -> None:
    # Under "roost" the fuller node ranks first; its driver cannot run the launch.
    lacking = ScriptedNode(bus, "lacking", free_cpu=2000, on_launch=lambda r: "unsupported")
    able = ScriptedNode(bus, "able", free_cpu=16000, on_launch=lambda r: "ok")
    for n in (lacking, able):
        await n.start()
    await until_live(gateway, 2)
    resp = await post(gateway, RUN)
    assert resp.status_code == 200, resp.text
    assert len(able.launches) == 1 and len(lacking.launches) <= 1
    # Alone, it is refused at once, with the node's reason, not retried to the deadline.
    able.on_launch = lambda r: "unsupported"
    started = time.monotonic()
    resp = await post(gateway, RUN)
    assert resp.status_code == 400 and "<Code>Unsupported</Code>" in resp.text, resp.text
    assert "no QEMU here" in resp.text and time.monotonic() - started < 2.0


async def test_a_node_that_says_it_can_launch_nothing_is_not_asked(gateway: Gateway,
                                                                   bus: Client) -> None:
    lacking = ScriptedNode(bus, "lacking", free_cpu=16000, on_launch=lambda r: "ok")
    lacking.cannot_launch = "qemu-system-x86_64 is not installed on this node"
    await lacking.start()
    await until_live(gateway, 1)
    resp = await post(gateway, RUN)
    assert resp.status_code == 400 and "<Code>Unsupported</Code>" in resp.text, resp.text
    assert "node lacking: qemu-system-x86_64 is not installed" in resp.text
    able = ScriptedNode(bus, "able", free_cpu=2000, on_launch=lambda r: "ok")
    await able.start()
    await until_live(gateway, 2)
    resp = await post(gateway, RUN)
    assert resp.status_code == 200, resp.text
    assert lacking.launches == [] and len(able.launches) == 1


async def test_an_anycast_node_that_cannot_run_it_ends_the_anycast(gateway: Gateway,
                                                                   bus: Client) -> None:
    async def refuse(msg: Msg) -> None:
        req = s.decode(msg.data, s.LaunchRequest)
        await msg.respond(s.encode(s.LaunchReply(
            launch_id=req.launch_id, ok=False, node_id="x", error="image_unavailable",
            message="node x: /images/disk.raw is not on this node")))

    await bus.subscribe(subjects.run_instances("t3.micro"), queue=subjects.NODE_QUEUE,
                        cb=refuse)
    await bus.flush()
    started = time.monotonic()
    resp = await post(gateway, RUN)
    assert "<Code>InvalidAMIID.Unavailable</Code>" in resp.text, resp.text
    assert "disk.raw is not on this node" in resp.text
    assert time.monotonic() - started < 2.0  # not the 30 s anycast deadline


async def anycast_only_node(bus: Client, node_id: str) -> list[str]:
    """A node that takes t3.micro launches on the anycast subject and has sent no
    snapshot; returns the launch ids it serves, as they come."""
    served: list[str] = []

    async def serve(msg: Msg) -> None:
        req = s.decode(msg.data, s.LaunchRequest)
        served.append(req.launch_id)
        rec = ScriptedNode(bus, node_id, free_cpu=0, on_launch=lambda r: None).record(req)
        await msg.respond(s.encode(s.LaunchReply(launch_id=req.launch_id, ok=True,
                                                 node_id=node_id, instance=rec)))

    await bus.subscribe(subjects.run_instances("t3.micro"), queue=subjects.NODE_QUEUE,
                        cb=serve)
    await bus.flush()
    return served


async def test_empty_view_falls_back_to_anycast(gateway: Gateway, bus: Client) -> None:
    served = await anycast_only_node(bus, "x")
    resp = await post(gateway, RUN)
    assert resp.status_code == 200 and len(served) == 1
    assert attempts(gateway) == {("anycast", "ok"): 1}


async def test_anycast_asks_again_after_a_refusal_a_little_later_each_time(
        gateway: Gateway, bus: Client) -> None:
    """An anycast node's "no capacity" is asked again, but not at once: a refusal
    repeated at once under load is a retry storm."""
    asked: list[float] = []

    async def full_five_times(msg: Msg) -> None:
        req = s.decode(msg.data, s.LaunchRequest)
        asked.append(time.monotonic())
        rec = ScriptedNode(bus, "x", free_cpu=0, on_launch=lambda r: None).record(req)
        reply = (s.LaunchReply(launch_id=req.launch_id, ok=True, node_id="x", instance=rec)
                 if len(asked) > 5 else s.LaunchReply(launch_id=req.launch_id, ok=False,
                                                      node_id="x", error="no_capacity"))
        await msg.respond(s.encode(reply))

    await bus.subscribe(subjects.run_instances("t3.micro"), queue=subjects.NODE_QUEUE,
                        cb=full_five_times)
    await bus.flush()
    resp = await post(gateway, RUN)
    assert resp.status_code == 200, resp.text
    assert attempts(gateway) == {("anycast", "no_capacity"): 5, ("anycast", "ok"): 1}
    gaps = [b - a for a, b in itertools.pairwise(asked)]
    assert gaps[-1] >= 0.08  # the sixth ask waited at least half of 0.16 s
    assert gaps[-1] > gaps[0]
    assert asked[-1] - asked[0] < 2.0  # still well within the anycast deadline


async def test_no_responders_is_insufficient_capacity_at_once(gateway: Gateway) -> None:
    started = time.monotonic()
    resp = await post(gateway, RUN)
    assert resp.status_code == 500 and "InsufficientInstanceCapacity" in resp.text
    assert time.monotonic() - started < 1.0


async def willing_node(gw: Gateway, bus: Client, free_cpu: int) -> ScriptedNode:
    """One node, n1, that launches whatever it is sent, once the gateway sees it."""
    node = ScriptedNode(bus, "n1", free_cpu=free_cpu, on_launch=lambda r: "ok")
    await node.start()
    await until_live(gw, 1)
    return node


async def set_room(gw: Gateway, node: ScriptedNode, free_cpu: int, seq: int) -> None:
    """The node's room changes and it says so; wait until the gateway's view agrees."""
    node.free_cpu = free_cpu
    await node.publish(seq)
    service = gw.service
    assert service is not None
    micro = service.types.all()["t3.micro"]
    await until(f"the view sees {node.node_id} with {free_cpu} milli free",
                lambda: service.view.says_full(micro) is (free_cpu < micro.cpu_milli),
                timeout=2.0, interval=0.01)


async def test_a_gateway_just_started_asks_the_bus_even_if_its_view_looks_full(
    nats_server: NatsServer, bus: Client
) -> None:
    gw = Gateway(GatewayConfig(nats_urls=[nats_server.url], port=0, auth=False,
                               full_after=60.0))
    await gw.start()
    try:
        await willing_node(gw, bus, free_cpu=0)  # heard from, and full
        resp = await post(gw, RUN)
        assert resp.status_code == 500 and "InsufficientInstanceCapacity" in resp.text
        assert attempts(gw) == {("anycast", "no_responders"): 1}

        # A node with room whose first snapshot has not arrived yet: anycast finds it.
        served = await anycast_only_node(bus, "unheard")
        resp = await post(gw, RUN)
        assert resp.status_code == 200 and len(served) == 1, resp.text
    finally:
        await gw.stop()


async def test_every_instance_of_a_refused_request_joins_the_learned_workload(
    nats_server: NatsServer, bus: Client
) -> None:
    """More than the launches run at once (32), refused by the bus, not the view: the
    ones never started count too, as they do when the view answers."""
    gw = Gateway(GatewayConfig(nats_urls=[nats_server.url], port=0, auth=False,
                               full_after=60.0))
    await gw.start()
    try:
        await willing_node(gw, bus, free_cpu=0)
        resp = await post(gw, RUN.replace("MaxCount=1", "MaxCount=40"))
        assert resp.status_code == 500 and "InsufficientInstanceCapacity" in resp.text
        assert gw.service is not None and len(gw.service.launcher.window) == 40
    finally:
        await gw.stop()


async def test_a_view_where_every_node_is_full_answers_without_asking(
    gateway: Gateway, bus: Client
) -> None:
    node = await willing_node(gateway, bus, free_cpu=0)
    resp = await post(gateway, RUN.replace("MaxCount=1", "MaxCount=3"))
    assert resp.status_code == 500 and "InsufficientInstanceCapacity" in resp.text
    assert node.launches == [] and attempts(gateway) == {("view", "full"): 1}
    assert gateway.service is not None and len(gateway.service.launcher.window) == 3

    await set_room(gateway, node, 4000, seq=2)  # its room comes back, and it says so
    resp = await post(gateway, RUN)
    assert resp.status_code == 200, resp.text
    assert len(node.launches) == 1


async def test_a_used_token_is_replayed_even_once_the_cluster_is_full(
    gateway: Gateway, bus: Client
) -> None:
    node = await willing_node(gateway, bus, free_cpu=2000)
    first = await post(gateway, RUN + "&ClientToken=tok-1")
    assert first.status_code == 200, first.text
    await set_room(gateway, node, 0, seq=2)
    again = await post(gateway, RUN + "&ClientToken=tok-1")
    assert again.status_code == 200, again.text
    rid = first.text.split("<reservationId>")[1].split("<")[0]
    assert f"<reservationId>{rid}</reservationId>" in again.text
    other = await post(gateway, RUN + "&ClientToken=tok-2")
    assert other.status_code == 500 and "InsufficientInstanceCapacity" in other.text
    assert len(node.launches) == 1


async def test_the_policys_gpu_device_choice_travels_with_the_launch(
    gateway: Gateway, bus: Client
) -> None:
    node = ScriptedNode(bus, "g1", free_cpu=16000, on_launch=lambda r: "ok",
                        gpu_free=(1000, 750, 1000, 500))
    await node.start()
    await until_live(gateway, 1)
    assert gateway.service is not None
    quarter = gateway.service.types.all()["gs1.quarter"]
    [best, *_] = placements(gateway.service.view.nodes(), quarter, policy=DEFAULT_POLICY)
    resp = await post(gateway, RUN.replace("t3.micro", "gs1.quarter"))
    assert resp.status_code == 200, resp.text
    [req] = node.launches
    assert req.gpu_devices == [i for i, _ in best.gpus] and len(req.gpu_devices) == 1


@pytest.mark.parametrize(("declared", "lands_on"), [
    (None, ("g1", [0])),  # only the request itself is known: a quarter, anywhere
    ('[workload]\n"g5.xlarge" = 10\n"gs1.quarter" = 1\n', ("g2", [1])),  # keep GPUs whole
])
async def test_a_declared_workload_steers_the_gpu_placement(
    nats_server: NatsServer, bus: Client, declared: str | None, lands_on: tuple[str, list[int]]
) -> None:
    workload = None if declared is None else parse_workload_toml(declared, BUILTIN)
    gw = Gateway(GatewayConfig(nats_urls=[nats_server.url], port=0, auth=False,
                               workload=workload, full_after=0.0))
    await gw.start()
    try:
        nodes = {n: ScriptedNode(bus, n, free_cpu=16000, on_launch=lambda r: "ok",
                                 gpu_free=gpus)
                 for n, gpus in (("g1", (1000, 1000)), ("g2", (1000, 750)))}
        for n in nodes.values():
            await n.start()
        await until_live(gw, 2)
        resp = await post(gw, RUN.replace("t3.micro", "gs1.quarter"))
        assert resp.status_code == 200, resp.text
        node_id, devices = lands_on
        [req] = nodes[node_id].launches
        assert req.gpu_devices == devices
    finally:
        await gw.stop()


async def test_client_token_of_a_dead_gateway_is_taken_over(
    gateway: Gateway, bus: Client,
) -> None:
    """A pending claim nobody renews for a lease: the repeat keeps its reservation id
    and finds, by lookup, the instance the dead gateway had launched."""
    node = ScriptedNode(bus, "n1", free_cpu=16000, on_launch=lambda r: "ok")
    await node.start()
    await until_live(gateway, 1)
    assert gateway.service is not None
    gateway.service.tokens._lease = 0.2
    # Forge what a gateway that died mid-launch leaves: a pending claim, a launch done.
    same = RunInstancesRequest("ami-00000000000000001", "t3.micro", 1, 1)
    kv = await key_value(bus, subjects.CLIENT_TOKENS_BUCKET)
    pending = TokenEntry(state="pending", fingerprint=fingerprint(same.fingerprint()),
                         reservation_id="r-dead", owner_id="000000000000",
                         claimant="dead-gateway", started_at=time.time() + 3600)
    await kv.put(token_key("000000000000", "orphan"), msgspec.json.encode(pending))
    dead_launch = s.LaunchRequest(launch_id="r-dead-0", instance_type="t3.micro",
                                  image_id="ami-00000000000000001", reservation_id="r-dead")
    node.held["r-dead-0"] = node.record(dead_launch)

    resp = await post(gateway, RUN + "&ClientToken=orphan")
    assert resp.status_code == 200, resp.text
    assert "<reservationId>r-dead</reservationId>" in resp.text
    assert node.held["r-dead-0"].instance_id in resp.text
    assert node.launches == []  # found by lookup, nothing launched again


async def test_concurrent_repeats_of_one_token_launch_once(gateway: Gateway, bus: Client
                                                           ) -> None:
    node = ScriptedNode(bus, "n1", free_cpu=16000, on_launch=lambda r: "ok")
    await node.start()
    await until_live(gateway, 1)
    replies = await asyncio.gather(*(post(gateway, RUN + "&ClientToken=same")
                                     for _ in range(5)))
    assert {r.status_code for r in replies} == {200}
    ids: set[Any] = {r.text.split("<instanceId>")[1].split("<")[0] for r in replies}
    assert len(ids) == 1 and len(node.launches) == 1


async def test_a_node_with_room_that_does_not_answer_is_not_a_capacity_answer(
        gateway: Gateway, bus: Client) -> None:
    """The view says n1 has room, but nothing listens on its subjects (NATS restarted
    and the node has not re-subscribed yet, or it just died): a retryable 503, never a
    false InsufficientInstanceCapacity."""
    ghost = ScriptedNode(bus, "ghost", free_cpu=16000, on_launch=lambda r: "ok")
    await ghost.publish(1)  # a snapshot, and no subscriptions
    await until_live(gateway, 1)
    resp = await post(gateway, RUN)
    assert resp.status_code == 503 and "ServiceUnavailable" in resp.text, resp.text
    assert "ghost" in resp.text and "not a capacity answer" in resp.text
