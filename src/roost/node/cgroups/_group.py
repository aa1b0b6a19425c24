"""What both cgroup versions share: one instance's group, and the node's set of groups.

The version-specific parts (which files hold limits and usage, how to freeze, how a
node root is prepared) are small hooks filled in by `_v1` and `_v2`; everything a
caller sees is written once here.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from roost.node.cgroups import _fs
from roost.node.cgroups._types import CgroupError, Limits, Usage, check_id, is_id

log = logging.getLogger(__name__)

FREEZE_TIMEOUT = 2.0
"""How long to wait for a group to report frozen before signalling anyway: a task in
uninterruptible sleep delays freezing, and a kill must not wait on it forever."""

_UNFROZEN_KILL_ROUNDS = 100
"""Without a freezer, a kill re-reads the group until no new pid appears; bounded so a
fork loop faster than we are cannot keep the agent here."""

JOIN_SHIM = (
    'while [ "$1" != -- ]; do echo $$ > "$1" || '
    '{ echo "roost: cannot join cgroup $1" >&2; exit 125; }; shift; done; shift; exec "$@"'
)
"""Writes the shell's own pid into every procs file, then execs the command: the process
is inside its group before any user code runs, and a failed join exits 125 (the code
`env` and `chroot` use for "the wrapper failed") instead of running unconfined."""


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """One mounted hierarchy as this node uses it.

    `node_dir` is the node root's directory; `node_path` is the same group as
    /proc/<pid>/cgroup names it, which is how `group_of` recognises a member."""

    key: str
    controllers: frozenset[str]
    node_dir: Path
    node_path: str

    @property
    def proc_key(self) -> str:
        """The name to look this hierarchy up by in `parse_proc_cgroup`'s result: one of
        its controllers (co-mounts may list them in either order), or '' for v2."""
        return min(self.controllers) if self.controllers else ""


class InstanceCgroup(ABC):
    """One instance's group, across every hierarchy it needs."""

    version: int

    def __init__(self, name: str, dirs: Mapping[str, Path]) -> None:
        self.name = check_id("instance id", name)
        self.dirs = dict(dirs)

    def __repr__(self) -> str:
        dirs = ",".join(str(d) for d in self.dirs.values())
        return f"<InstanceCgroup v{self.version} {self.name} {dirs}>"

    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs.values()]

    def join_command(self, argv: Sequence[str]) -> list[str]:
        if not argv:
            raise ValueError("join_command needs a command to run")
        files = [str(f) for f in self.procs_files()]
        return ["/bin/sh", "-c", JOIN_SHIM, "roost-join", *files, "--", *argv]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for f in self.procs_files():
            found |= _fs.read_pids(f)
        return found

    def exists(self) -> bool:
        return any(d.is_dir() for d in self.dirs.values())

    @abstractmethod
    def set_limits(self, limits: Limits) -> None: ...

    @abstractmethod
    def populated(self) -> bool: ...

    @abstractmethod
    def usage(self) -> Usage: ...

    @property
    @abstractmethod
    def can_freeze(self) -> bool: ...

    @abstractmethod
    def set_frozen(self, frozen: bool) -> bool:
        """Freeze or thaw every member (needs `can_freeze`); True once the kernel reports
        the new state, False if it did not within `FREEZE_TIMEOUT` (a task in
        uninterruptible sleep can hold a freeze off)."""

    def _fast_kill(self) -> bool:
        """Kill every member at once if the kernel can (v2 `cgroup.kill`)."""
        return False

    def kill_all(self, sig: int) -> int:
        """Freezing first means no member can fork or exit while we list and signal, so
        the list is complete and no pid is reused under us; the signals land on thaw.
        A freezer that cannot be written falls back to re-reading until no new pid
        appears, because a kill must still happen."""
        if sig == signal.SIGKILL:
            members = self.pids()
            if self._fast_kill():
                return len(members - {os.getpid()})
        if not self.can_freeze or not self.exists():
            return self._kill_unfrozen(sig)
        try:
            frozen = self.set_frozen(True)
        except CgroupError as e:
            log.warning("cgroup %s: cannot freeze (%s); signalling unfrozen", self.name, e)
            return self._kill_unfrozen(sig)
        if not frozen:
            log.warning(
                "cgroup %s: not frozen after %.0fs; signalling anyway", self.name, FREEZE_TIMEOUT
            )
        try:
            return sum(_fs.signal(pid, sig) for pid in self.pids() - {os.getpid()})
        finally:
            self.set_frozen(False)

    def _kill_unfrozen(self, sig: int) -> int:
        seen = {os.getpid()}
        signalled = 0
        for _ in range(_UNFROZEN_KILL_ROUNDS):
            fresh = self.pids() - seen
            if not fresh:
                break
            signalled += sum(_fs.signal(pid, sig) for pid in fresh)
            seen |= fresh
        return signalled

    def remove(self) -> None:
        if self.populated():
            where = ", ".join(str(d) for d in self.dirs.values())
            raise CgroupError(
                errno.EBUSY,
                f"cannot remove cgroup {where}: still populated (pids {sorted(self.pids())})",
            )
        for d in self.dirs.values():
            _fs.rmdir(d)


