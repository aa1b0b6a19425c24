"""Reading a KV watch's contents through, wherever nats-py's end-of-contents mark
falls (`roost.bus.contents`); against a real JetStream in
tests/integration/test_bus_follow.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from nats.js.kv import KeyValue

from roost.bus.contents import Contents, WatchEnded, read_items
from roost.bus.failures import BUS_DOWN


def entry(key: str, seq: int, op: str | None = None, delta: int | None = None
          ) -> KeyValue.Entry:
    return KeyValue.Entry(bucket="b", key=key, value=b"v", revision=seq, delta=delta,
                          created=None, operation=op)


class Consumer:
    """What the consumer says it delivered by the mark, and how often it was asked."""

    def __init__(self, seq: int | None) -> None:
        self.seq, self.asked = seq, 0

    async def delivered(self) -> int | None:
        self.asked += 1
        return self.seq


async def items(*some: KeyValue.Entry | None, then_stall: bool = True
                ) -> AsyncIterator[KeyValue.Entry | None]:
    for item in some:
        yield item
    if then_stall:
        await asyncio.sleep(3600)


@pytest.mark.parametrize("mark_at", [0, 1, 3])
async def test_the_read_goes_on_to_the_delivered_entry_wherever_the_mark_comes(
        mark_at: int) -> None:
    """nats-py can put its mark before the entries the consumer had already sent: the
    read goes on to the entry at the sequence the consumer delivered, and no further."""
    some: list[KeyValue.Entry | None] = [entry(f"k{i}", seq)
                                         for i, seq in enumerate((4, 7, 9))]
    some.insert(mark_at, None)
    some.append(entry("later", 12))  # a put after the mark: not part of the contents
    consumer = Consumer(9)
    seen: list[str] = []
    await read_items(items(*some), lambda e: seen.append(e.key), Contents(consumer.delivered),
                     timeout=5)
    assert seen == ["k0", "k1", "k2"]
    assert consumer.asked == 1


async def test_a_delete_marker_counts_towards_the_contents() -> None:
    """The last entry sent can be a delete: it is handed on (the caller drops it) and
    ends the read, where a read that skipped deletes would wait for ever."""
    seen: list[tuple[str, str | None]] = []
    await read_items(items(None, entry("k0", 3), entry("k1", 5, "DEL")),
                     lambda e: seen.append((e.key, e.operation)), Contents(Consumer(5).delivered),
                     timeout=5)
    assert seen == [("k0", None), ("k1", "DEL")]


async def test_a_consumer_that_sent_nothing_is_read_at_its_mark() -> None:
    seen: list[str] = []
    await read_items(items(None), lambda e: seen.append(e.key), Contents(Consumer(0).delivered),
                     timeout=5)
    assert seen == []


async def test_a_read_whose_entries_never_come_fails_within_its_timeout() -> None:
    with pytest.raises(TimeoutError):
        await read_items(items(None, entry("k0", 4)), lambda e: None,
                         Contents(Consumer(9).delivered), timeout=0.2)
    with pytest.raises(TimeoutError):  # no mark at all
        await read_items(items(entry("k0", 4)), lambda e: None,
                         Contents(Consumer(4).delivered), timeout=0.2)


async def test_a_watch_that_ends_first_is_a_failure_of_the_bus() -> None:
    with pytest.raises(WatchEnded) as failed:
        await read_items(items(None, entry("k0", 4), then_stall=False), lambda e: None,
                         Contents(Consumer(9).delivered), timeout=5)
    assert isinstance(failed.value, BUS_DOWN)


async def test_later_marks_ask_nothing_more() -> None:
    """The mark comes once in nats-py; should another come, the first answer stands."""
    contents = Contents(Consumer(7).delivered)
    assert not await contents.see(None)
    assert not await contents.see(entry("k0", 5))
    assert not await contents.see(None)
    assert await contents.see(entry("k1", 7))
    assert contents.target == 7


async def test_an_entry_with_nothing_pending_after_it_ends_the_read() -> None:
    """A consumer made anew after a reset has delivered nothing at the mark but has
    entries pending (`delivered_seq` says None): the read waits for the entry sent with
    nothing pending after it, not for a sequence."""
    seen: list[str] = []
    contents = Contents(Consumer(None).delivered)
    await read_items(items(None, entry("k0", 4, delta=1), entry("k1", 9, delta=0),
                           entry("later", 12, delta=0)),
                     lambda e: seen.append(e.key), contents, timeout=5)
    assert seen == ["k0", "k1"] and contents.target is None
    # the same entry ends it before the mark too (the mark may come after it)
    assert await Contents(Consumer(99).delivered).see(entry("k0", 4, delta=0))
