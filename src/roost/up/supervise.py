"""Keeping `roost up`'s components alive: notice one that died, reap it, restart it with
a bounded backoff, and say so.

A component that can die on its own (a server process, the controller's task) offers
``exited()``: None while it runs, else how it ended. Checking reaps a dead child, so no
zombie lingers. A restart is ``stop()`` then ``start()``; Postgres clears the lock files
its dead postmaster left (`PostgresServer.clear_stale_locks`). Failed restarts back off
1, 2, 4 ... up to ``max_delay`` seconds; a component that has stayed up for
``healthy_after`` seconds starts again from the shortest delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

log = logging.getLogger(__name__)


@runtime_checkable
class Restartable(Protocol):
    name: str

    def exited(self) -> str | None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass
class _Record:
    attempts: int = 0
    up_since: float = 0.0


class Supervisor:
    def __init__(
        self,
        components: Sequence[object],
        *,
        say: Callable[[str], None],
        check_every: float = 0.5,
        first_delay: float = 1.0,
        max_delay: float = 30.0,
        healthy_after: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.components = [c for c in components if isinstance(c, Restartable)]
        self.say = say
        self.check_every = check_every
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.healthy_after = healthy_after
        self.clock = clock
        self.restarts: dict[str, int] = {}
        self._records = {c.name: _Record(up_since=clock()) for c in self.components}

    def delay(self, attempts: int) -> float:
        return float(min(self.max_delay, self.first_delay * 2 ** max(0, attempts - 1)))

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop``: a restart under way finishes first (its start is bounded)."""
        while not stop.is_set():
            for c in self.components:
                if stop.is_set():
                    return
                why = c.exited()
                if why is not None:
                    await self._restart(c, why, stop)
            await _sleep(self.check_every, stop)

    async def _restart(self, c: Restartable, why: str, stop: asyncio.Event) -> None:
        rec = self._records[c.name]
        if self.clock() - rec.up_since >= self.healthy_after:
            rec.attempts = 0
        rec.attempts += 1
        wait = self.delay(rec.attempts)
        self.say(f"roost up: {c.name} {why}; restarting it in {wait:g}s "
                 f"(attempt {rec.attempts})")
        if await _sleep(wait, stop):
            return
        try:
            with contextlib.suppress(Exception):
                await c.stop()  # whatever is left of it: files, tasks, a pid to reap
            await c.start()
        except Exception as exc:
            log.warning("restarting %s failed", c.name, exc_info=True)
            self.say(f"roost up: restarting {c.name} failed: {exc}; will retry")
            return
        rec.up_since = self.clock()
        self.restarts[c.name] = self.restarts.get(c.name, 0) + 1
        self.say(f"roost up: {c.name} is back")


async def _sleep(seconds: float, stop: asyncio.Event) -> bool:
    """Sleep, or return True as soon as ``stop`` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()
