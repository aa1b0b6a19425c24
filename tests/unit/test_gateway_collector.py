"""The gateway's collector policy: freeze after a full collection, thaw on schedule, and
leave the process's collector as it found it when stopped."""

from __future__ import annotations

import asyncio
import gc

from roost.gateway.collector import Collector
from tests.polling import until


async def _drive() -> None:
    looks: list[float] = []
    c = Collector(thaw_every=1.0, look_every=0.05, each_look=lambda: looks.append(1.0))
    task = asyncio.create_task(c.run())
    try:
        await until("the hook runs at every look", lambda: len(looks) >= 2)
        assert c.freezes == 0  # no full collection to freeze after yet
        gc.collect()
        await until("a freeze after the full collection", lambda: c.freezes == 1)
        assert gc.get_freeze_count() > 0
        await asyncio.sleep(0.2)
        assert c.freezes == 1  # once per full collection, not per look
        await until("a thaw on schedule", lambda: c.thaws >= 1)
        assert gc.get_freeze_count() == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert gc.get_freeze_count() == 0
    assert c._on_gc not in gc.callbacks


def test_freezes_after_a_full_collection_and_thaws_on_schedule() -> None:
    asyncio.run(_drive())
