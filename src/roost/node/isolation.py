"""How a node holds an instance to what its ledger granted.

Three levels, chosen with ``roost node --isolation``:

- ``cgroup`` (the default where the host allows it): one cgroup per instance, sized from
  its type (memory with swap off, a CPU quota, a pids limit). The instance's program is
  inside it before any of its code runs, and stop/terminate act on the whole group, so
  nothing it forked survives.
- ``sandbox``: ``cgroup`` plus bubblewrap: its own pid namespace, a private ``/tmp``, the
  host's root read-only, and the node's data directory hidden except the instance's own.
- ``none``: a plain child process in its own session. Nothing enforces the type's size.

A node that was asked for more than the host allows starts anyway at the level it can
reach, and says so: in its log, in its capacity snapshot and so in ``roost status``. It
never pretends.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from roost.domain.catalog import InstanceType
from roost.node.cgroups import (
    CgroupError,
    Cgroups,
    InstanceCgroup,
    Limits,
    detect,
)
from roost.node.drivers import DriverError

log = logging.getLogger(__name__)

Level = Literal["none", "cgroup", "sandbox"]
LEVELS: tuple[Level, ...] = ("none", "cgroup", "sandbox")
DEFAULT_PIDS_MAX = 4096


def limits_for(itype: InstanceType) -> Limits:
    return Limits(cpu_milli=itype.cpu_milli, mem_mib=itype.mem_mib,
                  pids_max=itype.pids_max or DEFAULT_PIDS_MAX)


@dataclass(frozen=True)
class Isolation:
    level: Level
    note: str
    """Why the level is lower than asked ("" when it is what was asked)."""
    cgroups: Cgroups | None = None
    bwrap: str | None = None
    data_dir: Path | None = None

    def group(self, instance_id: str, itype: InstanceType, *,
              limits: Limits | None = None) -> InstanceCgroup | None:
        """The instance's cgroup, made (or re-sized) now, sized from its type unless
        ``limits`` says otherwise; None at level none."""
        if self.cgroups is None:
            return None
        try:
            return self.cgroups.create(instance_id, limits or limits_for(itype))
        except CgroupError as exc:
            raise DriverError(f"cannot make a cgroup for {instance_id}: {exc}") from None

    def open(self, instance_id: str) -> InstanceCgroup | None:
        return None if self.cgroups is None else self.cgroups.open(instance_id)

    def command(self, argv: Sequence[str], *, group: InstanceCgroup | None,
                workdir: Path) -> list[str]:
        """``argv`` as the node runs it: in the sandbox, then joined to the group first,
        so even the sandbox's own process is accounted to the instance."""
        out = list(argv)
        if self.bwrap is not None:
            out = self._sandbox(out, workdir)
        if group is not None:
            out = group.join_command(out)
        return out

    def _sandbox(self, argv: list[str], workdir: Path) -> list[str]:
        assert self.bwrap is not None
        hide = ["--tmpfs", str(self.data_dir)] if self.data_dir is not None else []
        return [
            self.bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--tmpfs", "/tmp", *_keep_under_tmp(), *hide, "--bind", str(workdir), str(workdir),
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--chdir", str(workdir),
            "--", *argv,
        ]


def _keep_under_tmp() -> list[str]:
    """The private /tmp would hide a Python that lives under /tmp (a virtualenv in a
    checkout there), which the python image runs user data with: bind it back, read-only."""
    keep: set[str] = set()
    for path in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))):
        if Path(path).is_relative_to("/tmp"):
            keep.add(path)
    return [arg for path in sorted(keep) for arg in ("--ro-bind", path, path)]


def _bwrap_works(bwrap: str) -> str:
    """"" if bubblewrap can make a pid namespace here, else why not."""
    try:
        done = subprocess.run(
            [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
             "--unshare-pid", "--", "true"],
            capture_output=True, timeout=10, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return "" if done.returncode == 0 else done.stderr.decode(errors="replace").strip()


def make_isolation(requested: Level, *, node_id: str, data_dir: Path) -> Isolation:
    """The best level up to ``requested`` that this host allows, with a note on any
    shortfall. Logs the outcome once."""
    if requested == "none":
        return Isolation("none", "")
    try:
        groups = detect(node_id)
    except CgroupError as exc:
        note = f"cgroups unavailable ({exc}); instances run without enforced limits"
        log.warning("node %s: isolation none: %s", node_id, note)
        return Isolation("none", note)
    if requested == "cgroup":
        log.info("node %s: isolation cgroup (%s)", node_id, groups.root)
        return Isolation("cgroup", "", groups)
    bwrap = shutil.which("bwrap")
    why = ("bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
           if bwrap is None else _bwrap_works(bwrap))
    if bwrap is None or why:
        note = f"sandbox unavailable: {why}; cgroup limits only"
        log.warning("node %s: isolation cgroup: %s", node_id, note)
        return Isolation("cgroup", note, groups)
    log.info("node %s: isolation sandbox (bubblewrap %s; %s)", node_id, bwrap, groups.root)
    return Isolation("sandbox", "", groups, bwrap, data_dir)
