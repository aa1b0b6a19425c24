"""Reading a KV watch's current contents through, whatever nats-py's end-of-contents
mark says.

nats-py's watcher puts its mark (None) after the entry it saw with nothing pending,
or at once when its first read of the consumer's info found nothing pending and no
message received yet. That read races the messages the server has already sent: on a
loaded host the info comes first, the mark goes ahead of every entry, and a reader
that stops at the mark holds nothing (seen as a mirror synced empty, and as `roost node
forget` marking "0 instances" of a node that held 30).

So on the mark the consumer is asked which stream sequence it had delivered, and the
contents are in once an entry at or past that sequence has come, or an entry the
consumer sent with nothing pending after it (its ``delta``, the consumer's pending
count, is 0: the rule nats-py's own mark follows, minus the race). Every caller that
needs "the current contents" goes through `Contents`: the gateway's mirrors
(`follow_bucket`), `roost node forget`, a node's read of its orders and the account
commands' listings (`AccountStore._all`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import nats.errors
from nats.js.kv import KeyValue

Entry = KeyValue.Entry


class WatchEnded(nats.errors.Error):
    """The watch was stopped (its subscription closed) before its contents were in."""


async def delivered_seq(watcher: KeyValue.KeyWatcher) -> int | None:
    """The stream sequence the watch's consumer has delivered last; 0 when it has
    delivered nothing and has nothing pending (its start position need not be an entry
    this watch will ever see: a filter); None when it has delivered nothing yet but
    has entries pending (nats-py made it anew after a reset, from where it was: the
    entries to come say when they are all in)."""
    sub = watcher._sub  # nats-py keeps the watch's subscription private
    if sub is None:
        return 0
    info = await sub.consumer_info()
    sent = info.delivered
    if sent is not None and sent.consumer_seq:
        return int(sent.stream_seq or 0)
    return None if info.num_pending else 0


class Contents:
    """Whether a watch has handed on the contents its consumer had sent by its mark.

    Feed it every item the watch yields, the mark and delete markers included
    (`see`); it asks ``delivered`` once, at the first mark."""

    def __init__(self, delivered: Callable[[], Awaitable[int | None]]) -> None:
        self._delivered = delivered
        self._asked = False
        self.target: int | None = None
        """The stream sequence to reach; None until the mark (or when the consumer
        could not say: `delivered_seq`)."""
        self.reached = 0
        """The highest stream sequence seen so far."""
        self.drained = False
        """An entry came with nothing pending after it."""

    async def see(self, item: Entry | None) -> bool:
        """Take one item of the watch; whether the contents are all in now."""
        if item is None:
            if not self._asked:
                self._asked = True
                self.target = await self._delivered()
        else:
            self.reached = max(self.reached, item.revision or 0)
            self.drained = self.drained or item.delta == 0
        return self.drained or (self.target is not None and self.reached >= self.target)


async def read_contents(watcher: KeyValue.KeyWatcher, take: Callable[[Entry], None], *,
                        timeout: float) -> None:
    """Hand ``take`` every entry of the watch's current contents, delete and purge
    markers included (a watch made with ``ignore_deletes`` could withhold the very entry
    the read waits for). TimeoutError when they are not all in within ``timeout``
    seconds, `WatchEnded` when the watch ends first (both are failures of the bus,
    `roost.bus.failures.BUS_DOWN`)."""
    await read_items(watcher, take, Contents(lambda: delivered_seq(watcher)),
                     timeout=timeout)


async def read_items(items: AsyncIterator[Entry | None], take: Callable[[Entry], None],
                     contents: Contents, *, timeout: float) -> None:
    """`read_contents` over any source of watch items (a unit test's list)."""
    async with asyncio.timeout(timeout):
        async for item in items:
            if item is not None:
                take(item)
            if await contents.see(item):
                return
    raise WatchEnded("the watch ended before the bucket's contents were read")


async def live_entries(kv: KeyValue, keys: str = ">", *, timeout: float) -> dict[str, bytes]:
    """Every live entry of ``kv`` whose key matches ``keys`` (a subject pattern), key to
    value, read to the end of the bucket's contents (`read_contents`). The read goes on
    past nats-py's mark, so a key can come again (a newer value, or its delete or purge
    marker): the last word on each key stands. For a listing: nats-py's ``keys()``
    stops at its own mark."""
    found: dict[str, bytes] = {}

    def take(entry: Entry) -> None:
        found.pop(entry.key, None)
        if entry.operation is None:  # not a delete or purge marker
            found[entry.key] = entry.value or b""

    watcher = await kv.watch(keys)
    try:
        await read_contents(watcher, take, timeout=timeout)
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]
    return found
