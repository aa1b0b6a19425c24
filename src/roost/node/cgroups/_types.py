"""The library's data and errors, kept apart so every other module can share them.

Errors::

    OSError
     └── CgroupError          a cgroup file or directory operation failed (names the path)
          └── CgroupUnavailable   this host's cgroups cannot be used at all (one-line reason)

`CgroupError` subclasses `OSError` so a caller that already handles I/O failures of a
launch handles these too; it always carries the path that failed, for logs and refusals.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

CPU_PERIOD_US = 100_000
"""The CFS period every group uses: 100 ms, the kernel default, so quotas read naturally."""

_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


class CgroupError(OSError):
    """A cgroup operation failed; the message says what and where (the path)."""


class CgroupUnavailable(CgroupError):
    """Cgroups cannot be used on this host; the message is a one-line reason."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What one instance may use. Swap is always off for the group, so `mem_mib` is hard."""

    cpu_milli: int
    mem_mib: int
    pids_max: int

    def __post_init__(self) -> None:
        for name in ("cpu_milli", "mem_mib", "pids_max"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Limits.{name} must be positive, got {getattr(self, name)}")

    @property
    def cpu_quota_us(self) -> int:
        """Microseconds of CPU per `CPU_PERIOD_US`; the kernel refuses quotas under 1 ms,
        so tiny requests are raised to that floor rather than refused."""
        return max(1000, self.cpu_milli * CPU_PERIOD_US // 1000)

    @property
    def mem_bytes(self) -> int:
        return self.mem_mib * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Usage:
    """What a group has used so far, as the kernel accounts it (children included)."""

    cpu_seconds: float
    memory_current_bytes: int
    memory_peak_bytes: int
    oom_kills: int


def check_id(kind: str, value: str) -> str:
    """Node and instance ids become directory names: only letters, digits, '-' and '_'
    pass, so no id can climb out of (or into another) group with '/' or '..'."""
    if not _ID.fullmatch(value):
        raise ValueError(f"invalid {kind} {value!r}: use letters, digits, '-' and '_' only")
    return value


def is_id(value: str) -> bool:
    return _ID.fullmatch(value) is not None


ROOT_ENV = "ROOST_CGROUP_ROOT"


def root_name() -> str:
    """The directory all of roost's groups live under (``roost``), or ``$ROOST_CGROUP_ROOT``:
    two roost installations (or two test runs) on one host keep apart by naming their own."""
    return check_id(ROOT_ENV, os.environ.get(ROOT_ENV, "roost"))
