"""The tick: every ``interval`` seconds, refresh the polled parts of the source, record a
sample and the events, and wake every server-sent-event stream."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from roost.dashboard.history import History
from roost.dashboard.sources import ClusterSource

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 5.0


class Recorder:
    def __init__(self, source: ClusterSource, history: History, *,
                 interval: float = DEFAULT_INTERVAL) -> None:
        self.source = source
        self.history = history
        self.interval = interval
        self.seq = 0
        self._tick = asyncio.Condition()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def tick(self) -> None:
        try:
            await self.source.refresh()
            self.history.record(self.source.state())
        except Exception:
            log.exception("dashboard tick failed")
        self.seq += 1
        async with self._tick:
            self._tick.notify_all()

    async def _run(self) -> None:
        while not self._stop.is_set():
            await self.tick()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval)

    def start(self) -> None:
        self._stop.clear()
        self._task = asyncio.create_task(self._run(), name="dashboard-recorder")

    async def stop(self) -> None:
        self._stop.set()
        async with self._tick:
            self._tick.notify_all()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    async def wait_tick(self, after: int, timeout: float) -> int:
        """Until a tick later than ``after`` (or stop, or ``timeout``); the current seq."""
        async with self._tick:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._tick.wait_for(lambda: self.seq > after or self._stop.is_set()),
                    timeout)
        return self.seq
