"""A node whose orders bucket answers no direct gets (made before roost asked for them)
reads its orders through a watch, to the end of their contents, and carries them out."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
from nats.js.errors import KeyNotFoundError

from roost.bus import schemas as s
from roost.bus import subjects
from roost.bus.connect import key_value
from roost.embedded import NatsServer
from tests.nodes import running_nodes


async def test_a_node_reads_its_orders_through_a_watch_when_direct_gets_are_refused(
        nats_server: NatsServer, tmp_path: Path) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        orders = await key_value(nc, subjects.NODE_ORDERS_BUCKET)  # no direct gets
        order = s.encode(s.NodeOrder(reason="Server.InternalError", note="forgotten"))
        await orders.put(subjects.node_order("n1", "i-gone"), order)
        await orders.put(subjects.node_order("n1", subjects.FORGOTTEN), b"{}")
        await orders.put(subjects.node_order("n2", "i-other"), order)  # not n1's
        await orders.put(subjects.node_order("n1", "i-done"), order)
        await orders.delete(subjects.node_order("n1", "i-done"))  # n1's newest entry

        async def gone(key: str) -> bool:
            try:
                await orders.get(key)
            except KeyNotFoundError:
                return True
            return False

        mine = [subjects.node_order("n1", "i-gone"), subjects.node_order("n1", subjects.FORGOTTEN)]
        async with running_nodes([nats_server.url], ["4vcpu,16GiB"], tmp_path):
            for _ in range(200):  # the start-up read; seconds on a loaded host
                if all([await gone(key) for key in mine]):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("n1 did not carry out its orders within 10 s")
            assert not await gone(subjects.node_order("n2", "i-other"))
    finally:
        await nc.close()
