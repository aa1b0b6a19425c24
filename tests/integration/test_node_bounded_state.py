"""A node's state stays bounded: terminated instances are forgotten after the retention
(record, KV entry, local row and directory), and no more messages are handled at once
than the node allows."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats.js.errors
import pytest

from roost.bus import subjects
from roost.bus.connect import key_value
from roost.embedded import NatsServer
from roost.node.agent import NodeAgent, NodeConfig
from tests.nodes import client, command, host, launch, wait_state
from tests.polling import until


async def test_terminated_instances_are_forgotten_after_the_retention(
        nats_server: NatsServer, tmp_path: Path) -> None:
    cfg = NodeConfig(node_id="b1", nats_urls=[nats_server.url], data_dir=tmp_path / "b1",
                     host=host("4vcpu,8GiB"), driver="process", heartbeat_seconds=0.1,
                     stop_grace_seconds=1.0, terminated_retention_seconds=1.0)
    agent = NodeAgent(cfg)
    await agent.start()
    try:
        async with client(nats_server.url) as nc:
            kv = await key_value(nc, subjects.INSTANCES_BUCKET)
            gone = await launch(nc, "t3.micro", node_id="b1", user_data="echo bye")
            kept = await launch(nc, "t3.micro", node_id="b1")
            assert gone and gone.instance and kept and kept.instance
            gid, kid = gone.instance.instance_id, kept.instance.instance_id
            await wait_state(nc, "b1", kid, "running")
            await command(nc, "b1", "terminate", gid)
            await wait_state(nc, "b1", gid, "terminated")
            assert (tmp_path / "b1" / "instances" / gid).is_dir()
            # retention 1 s, checked every 0.25 s; the record goes first, its directory
            # after it, off the loop
            await until("the terminated instance's record and directory expire",
                        lambda: gid not in agent._records
                        and not (tmp_path / "b1" / "instances" / gid).exists(),
                        timeout=6, interval=0.1)
            assert agent.state.get(gid) is None
            with pytest.raises(nats.js.errors.KeyNotFoundError):
                await kv.get(gid)
            missing = await command(nc, "b1", "describe", gid)
            assert missing.error == "InvalidInstanceID.NotFound"
            # a running instance is never expired, however old
            kept_now = (await command(nc, "b1", "describe", kid)).instance
            assert kept_now.state == "running", kept_now
            await command(nc, "b1", "terminate", kid)
            await wait_state(nc, "b1", kid, "terminated")
    finally:
        await agent.stop()


async def test_messages_in_flight_are_bounded(nats_server: NatsServer, tmp_path: Path) -> None:
    cfg = NodeConfig(node_id="b2", nats_urls=[nats_server.url], data_dir=tmp_path / "b2",
                     host=host("64vcpu,256GiB"), driver="sim", max_inflight=4)
    agent = NodeAgent(cfg)
    running = seen = 0
    original = agent._launch

    async def slow_launch(req):  # type: ignore[no-untyped-def]
        nonlocal running, seen
        running += 1
        seen = max(seen, running)
        try:
            await asyncio.sleep(0.05)
            return await original(req)
        finally:
            running -= 1

    agent._launch = slow_launch  # type: ignore[method-assign]
    await agent.start()
    try:
        async with client(nats_server.url) as nc:
            replies = await asyncio.gather(*(launch(nc, "t3.nano", node_id="b2", timeout=10)
                                             for _ in range(24)))
        assert all(r and r.ok for r in replies)
        assert seen == 4  # four at once, never more
    finally:
        await agent.stop()


async def test_a_failed_kv_put_is_published_again_and_the_launch_stands(
        nats_server: NatsServer, tmp_path: Path) -> None:
    """SQLite is the node's truth; the bucket is an outbox it catches up with. A launch
    made while the bucket refuses writes still answers ok, keeps running, and its record
    lands in the bucket once writes work again."""
    cfg = NodeConfig(node_id="b3", nats_urls=[nats_server.url], data_dir=tmp_path / "b3",
                     host=host("4vcpu,8GiB"), driver="sim", heartbeat_seconds=0.1)
    agent = NodeAgent(cfg)
    await agent.start()
    try:
        async with client(nats_server.url) as nc:
            js = nc.jetstream()
            await js.delete_key_value(subjects.INSTANCES_BUCKET)  # every put now fails
            reply = await launch(nc, "t3.micro", node_id="b3")
            assert reply and reply.ok and reply.instance
            iid = reply.instance.instance_id
            await wait_state(nc, "b3", iid, "running")
            assert iid in agent._unpublished and set(agent.ledger.allocations) == {iid}

            kv = await key_value(nc, subjects.INSTANCES_BUCKET)  # writes work again
            await until("the held record is published", lambda: not agent._unpublished,
                        timeout=5, interval=0.1, detail=lambda: f"held {agent._unpublished}")
            entry = await kv.get(iid)
            assert b'"state":"running"' in (entry.value or b"")
    finally:
        await agent.stop()


async def test_node_state_is_private(nats_server: NatsServer, tmp_path: Path) -> None:
    cfg = NodeConfig(node_id="b4", nats_urls=[nats_server.url], data_dir=tmp_path / "b4",
                     host=host("4vcpu,8GiB"), driver="process")
    agent = NodeAgent(cfg)
    await agent.start()
    try:
        async with client(nats_server.url) as nc:
            reply = await launch(nc, "t3.micro", node_id="b4", user_data="exec sleep 60")
            assert reply and reply.instance
            iid = reply.instance.instance_id
            await wait_state(nc, "b4", iid, "running")
            data = tmp_path / "b4"
            assert data.stat().st_mode & 0o777 == 0o700
            assert (data / "node.sqlite3").stat().st_mode & 0o777 == 0o600
            assert (data / "imds-secret").stat().st_mode & 0o777 == 0o600
            assert (data / "instances" / iid).stat().st_mode & 0o777 == 0o700
            await command(nc, "b4", "terminate", iid)
            await wait_state(nc, "b4", iid, "terminated")
    finally:
        await agent.stop()
