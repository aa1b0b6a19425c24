"""Time for the controller, injectable so loop tests run on a fake clock.

``time()`` is wall-clock seconds (plans, heartbeats and deadlines are compared with
timestamps in Postgres); ``monotonic()`` paces retries; ``sleep()`` can be cut short by
a wake-up event, so shutdown never waits out an interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float: ...

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float, *, wake: asyncio.Event | None = None) -> None: ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float, *, wake: asyncio.Event | None = None) -> None:
        if wake is None:
            await asyncio.sleep(seconds)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout=seconds)


class FakeClock:
    """A clock that moves only when told to: `advance()`, or a `sleep()` (which returns
    at once, having moved time forward)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start
        self._mono = 0.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self._mono += seconds

    async def sleep(self, seconds: float, *, wake: asyncio.Event | None = None) -> None:
        self.advance(seconds)
        await asyncio.sleep(0)
