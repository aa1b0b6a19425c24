"""Reading and writing cgroupfs files, each failure turned into a `CgroupError` naming
the path, so a refusal in the logs says exactly which knob the kernel rejected."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path

from roost.node.cgroups._types import CgroupError


def write(path: Path, value: str) -> None:
    """Write without O_CREAT: cgroupfs files are made by the kernel, so a missing file
    means a missing controller and must fail loudly rather than create a dead file.
    (O_TRUNC is what `echo >` does; cgroupfs ignores it, a tmp-tree fake needs it.)"""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)
    except OSError as e:
        raise CgroupError(e.errno, f"cannot write {value!r} to {path}: {e.strerror}") from e


def read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as e:
        raise CgroupError(e.errno, f"cannot read {path}: {e.strerror}") from e


def read_int(path: Path) -> int:
    text = read(path).strip()
    try:
        return int(text)
    except ValueError as e:
        raise CgroupError(errno.EINVAL, f"{path} holds {text!r}, not an integer") from e


def read_key(path: Path, key: str, *, default: int | None = None) -> int:
    """One value from a flat-keyed file (`memory.events`, `cpu.stat`, `oom_control`)."""
    for line in read(path).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            return int(parts[1])
    if default is not None:
        return default
    raise CgroupError(errno.ENOENT, f"{path} has no {key!r} line")


def read_pids(path: Path) -> set[int]:
    """The pids in one `cgroup.procs`; a group that is gone holds none."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return set()
    except OSError as e:
        raise CgroupError(e.errno, f"cannot read {path}: {e.strerror}") from e
    return {int(line) for line in text.split()}


def mkdir(path: Path) -> bool:
    """Make one group directory; True when this call made it (so a failed create can
    undo only what it did)."""
    try:
        path.mkdir()
    except FileExistsError:
        return False
    except OSError as e:
        raise CgroupError(e.errno, f"cannot create cgroup {path}: {e.strerror}") from e
    return True


def rmdir(path: Path) -> None:
    """Remove one group directory; a missing one is already removed."""
    try:
        path.rmdir()
    except FileNotFoundError:
        return
    except OSError as e:
        if e.errno in (errno.EBUSY, errno.ENOTEMPTY):
            raise CgroupError(e.errno, f"cannot remove cgroup {path}: still in use") from e
        raise CgroupError(e.errno, f"cannot remove cgroup {path}: {e.strerror}") from e


def signal(pid: int, sig: int) -> bool:
    """Signal one pid; False when it has already gone, which is no error for a group kill."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    except OSError as e:
        raise CgroupError(e.errno, f"cannot send signal {sig} to pid {pid}: {e.strerror}") from e
    return True


def wait_until(done: Callable[[], bool], *, timeout: float, step: float = 0.01) -> bool:
    """Poll a kernel state that changes asynchronously (freezing, emptying); bounded,
    because a task stuck in uninterruptible sleep must not hang the agent."""
    deadline = time.monotonic() + timeout
    while True:
        if done():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(step)
