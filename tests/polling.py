"""Waiting in tests for what a mirror or a background task does soon after."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(what: str, check: Callable[[], object], timeout: float = 10.0) -> None:
    """Poll ``check`` until it is true (milliseconds here; seconds on a loaded
    machine); fail naming ``what`` after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.02)
