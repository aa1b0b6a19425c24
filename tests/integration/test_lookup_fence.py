"""A launch looked up and not found is not made afterwards from an attempt sent before
the lookup: "not found" is what the gateway places elsewhere on, so a node that made it
later (the attempt still queued behind a stall) would run it twice."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import pytest

from roost.embedded import NatsServer
from roost.gateway.nodes import NodeClient, NodeTimeout
from roost.node.agent import NodeAgent, NodeConfig
from tests.nodes import host, launch_request


@pytest.mark.parametrize("lookup", ["own subject", "fan-out"])
async def test_an_attempt_queued_behind_a_stall_is_refused_after_its_lookup(
        nats_server: NatsServer, tmp_path: Path, lookup: str) -> None:
    agent = NodeAgent(NodeConfig(
        node_id="n1", nats_urls=[nats_server.url], data_dir=tmp_path / "n1",
        host=host("8vcpu,32GiB"), driver="sim", heartbeat_seconds=1.0,
        stop_grace_seconds=2.0, max_inflight=1))  # one launch at a time: the next queues
    await agent.start()
    nc = await nats.connect(nats_server.url)
    try:
        gate = asyncio.Event()
        publish = agent._publish

        async def slow_publish(iid: str) -> None:  # the first launch's record put stalls
            if agent._records[iid].launch_id == "L-1":
                await gate.wait()
            await publish(iid)

        agent._publish = slow_publish  # type: ignore[method-assign]
        client = NodeClient(nc, timeout=0.5)
        first = asyncio.create_task(
            client.launch("n1", launch_request("t3.micro", launch_id="L-1"), timeout=10))
        await asyncio.sleep(0.2)
        with pytest.raises(NodeTimeout):  # queued behind L-1: the gateway gives up on it
            await client.launch("n1", launch_request("t3.micro", launch_id="L-2"))
        if lookup == "own subject":
            assert await client.lookup_on("n1", "L-2") is None
        else:
            assert await client.lookup("L-2", timeout=0.5) is None
        gate.set()
        assert (await first).ok
        for _ in range(20):  # the queued attempt runs now, and must make nothing
            await asyncio.sleep(0.05)
        assert agent.lookup("L-2") is None
        # The asker places it anew, here too if this node is where it fits: allowed.
        again = await client.launch("n1", launch_request("t3.micro", launch_id="L-2"))
        assert again.ok and again.instance is not None
        assert agent.lookup("L-2") is not None
    finally:
        await nc.close()
        await agent.stop()