class Cgroups(ABC):
    """The node's handle on the host's cgroups: every group it makes lives under one
    node root per hierarchy, so listing, re-adopting and cleaning up never look
    anywhere else."""

    version: int

    def __init__(
        self,
        node_id: str,
        hierarchies: Sequence[Hierarchy],
        *,
        shared_dirs: Sequence[Path] = (),
        proc: Path = Path("/proc"),
    ) -> None:
        self.node_id = check_id("node id", node_id)
        self.hierarchies = tuple(hierarchies)
        self.shared_dirs = tuple(shared_dirs)
        self.proc = proc

    @staticmethod
    def v2_at(
        mount: Path,
        parent: str | None,
        node_id: str,
        *,
        require_controllers: bool = True,
        mount_root: str = "/",
        proc: Path = Path("/proc"),
    ) -> Cgroups:
        """A v2 handle on an explicit mount, skipping detection. With
        `require_controllers=False` a mount lacking memory/cpu/pids is still used (its
        groups then contain and kill, but limit nothing): for tests on hybrid hosts."""
        from roost.node.cgroups._v2 import v2_at  # _v2 builds on this module

        return v2_at(
            mount,
            parent,
            node_id,
            require_controllers=require_controllers,
            mount_root=mount_root,
            proc=proc,
        )

    @property
    def root(self) -> str:
        where = ",".join(
            f"{h.key}={h.node_dir}" if h.key else str(h.node_dir) for h in self.hierarchies
        )
        return f"v{self.version}:{where}"

    def __repr__(self) -> str:
        return f"<Cgroups {self.root}>"

    @abstractmethod
    def _instance(self, instance_id: str, dirs: Mapping[str, Path]) -> InstanceCgroup: ...

    @abstractmethod
    def _prepare_root(self) -> None:
        """Make the node root directories and set what their children rely on."""

    def _dirs(self, instance_id: str) -> dict[str, Path]:
        check_id("instance id", instance_id)
        return {h.key: h.node_dir / instance_id for h in self.hierarchies}

    def create(self, instance_id: str, limits: Limits) -> InstanceCgroup:
        dirs = self._dirs(instance_id)
        self._prepare_root()
        made: list[Path] = []
        group = self._instance(instance_id, dirs)
        try:
            for d in dirs.values():
                if _fs.mkdir(d):
                    made.append(d)
            group.set_limits(limits)
        except CgroupError as e:
            # Undo only what this call made: a group it reused may hold a running instance.
            for d in reversed(made):
                try:
                    _fs.rmdir(d)
                except CgroupError as cleanup:
                    e.add_note(f"and the cleanup failed: {cleanup}")
            raise
        return group

    def open(self, instance_id: str) -> InstanceCgroup | None:
        group = self._instance(instance_id, self._dirs(instance_id))
        return group if group.exists() else None

    def instance_ids(self) -> list[str]:
        found: set[str] = set()
        for h in self.hierarchies:
            try:
                found |= {p.name for p in h.node_dir.iterdir() if p.is_dir() and is_id(p.name)}
            except FileNotFoundError:
                continue
            except OSError as e:
                raise CgroupError(e.errno, f"cannot list {h.node_dir}: {e.strerror}") from e
        return sorted(found)

    def group_of(self, pid: int) -> str | None:
        path = self.proc / str(pid) / "cgroup"
        try:
            text = path.read_text()
        except (FileNotFoundError, ProcessLookupError):
            return None
        except OSError as e:
            raise CgroupError(e.errno, f"cannot read {path}: {e.strerror}") from e
        memberships = parse_proc_cgroup(text)
        for h in self.hierarchies:
            where = memberships.get(h.proc_key)
            prefix = h.node_path.rstrip("/") + "/"
            if where is not None and where.startswith(prefix):
                first = where[len(prefix) :].split("/", 1)[0]
                if is_id(first):
                    return first
        return None

    def remove_root(self) -> None:
        """Remove the node root (it must hold no groups), then the shared `roost` dirs
        above it when no other node uses them: for tests and node decommissioning."""
        for h in self.hierarchies:
            _fs.rmdir(h.node_dir)
        for d in self.shared_dirs:
            try:
                _fs.rmdir(d)
            except CgroupError as e:
                if e.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                    raise

    def probe(self) -> None:
        """Prove we may make groups here by making and removing the node root (or, when
        it exists, a scratch group inside it), so detection fails early and clearly."""
        made: list[Path] = []
        try:
            for h in self.hierarchies:
                target = h.node_dir
                if target.is_dir():
                    target = target / f"roost-probe-{os.getpid()}"
                made += mkdirs(target)
        finally:
            for d in reversed(made):
                _fs.rmdir(d)


def mkdirs(path: Path) -> list[Path]:
    """mkdir -p, returning what it made (outermost first) so the caller can undo it."""
    missing: list[Path] = []
    p = path
    while not p.is_dir():
        missing.append(p)
        p = p.parent
    made: list[Path] = []
    for d in reversed(missing):
        if _fs.mkdir(d):
            made.append(d)
    return made


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """/proc/<pid>/cgroup as {hierarchy key: path}: each v1 controller (and the
    co-mount key, e.g. 'cpu,cpuacct') maps to its path; v2's '0::' line maps from ''."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        out[controllers] = path
        for c in controllers.split(","):
            if c:
                out[c] = path
    return out
