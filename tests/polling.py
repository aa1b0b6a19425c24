"""Waiting in tests for what a mirror, a background task or another process does soon
after: ``until`` in a coroutine, ``wait_until`` in plain code (a thread, a subprocess,
a cluster run on its own loop)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def _late(what: str, timeout: float, detail: Callable[[], object] | None) -> AssertionError:
    """The failure: what never came, and what was seen instead (``detail``, read now)."""
    return AssertionError(f"not within {timeout} s: {what}"
                          + (f"; {detail()}" if detail is not None else ""))


async def until(what: str, check: Callable[[], object], timeout: float = 10.0,
                interval: float = 0.02, detail: Callable[[], object] | None = None) -> None:
    """Poll ``check`` (a function, or a coroutine function) until it is true
    (milliseconds here; seconds on a loaded machine); fail naming ``what`` after
    ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        got = check()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return
        if loop.time() > deadline:
            raise _late(what, timeout, detail)
        await asyncio.sleep(interval)


def wait_until(what: str, check: Callable[[], T | None], timeout: float = 10.0,
               interval: float = 0.05, detail: Callable[[], object] | None = None) -> T:
    """``until`` for code that is not a coroutine: poll ``check`` every ``interval``
    seconds until it returns something true, and return that; fail naming ``what``
    (and ``detail()``, what was seen, if given) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (got := check()):
        if time.monotonic() > deadline:
            raise _late(what, timeout, detail)
        time.sleep(interval)
    return got
