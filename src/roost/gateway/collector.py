"""Short full collections for a gateway that mirrors 100,000 instances.

CPython's cyclic collector walks every object it tracks on a full (generation 2)
collection, and a gateway's mirrors hold several per instance. Filling to 100,000
instances, one gateway process made 44 full collections that paused it 34 s in all,
about 0.8 s each at the end (`roost bench scale`, `roost_gateway_gc_seconds`).

After each full collection, what survived it is frozen (`gc.freeze`): later full
collections walk only what was made since. Frozen objects are still freed when nothing
refers to them; only garbage in reference cycles among them waits, until the freeze
is lifted every `THAW_EVERY` seconds and the next full collection walks everything
again. So cyclic garbage is held at most that long, and the long pause comes at most
once per that period instead of at every full collection.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from typing import Any

THAW_EVERY = 600.0
"""Seconds between lifting the freeze, so cyclic garbage among frozen objects is
collected: one walk of everything per period."""
LOOK_EVERY = 1.0
"""Seconds between looks for a full collection to freeze after."""


class Collector:
    """Freezes after full collections, thaws every `THAW_EVERY` s (`run`, a task of the
    gateway's event loop). The collector is the process's: in a process with several
    gateways (tests), each one's task does the same to it."""

    def __init__(self, *, thaw_every: float = THAW_EVERY, look_every: float = LOOK_EVERY,
                 each_look: Callable[[], None] | None = None) -> None:
        self.thaw_every = thaw_every
        self.look_every = look_every
        self.each_look = each_look
        """Called at every look (the gateway files its metrics' pause notes there)."""
        self.freezes = 0
        self.thaws = 0
        self._full = False

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # Noted only: freezing from inside a collection's callback is not ours to do.
        if phase == "stop" and info.get("generation") == 2:
            self._full = True

    async def run(self) -> None:
        gc.callbacks.append(self._on_gc)
        thawed = time.monotonic()
        try:
            while True:
                await asyncio.sleep(self.look_every)
                if self.each_look is not None:
                    self.each_look()
                if time.monotonic() - thawed >= self.thaw_every:
                    gc.unfreeze()
                    self.thaws += 1
                    thawed = time.monotonic()
                    self._full = False  # the next full collection walks everything
                elif self._full:
                    self._full = False
                    gc.freeze()
                    self.freezes += 1
        finally:
            gc.callbacks.remove(self._on_gc)
            gc.unfreeze()
