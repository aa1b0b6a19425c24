"""A gateway's start waits for its mirrors while bucket entries keep coming, and gives
up only after a stretch in which none came (`roost.bus.connect.until_synced`)."""

from __future__ import annotations

import asyncio

import pytest

from roost.bus import connect


async def _trickle(seconds: float, every: float) -> None:
    """Entries arriving, as a mirror catching up with a big bucket takes them in."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        connect._PROGRESS.delivered += 1
        await asyncio.sleep(every)


async def test_a_long_sync_that_makes_progress_is_waited_for() -> None:
    done = asyncio.Event()

    async def mirrors() -> None:
        await _trickle(0.6, 0.02)  # far longer than the stall bound
        done.set()

    await connect.until_synced(mirrors(), stall=0.2, what="test")
    assert done.is_set()


async def test_a_sync_with_nothing_coming_fails_after_the_stall() -> None:
    never = asyncio.Event()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError, match=r"no bucket entry came for 0\.2 s"):
        await connect.until_synced(never.wait(), stall=0.2, what="test")
    assert loop.time() - started < 2.0


async def test_a_failed_sync_raises_its_own_error() -> None:
    async def broken() -> None:
        raise ConnectionError("bus gone")

    with pytest.raises(ConnectionError, match="bus gone"):
        await connect.until_synced(broken(), stall=5.0, what="test")
