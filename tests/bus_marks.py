"""Making nats-py's early end-of-contents mark happen on purpose, for the tests of the
reads that must not stop at it (`roost.bus.contents`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from nats.js.kv import KeyValue


class MarkFirst:
    """Watches made to put nats-py's end-of-contents mark before ``count`` items that
    have already come (the entries and nats-py's own mark), which follow 0.3 s later:
    the race a loaded CI host showed, made here on purpose."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.late: list[asyncio.Task[None]] = []

    def on(self, kv: KeyValue) -> MarkFirst:
        """On every watch of this handle of a bucket."""
        watch = kv.watch

        async def early(*args: Any, **kwargs: Any) -> KeyValue.KeyWatcher:
            return await self._shuffle(await watch(*args, **kwargs))

        kv.watch = early  # type: ignore[method-assign]
        return self

    def on_bucket(self, monkeypatch: pytest.MonkeyPatch, bucket: str) -> MarkFirst:
        """On every watch of ``bucket`` in this process, whoever opened it."""
        watch = KeyValue.watch

        async def early(kv: KeyValue, *args: Any, **kwargs: Any) -> KeyValue.KeyWatcher:
            watcher = await watch(kv, *args, **kwargs)
            return await self._shuffle(watcher) if kv._name == bucket else watcher

        monkeypatch.setattr(KeyValue, "watch", early)
        return self

    async def _shuffle(self, watcher: KeyValue.KeyWatcher) -> KeyValue.KeyWatcher:
        updates: asyncio.Queue[KeyValue.Entry | None] = watcher._updates
        held: list[KeyValue.Entry | None] = []
        while len(held) < self.count:
            held.append(await asyncio.wait_for(updates.get(), 5))
        updates.put_nowait(None)  # the mark first, the entries still on their way

        async def arrive() -> None:
            await asyncio.sleep(0.3)
            for item in held:
                updates.put_nowait(item)

        self.late.append(asyncio.create_task(arrive()))
        return watcher
