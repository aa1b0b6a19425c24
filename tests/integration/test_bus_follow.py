"""`follow_bucket` against a real JetStream: a mirror that outlives its bucket being
deleted and created again, and picks up the new bucket's first entries at once; and
`last_values`, the batched read of one prefix that makes no consumer."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from nats.js.kv import KeyValue

from roost.bus.connect import NoDirectGet, connect, follow_bucket, key_value, last_values
from roost.embedded import NatsServer


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
    """nats-py's end-of-contents mark overtakes the entries when the consumer's info
    (nothing pending) reaches the client before the messages the server already sent,
    as on a loaded CI host. The race is made here: the mark first, the entries 0.3 s
    later. A mirror synced at the mark would hold nothing."""
    nc = await connect([nats_server.url], name="follow-test")
    kv = await key_value(nc, "early_mark")
    for i in range(5):
        await kv.put(f"k{i}", b"x")
    watch = kv.watch
    late: list[asyncio.Task[None]] = []

    async def mark_first(*args: Any, **kwargs: Any) -> KeyValue.KeyWatcher:
        watcher = await watch(*args, **kwargs)
        updates: asyncio.Queue[KeyValue.Entry | None] = watcher._updates
        held: list[KeyValue.Entry | None] = []
        while len(held) < 6:  # the five entries and nats-py's own mark, as they come
            held.append(await asyncio.wait_for(updates.get(), 5))
        updates.put_nowait(None)  # the mark first, the entries still on their way

        async def arrive() -> None:
            await asyncio.sleep(0.3)
            for item in held:
                updates.put_nowait(item)

        late.append(asyncio.create_task(arrive()))
        return watcher

    kv.watch = mark_first  # type: ignore[method-assign]
    seen: list[str] = []
    synced = asyncio.Event()
    follower = asyncio.create_task(follow_bucket(
        kv, "test", on_entry=lambda entry: seen.append(entry.key), synced=synced))
    try:
        await asyncio.wait_for(synced.wait(), 5)
        assert seen == [f"k{i}" for i in range(5)]
    finally:
        follower.cancel()
        await asyncio.gather(follower, *late, return_exceptions=True)
        await nc.close()
