"""The order in which a node frees room, advertises it and announces a state, checked on
real NATS, including two moves of one instance that overlap."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from nats.aio.client import Client

from roost.bus import schemas as s
from roost.bus import subjects
from roost.bus.connect import key_value
from roost.embedded import NatsServer
from roost.node.drivers import Exit
from tests.nodes import client, command, launch, running_nodes, wait_state


async def running_instance(nc: Client, itype: str) -> str:
    reply = await launch(nc, itype)
    assert reply and reply.ok and reply.instance
    await wait_state(nc, "n1", reply.instance.instance_id, "running")
    return reply.instance.instance_id


async def test_a_stopped_instance_is_announced_only_after_its_room_is_offered(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with running_nodes([nats_server.url], ["2vcpu,8GiB"], tmp_path) as [_node], \
            client(nats_server.url) as nc:
        iid = await running_instance(nc, "m7i.large")
        assert await launch(nc, "m7i.large") is None  # full: nobody subscribed
        kv = await key_value(nc, subjects.INSTANCES_BUCKET)
        watcher = await kv.watch(iid)
        await command(nc, "n1", "stop", iid)
        async for entry in watcher:
            if entry is None or entry.value is None:
                continue
            if s.decode(entry.value, s.InstanceRecord).state == "stopped":
                # The moment the state is visible, the room is already on offer.
                again = await launch(nc, "m7i.large", timeout=2)
                assert again is not None and again.ok
                break
        await watcher.stop()


async def test_an_overtaken_move_never_overwrites_the_newer_state(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process exits on its own (-> stopped, which re-advertises the room) while a
    terminate arrives: the bucket must end at terminated, not at the slower stop."""
    async with running_nodes([nats_server.url], ["4vcpu,16GiB"], tmp_path) as [node], \
            client(nats_server.url) as nc:
        iid = await running_instance(nc, "m7i.large")
        assert node._subs is not None
        sync = node._subs.sync

        async def slow_sync(wanted: object) -> tuple[set[str], set[str]]:
            await asyncio.sleep(0.3)
            return await sync(wanted)  # type: ignore[arg-type]

        monkeypatch.setattr(node._subs, "sync", slow_sync)
        exited = asyncio.create_task(node._on_exit(iid, Exit(0)))
        await asyncio.sleep(0.05)  # the exit's move is inside its slow re-advertising
        term = await command(nc, "n1", "terminate", iid)
        assert term.ok and term.previous_state == "stopped"
        await exited
        await wait_state(nc, "n1", iid, "terminated")
        kv = await key_value(nc, subjects.INSTANCES_BUCKET)
        for _ in range(20):  # let any late write land
            entry = await kv.get(iid)
            assert entry.value is not None
            assert s.decode(entry.value, s.InstanceRecord).state == "terminated"
            await asyncio.sleep(0.05)
