"""Capacity-gated routing over a real nats-server: a launch reaches only nodes with room."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from roost.domain.catalog import BUILTIN
from roost.domain.resources import Resources
from roost.embedded import NatsServer
from tests.nodes import client, command, launch, running_nodes, wait_state


def fitting(free: Resources) -> set[str]:
    return {t.name for t in BUILTIN.values()
            if not t.gpu_total_milli and free.covers(t.resources)}


async def test_subscribes_only_to_types_that_fit(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_nodes([nats_server.url], ["4vcpu,16GiB"], tmp_path) as [node], \
            client(nats_server.url) as nc:
        assert node._subs is not None
        assert node._subs.types == fitting(Resources(4000, 16384))
        assert "m7i.xlarge" in node._subs.types and "m7i.2xlarge" not in node._subs.types

        reply = await launch(nc, "m7i.large")  # 2 vCPU, 8 GiB
        assert reply is not None and reply.ok and reply.instance is not None
        after = fitting(Resources(2000, 8192))
        assert node._subs.types == after
        dropped = fitting(Resources(4000, 16384)) - after
        assert "m7i.xlarge" in dropped
        # The server has seen the UNSUB: a dropped type has no responders at all.
        assert await launch(nc, "m7i.xlarge") is None

        term = await command(nc, "n1", "terminate", reply.instance.instance_id)
        assert term.ok
        await wait_state(nc, "n1", reply.instance.instance_id, "terminated")
        assert node._subs.types == fitting(Resources(4000, 16384))
        again = await launch(nc, "m7i.xlarge")
        assert again is not None and again.ok


async def test_type_no_node_fits_gets_no_responders_not_a_timeout(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with running_nodes([nats_server.url], ["4vcpu,16GiB"] * 2, tmp_path), \
            client(nats_server.url) as nc:
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await launch(nc, "m7i.24xlarge", timeout=10) is None
        # No-responders comes back from the server at once; a timeout would take 10 s.
        assert loop.time() - started < 5


async def test_full_node_never_gets_requests_for_that_type(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    specs = ["2vcpu,8GiB", "8vcpu,32GiB", "8vcpu,32GiB"]
    async with running_nodes([nats_server.url], specs, tmp_path) as nodes, \
            client(nats_server.url) as nc:
        first = await launch(nc, "t3.large", node_id="n1")  # 2 vCPU, 8 GiB: n1 is now full
        assert first is not None and first.ok
        assert nodes[0]._subs is not None and "t3.medium" not in nodes[0]._subs.types
        # One at a time, so each request sees the subscriptions the last one left:
        # the 8 slots of n2 and n3 all fill, and n1 is never asked.
        replies = [await launch(nc, "t3.medium") for _ in range(8)]
        assert all(r is not None and r.ok for r in replies)
        assert {r.node_id for r in replies if r} == {"n2", "n3"}
        assert await launch(nc, "t3.medium") is None


async def test_last_slot_race_gives_one_allocation_and_explicit_refusals(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with running_nodes([nats_server.url], ["2vcpu,8GiB"], tmp_path) as [node], \
            client(nats_server.url) as nc:
        replies = await asyncio.gather(*(launch(nc, "m7i.large", node_id="n1")
                                         for _ in range(50)))
        ok = [r for r in replies if r is not None and r.ok]
        refused = [r for r in replies if r is not None and not r.ok]
        assert len(ok) == 1
        assert len(refused) == 49 and {r.error for r in refused} == {"no_capacity"}
        assert node.ledger.free.resources == Resources(0, 0)


async def test_fifty_concurrent_anycast_requests_never_overcommit(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    specs = ["4vcpu,16GiB", "6vcpu,24GiB"]  # room for 2 + 3 m7i.large
    async with running_nodes([nats_server.url], specs, tmp_path) as nodes, \
            client(nats_server.url) as nc:
        replies = await asyncio.gather(*(launch(nc, "m7i.large", timeout=10)
                                         for _ in range(50)))
        ok = [r for r in replies if r is not None and r.ok]
        # Every request got an answer: success, an explicit refusal, or no responders.
        explicit = [r for r in replies if r is not None and not r.ok]
        assert all(r.error == "no_capacity" for r in explicit)
        assert len(ok) == 5
        for node in nodes:
            assert not node.ledger.free.resources.is_negative()
            assert node.ledger.free.resources == Resources(0, 0)
        assert await launch(nc, "m7i.large") is None


async def test_drained_node_gets_no_launches(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_nodes([nats_server.url], ["8vcpu,32GiB"] * 2, tmp_path) as nodes, \
            client(nats_server.url) as nc:
        await nodes[0].drain()
        replies = await asyncio.gather(*(launch(nc, "t3.micro") for _ in range(4)))
        assert all(r is not None and r.ok and r.node_id == "n2" for r in replies)
        targeted = await launch(nc, "t3.micro", node_id="n1")
        assert targeted is not None and targeted.error == "no_capacity"
        await nodes[1].drain()
        assert await launch(nc, "t3.micro") is None


async def test_duplicate_launch_id_launches_once(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_nodes([nats_server.url], ["8vcpu,32GiB"], tmp_path) as [node], \
            client(nats_server.url) as nc:
        replies = await asyncio.gather(*(launch(nc, "m7i.large", node_id="n1", launch_id="L1")
                                         for _ in range(5)))
        ids = {r.instance.instance_id for r in replies if r and r.instance}
        assert len(ids) == 1
        assert len(node.ledger.allocations) == 1


@pytest.mark.cluster
async def test_routing_over_three_server_cluster(nats_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    node_url, client_url = nats_cluster.urls[0], nats_cluster.urls[2]
    # n2 fits all ten t3.medium of the burst below, so it never unsubscribes during it:
    # a node filling up mid-burst can lose a request forwarded across its UNSUB (see
    # until_no_responders), and a timeout here must be n1's alone.
    async with running_nodes([[node_url], [node_url]], ["2vcpu,8GiB", "32vcpu,128GiB"],
                             tmp_path) as nodes, client(client_url) as nc:
        # Interest crosses the routes asynchronously: wait until the far server sees it.
        # One launch id for every probe, so at most one probe instance exists; it is
        # terminated before the scenario starts.
        deadline = asyncio.get_running_loop().time() + 10
        while (probe := await launch(nc, "t3.nano", launch_id="probe")) is None:
            assert asyncio.get_running_loop().time() < deadline, "interest never propagated"
            await asyncio.sleep(0.1)
        assert probe.ok and probe.instance
        await command(nc, probe.node_id, "terminate", probe.instance.instance_id)
        await wait_state(nc, probe.node_id, probe.instance.instance_id, "terminated")
        full = await launch(nc, "t3.large", node_id="n1")
        assert full is not None and full.ok
        replies = await asyncio.gather(*(launch(nc, "t3.medium") for _ in range(10)))
        # n1 is full: were a request still to reach it, it must answer explicitly. n2
        # has room for all ten, so none may time out.
        assert all(r is not None for r in replies)
        assert all(r.node_id == "n2" for r in replies if r and r.ok)
        assert all(r.error == "no_capacity" for r in replies if r and not r.ok)
        assert nodes[0].ledger.free.resources == Resources(0, 0)
        # A type nobody can fit: no responders from the far server too.
        assert await launch(nc, "m7i.24xlarge") is None


async def until_no_responders(nc, instance_type: str, timeout: float = 10.0) -> int:  # type: ignore[no-untyped-def]
    """Send launches one at a time until nobody subscribes to ``instance_type``; returns
    how many succeeded on the way.

    Across routes, SUB/UNSUB reach the far servers a moment later. In that window a
    node must answer explicitly; a request that a route forwarded just after the node's
    server processed its UNSUB is lost (NATS is at-most-once), which the requester sees
    as a timeout and never as a capacity answer. The gateway reconciles those by
    launch id.
    """
    deadline = asyncio.get_running_loop().time() + timeout
    made = 0
    while True:
        assert asyncio.get_running_loop().time() < deadline, "interest never settled"
        try:
            reply = await launch(nc, instance_type, timeout=3)
        except TimeoutError:
            continue
        if reply is None:
            return made
        assert reply.ok or reply.error == "no_capacity"
        made += reply.ok


@pytest.mark.cluster
async def test_race_and_drain_over_three_server_cluster(nats_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    urls = nats_cluster.urls
    async with running_nodes([[urls[0]], [urls[1]]], ["2vcpu,8GiB", "2vcpu,8GiB"],
                             tmp_path) as nodes, client(urls[2]) as nc:
        # Wait until the far server routes node-targeted requests to both nodes.
        for n in ("n1", "n2"):
            deadline = asyncio.get_running_loop().time() + 10
            while await launch(nc, "zz.none", node_id=n) is None:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.05)
        # 50 concurrent requests for 2 slots, on nodes behind other servers. A request
        # a route forwards just after a full node's UNSUB reached its server is lost
        # (see until_no_responders): the requester times out and never gets an answer.
        answers = await asyncio.gather(*(launch(nc, "m7i.large", timeout=10)
                                         for _ in range(50)), return_exceptions=True)
        lost = [a for a in answers if isinstance(a, BaseException)]
        assert all(isinstance(a, TimeoutError) for a in lost), lost
        replies = [a for a in answers if not isinstance(a, BaseException)]
        burst = sum(1 for r in replies if r is not None and r.ok)
        assert all(r.error == "no_capacity" for r in replies if r is not None and not r.ok)
        assert burst >= 1
        after = await until_no_responders(nc, "m7i.large")
        # Exactly the two slots, never more; a lost request allocated nothing.
        assert burst + after == 2, (burst, after, len(lost))
        for n in nodes:
            assert n.ledger.free.resources == Resources(0, 0)
            for iid in list(n.ledger.allocations):
                await command(nc, n.node_id, "terminate", iid)
                await wait_state(nc, n.node_id, iid, "terminated")
        await nodes[0].drain()
        await nodes[1].drain()
        assert await until_no_responders(nc, "t3.micro") == 0  # drained nodes take nothing
        refused = await launch(nc, "t3.micro", node_id="n1")
        assert refused is not None and refused.error == "no_capacity"
        assert all(not n.ledger.allocations for n in nodes)
