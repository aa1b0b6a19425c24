"""An instance's console: what its program wrote to stdout and stderr (the process
driver) or its serial port (a VM), kept in ``console.log`` in its directory.

EC2 keeps the last 64 KiB of console output and `GetConsoleOutput` returns it base64
encoded; the node does the same from the file.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Sequence
from pathlib import Path

CONSOLE_TAIL_BYTES = 64 * 1024


def console_tail(path: Path, limit: int = CONSOLE_TAIL_BYTES) -> str:
    """The last ``limit`` bytes of ``path``, base64; "" when there is no console yet."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - limit))
            data = f.read(limit)
    except FileNotFoundError:
        return ""
    return base64.b64encode(data).decode("ascii")


CONSOLE_MAX_BYTES = 1024 * 1024


def trim_console(path: str | Path, *, keep: int = CONSOLE_TAIL_BYTES,
                 limit: int = CONSOLE_MAX_BYTES) -> bool:
    """Cut ``path`` back to its last ``keep`` bytes once it passes ``limit``, so a chatty
    instance cannot fill the node's disk. The instance keeps writing through its own
    O_APPEND descriptor, which lands at the new end; what it writes during the cut
    itself may be lost, which a console can afford. True if it was cut."""
    try:
        if os.stat(path).st_size <= limit:
            return False
        with open(path, "r+b") as f:
            f.seek(-keep, os.SEEK_END)
            tail = f.read()
            f.seek(0)
            f.write(tail)
            f.truncate()
    except FileNotFoundError:
        return False
    return True


def trim_consoles(paths: Sequence[str]) -> list[str]:
    """`trim_console` each of ``paths`` (blocking: run it off the event loop); the ones
    that were cut."""
    return [p for p in paths if trim_console(p)]
