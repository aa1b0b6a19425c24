"""A launch answers before its node re-syncs its launch subscriptions, and the instance
turns running only after: checked on real NATS with the re-sync held at a gate."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path

import pytest
from nats.aio.client import Client

from roost.embedded import NatsServer
from roost.node.agent import NodeAgent
from tests.nodes import client, launch, running_nodes, wait_state


@contextlib.asynccontextmanager
async def one_node(server: NatsServer, spec: str, tmp_path: Path
                   ) -> AsyncIterator[tuple[Client, NodeAgent]]:
    """Node ``n1`` of ``spec`` and a client; a beat a minute, so that no heartbeat
    re-syncs in the test's moments."""
    async with running_nodes([server.url], [spec], tmp_path, heartbeat_seconds=60) as [node], \
            client(server.url) as nc:
        yield nc, node


def gate_resyncs(node: NodeAgent, monkeypatch: pytest.MonkeyPatch
                 ) -> tuple[asyncio.Event, list[float]]:
    """Hold every sync of ``node``'s launch subscriptions until the event is set; the
    list gets an entry as each one is asked for."""
    assert node._subs is not None
    sync, gate, calls = node._subs.sync, asyncio.Event(), []

    async def gated(wanted: Callable[[], Iterable[str]]) -> tuple[set[str], set[str]]:
        calls.append(asyncio.get_running_loop().time())
        await gate.wait()
        return await sync(wanted)

    monkeypatch.setattr(node._subs, "sync", gated)
    return gate, calls


async def test_a_launch_that_fills_a_node_answers_before_its_subscriptions_change(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with one_node(nats_server, "2vcpu,8GiB", tmp_path) as (nc, node):
        gate, calls = gate_resyncs(node, monkeypatch)
        first = await launch(nc, "m7i.large", timeout=5)  # 2 vCPU, 8 GiB: the whole node
        assert first is not None and first.ok and first.instance
        iid = first.instance.instance_id
        for _ in range(100):  # the re-sync began, and is held
            if calls:
                break
            await asyncio.sleep(0.05)
        assert calls
        # Still subscribed, so a second launch reaches the node and is refused in words.
        second = await launch(nc, "m7i.large", timeout=5)
        assert second is not None and not second.ok and second.error == "no_capacity"
        await asyncio.sleep(0.3)  # time enough for the sim driver's start
        assert node._records[iid].state == "pending"  # not running while the gate holds
        gate.set()
        await wait_state(nc, "n1", iid, "running")
        assert await launch(nc, "m7i.large", timeout=5) is None  # nobody offers it now


async def test_launches_in_a_burst_share_one_resync(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with one_node(nats_server, "8vcpu,32GiB", tmp_path) as (nc, node):
        gate, calls = gate_resyncs(node, monkeypatch)
        replies = await asyncio.gather(*(launch(nc, "m7i.large", node_id="n1", timeout=5)
                                         for _ in range(4)))  # the node's 8 vCPU
        assert all(r is not None and r.ok for r in replies)
        # The first re-sync is held at the gate; the launches after it began share one
        # more, which reads the fit when it runs: the node full, nothing offered.
        assert 1 <= len(calls) <= 2
        gate.set()
        for r in replies:
            assert r is not None and r.instance
            await wait_state(nc, "n1", r.instance.instance_id, "running")
        assert len(calls) <= 2
        assert node._subs is not None and node._subs.types == frozenset()
        assert await launch(nc, "t3.small", timeout=5) is None
