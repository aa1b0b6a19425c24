"""`follow_bucket` against a real JetStream: a mirror that outlives its bucket being
deleted and created again, and picks up the new bucket's first entries at once; and
`last_values`, the batched read of one prefix that makes no consumer; and reads of a
watch's contents past nats-py's early end-of-contents mark."""

from __future__ import annotations

import asyncio
import time

import pytest
from nats.js.kv import KeyValue

from roost.bus.connect import NoDirectGet, connect, follow_bucket, key_value, last_values
from roost.bus.contents import read_contents
from roost.embedded import NatsServer
from tests.bus_marks import MarkFirst


async def test_a_bucket_deleted_and_created_again_is_followed_at_once(
        nats_server: NatsServer) -> None:
    nc = await connect([nats_server.url], name="follow-test")
    seen: dict[str, bytes] = {}
    synced = asyncio.Event()

    def on_entry(entry: KeyValue.Entry) -> None:
        seen[entry.key] = entry.value or b""

    kv = await key_value(nc, "follow_test")
    for i in range(5):  # the old stream's sequence runs ahead of the new one's
        await kv.put(f"old{i}", b"x")
    follower = asyncio.create_task(follow_bucket(kv, "test", on_entry=on_entry,
                                                 synced=synced))
    try:
        await asyncio.wait_for(synced.wait(), 5)
        assert set(seen) == {f"old{i}" for i in range(5)}
        await nc.jetstream().delete_key_value("follow_test")
        await asyncio.sleep(0.5)
        again = await key_value(nc, "follow_test")
        started = time.monotonic()
        await again.put("new0", b"y")  # sequence 1 of the new stream
        while "new0" not in seen:
            # nats-py's own recovery took 10-20 s and then skipped sequences the old
            # stream had used; a 5 s bound fails without the re-watch on the advisory.
            assert time.monotonic() - started < 5, "the new bucket's entry never arrived"
            await asyncio.sleep(0.05)
        print(f"\nnew bucket's first entry mirrored {time.monotonic() - started:.2f} s "
              "after it was put")
        assert seen["new0"] == b"y"
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        await nc.close()


async def test_last_values_reads_one_prefix_without_a_consumer(
        nats_server: NatsServer) -> None:
    nc = await connect([nats_server.url], name="last-values-test")
    try:
        kv = await key_value(nc, "orders_test", direct=True)
        await kv.put("node-1.i-a", b"1")
        await kv.put("node-1.i-b", b"2")
        await kv.put("node-10.i-c", b"other node")
        await kv.put("node-1.i-a", b"1 again")
        await kv.delete("node-1.i-b")
        found = await last_values(nc, "orders_test", "node-1.>", timeout=5)
        assert found == {"node-1.i-a": b"1 again"}
        assert await last_values(nc, "orders_test", "node-2.>", timeout=5) == {}
        info = await nc.jetstream().stream_info("KV_orders_test")
        assert info.state.consumer_count == 0

        plain = await key_value(nc, "orders_plain")  # made without direct gets
        await plain.put("node-1.i-a", b"1")
        with pytest.raises(NoDirectGet):
            await last_values(nc, "orders_plain", "node-1.>", timeout=5)
    finally:
        await nc.close()


async def test_a_mirror_is_synced_only_once_the_delivered_entries_are_in(
        nats_server: NatsServer) -> None:
    """A mirror synced at an early mark would hold nothing."""
    nc = await connect([nats_server.url], name="follow-test")
    kv = await key_value(nc, "early_mark")
    for i in range(5):
        await kv.put(f"k{i}", b"x")
    early = MarkFirst(6).on(kv)  # the five entries and nats-py's own mark
    seen: list[str] = []
    synced = asyncio.Event()
    follower = asyncio.create_task(follow_bucket(
        kv, "test", on_entry=lambda entry: seen.append(entry.key), synced=synced))
    try:
        await asyncio.wait_for(synced.wait(), 5)
        assert seen == [f"k{i}" for i in range(5)]
    finally:
        follower.cancel()
        await asyncio.gather(follower, *early.late, return_exceptions=True)
        await nc.close()


async def test_a_read_of_one_prefix_takes_its_whole_contents_past_an_early_mark(
        nats_server: NatsServer) -> None:
    """`read_contents` on a filtered watch (a node's orders): every entry of the prefix,
    the newest a delete (a read that skipped deletes would wait for it for ever), and
    nothing of another prefix."""
    nc = await connect([nats_server.url], name="contents-test")
    kv = await key_value(nc, "early_prefix")
    await kv.put("node-1.i-a", b"a")
    await kv.put("node-1.i-b", b"b")
    await kv.put("node-2.i-c", b"other node")
    await kv.delete("node-1.i-b")  # the prefix's newest entry
    await kv.put("node-2.i-d", b"other node, later")
    early = MarkFirst(3).on(kv)  # i-a, i-b's delete marker, nats-py's own mark
    seen: list[tuple[str, str | None]] = []
    watcher = await kv.watch("node-1.>")
    try:
        await read_contents(watcher, lambda e: seen.append((e.key, e.operation)),
                            timeout=5)
        assert seen == [("node-1.i-a", None), ("node-1.i-b", "DEL")]
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]
        await asyncio.gather(*early.late, return_exceptions=True)
        await nc.close()
