"""A node whose orders bucket answers no direct gets (made before roost asked for them)
reads its orders through a watch, to the end of their contents however early nats-py
puts its end-of-contents mark, and carries them out; `roost node forget` reads the
records bucket the same way."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import nats
import pytest
from nats.js.errors import KeyNotFoundError

from roost.bus import schemas as s
from roost.bus import subjects
from roost.bus.connect import key_value
from roost.embedded import NatsServer
from roost.node.forget import _records_of
from tests.bus_marks import MarkFirst
from tests.nodes import running_nodes
from tests.polling import until


async def test_a_node_reads_its_orders_through_a_watch_when_direct_gets_are_refused(
        nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    nc = await nats.connect(nats_server.url)
    early = MarkFirst(4).on_bucket(monkeypatch, subjects.NODE_ORDERS_BUCKET)
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
        with caplog.at_level(logging.INFO, logger="roost.node"):
            async with running_nodes([nats_server.url], ["4vcpu,16GiB"], tmp_path):
                async def carried_out() -> bool:
                    return all([await gone(key) for key in mine])

                # the start-up read; seconds on a loaded host
                await until("n1 carries out its orders", carried_out, timeout=10, interval=0.05)
                assert not await gone(subjects.node_order("n2", "i-other"))
        assert early.late, "the node's read never went through the early mark"
        # the delete marker was taken as a delete, not as an order to decode
        assert "unreadable order" not in caplog.text
    finally:
        await asyncio.gather(*early.late, return_exceptions=True)
        await nc.close()


async def test_forget_reads_every_record_of_the_node_past_an_early_mark(
        nats_server: NatsServer) -> None:
    """Once seen as "0 instances marked terminated" for a node that held 30."""
    nc = await nats.connect(nats_server.url)
    try:
        records = await key_value(nc, subjects.INSTANCES_BUCKET)
        for iid, node in (("i-a", "n1"), ("i-b", "n1"), ("i-c", "n2"), ("i-d", "n1")):
            await records.put(iid, s.encode(s.InstanceRecord(
                instance_id=iid, node_id=node, instance_type="t3.nano", image_id="ami-0",
                state="running", launch_id=f"l-{iid}", reservation_id="r-1",
                launch_time="2026-12-05T00:00:00.000Z", availability_zone="roost-1a",
                updated_at="2026-12-05T00:00:00.000Z")))
        await records.delete("i-d")  # the bucket's newest entry: a delete marker
        early = MarkFirst(5).on(records)  # four keys and nats-py's own mark
        try:
            found = await _records_of(records, "n1")
        finally:
            await asyncio.gather(*early.late, return_exceptions=True)
        assert sorted(r.instance_id for r in found) == ["i-a", "i-b"]
    finally:
        await nc.close()
