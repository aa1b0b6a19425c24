"""`TypeSubscriptions.sync` on real NATS: a sync queued behind another applies the fit
as it is when it runs, not as it was when it was asked for."""

from __future__ import annotations

import asyncio

from nats.aio.msg import Msg

from roost.bus.subjects import run_instances
from roost.embedded import NatsServer
from roost.node.subscriptions import TypeSubscriptions
from tests.nodes import client


async def test_a_queued_sync_applies_the_fit_as_it_is_when_it_runs(
        nats_server: NatsServer) -> None:
    async with client(nats_server.url) as node, client(nats_server.url) as asker:

        async def answer(msg: Msg) -> None:
            await msg.respond(b"here")

        subs = TypeSubscriptions(node, answer)
        fit = {"t3.small", "m7i.large"}
        await subs.sync(lambda: fit)
        async with subs._lock:  # a sync under way: the next one waits its turn
            queued = asyncio.create_task(subs.sync(lambda: fit))
            await asyncio.sleep(0.05)
            fit = {"t3.small"}  # an allocation meanwhile: m7i.large no longer fits
        added, removed = await queued
        assert (added, removed) == (set(), {"m7i.large"})
        assert subs.types == frozenset({"t3.small"})
        reply = await asker.request(run_instances("t3.small"), b"", timeout=5)
        assert reply.data == b"here"
