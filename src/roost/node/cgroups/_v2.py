"""cgroup v2: one directory in the unified hierarchy, limits set through controllers
enabled in each ancestor's `cgroup.subtree_control`."""

from __future__ import annotations

import errno
from collections.abc import Iterable, Mapping
from pathlib import Path

from roost.node.cgroups import _fs
from roost.node.cgroups._group import (
    FREEZE_TIMEOUT,
    Cgroups,
    Hierarchy,
    InstanceCgroup,
    mkdirs,
)
from roost.node.cgroups._types import (
    CPU_PERIOD_US,
    CgroupError,
    CgroupUnavailable,
    Limits,
    Usage,
    check_id,
    root_name,
)

REQUIRED = ("memory", "cpu", "pids")


def available_controllers(cgroup_dir: Path) -> frozenset[str]:
    return frozenset(_fs.read(cgroup_dir / "cgroup.controllers").split())


class V2InstanceCgroup(InstanceCgroup):
    version = 2

    def __init__(self, name: str, dirs: Mapping[str, Path], *, controllers: Iterable[str]) -> None:
        """`controllers` are those enabled for the group; limits and usage of any other
        are skipped, which only `Cgroups.v2_at(require_controllers=False)` allows."""
        super().__init__(name, dirs)
        self.controllers = frozenset(controllers)

    @property
    def dir(self) -> Path:
        return self.dirs[""]

    def set_limits(self, limits: Limits) -> None:
        d = self.dir
        if "cpu" in self.controllers:
            _fs.write(d / "cpu.max", f"{limits.cpu_quota_us} {CPU_PERIOD_US}")
        if "memory" in self.controllers:
            _fs.write(d / "memory.max", str(limits.mem_bytes))
            if (d / "memory.swap.max").exists():  # absent without swap accounting
                _fs.write(d / "memory.swap.max", "0")
        if "pids" in self.controllers:
            _fs.write(d / "pids.max", str(limits.pids_max))

    def populated(self) -> bool:
        events = self.dir / "cgroup.events"
        if not events.exists():
            return False
        return _fs.read_key(events, "populated") == 1

    def usage(self) -> Usage:
        d = self.dir
        memory = "memory" in self.controllers
        peak = d / "memory.peak"
        return Usage(
            cpu_seconds=_fs.read_key(d / "cpu.stat", "usage_usec") / 1e6,
            memory_current_bytes=_fs.read_int(d / "memory.current") if memory else 0,
            memory_peak_bytes=_fs.read_int(peak) if memory and peak.exists() else 0,
            oom_kills=(_fs.read_key(d / "memory.events", "oom_kill", default=0) if memory else 0),
        )

    @property
    def can_freeze(self) -> bool:
        return (self.dir / "cgroup.freeze").exists()

    def set_frozen(self, frozen: bool) -> bool:
        want = int(frozen)
        _fs.write(self.dir / "cgroup.freeze", str(want))
        events = self.dir / "cgroup.events"
        return _fs.wait_until(
            lambda: _fs.read_key(events, "frozen", default=0) == want, timeout=FREEZE_TIMEOUT
        )

    def _fast_kill(self) -> bool:
        kill = self.dir / "cgroup.kill"
        if not kill.exists():
            return False
        _fs.write(kill, "1")
        return True


class V2Cgroups(Cgroups):
    version = 2

    def __init__(
        self,
        node_id: str,
        *,
        mount: Path,
        mount_root: str = "/",
        parent: str | None = None,
        controllers: Iterable[str] = REQUIRED,
        proc: Path = Path("/proc"),
    ) -> None:
        """Groups go in `<mount>/<parent>/<node_id>/<instance>`. With the default parent
        (`roost`, right under the root) controllers are enabled from the root down; an
        explicit parent is a delegated subtree, and only it and below are touched."""
        check_id("node id", node_id)
        rel = (parent or root_name()).strip("/")
        if not rel or any(part in ("", ".", "..") for part in rel.split("/")):
            raise ValueError(f"invalid cgroup parent {parent!r}")
        self.mount = mount
        self.parent_dir = mount / rel
        self.controllers = frozenset(controllers)
        # Where subtree_control must carry our controllers: each dir whose children we make.
        self.enable_in = ([mount, self.parent_dir] if parent is None else [self.parent_dir]) + [
            self.parent_dir / node_id
        ]
        node_path = "/".join(p for p in (mount_root.rstrip("/"), rel, node_id))
        hierarchy = Hierarchy("", frozenset(), self.parent_dir / node_id, node_path)
        super().__init__(
            node_id,
            [hierarchy],
            shared_dirs=[self.parent_dir] if parent is None else [],
            proc=proc,
        )

    def _instance(self, instance_id: str, dirs: Mapping[str, Path]) -> InstanceCgroup:
        return V2InstanceCgroup(instance_id, dirs, controllers=self.controllers)

    def _prepare_root(self) -> None:
        mkdirs(self.hierarchies[0].node_dir)
        for d in self.enable_in:
            self._enable(d)

    def _enable(self, d: Path) -> None:
        """Turn on only what is missing, so an already-delegated subtree whose
        subtree_control we may not write still works."""
        have = set(_fs.read(d / "cgroup.subtree_control").split())
        missing = sorted(self.controllers - have)
        if not missing:
            return
        lacking = sorted(set(missing) - available_controllers(d))
        if lacking:
            raise CgroupUnavailable(
                f"{d / 'cgroup.controllers'} lacks {','.join(lacking)}: not delegated here"
            )
        try:
            _fs.write(d / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))
        except CgroupError as e:
            if e.errno == errno.EBUSY:
                e.add_note(
                    f"{d} holds processes, and a v2 group with members cannot hand "
                    "controllers to children: move them to a leaf group, or pass parent="
                )
            raise


def v2_at(
    mount: Path,
    parent: str | None,
    node_id: str,
    *,
    require_controllers: bool = True,
    mount_root: str = "/",
    proc: Path = Path("/proc"),
) -> V2Cgroups:
    try:
        have = available_controllers(mount)
    except CgroupError as e:
        raise CgroupUnavailable(e.errno, f"not a usable cgroup2 mount: {e}") from e
    lacking = [c for c in REQUIRED if c not in have]
    if lacking and require_controllers:
        raise CgroupUnavailable(f"{mount / 'cgroup.controllers'} lacks {','.join(lacking)}")
    cgroups = V2Cgroups(
        node_id,
        mount=mount,
        mount_root=mount_root,
        parent=parent,
        controllers=[c for c in REQUIRED if c in have],
        proc=proc,
    )
    try:
        cgroups.probe()
    except CgroupError as e:
        raise CgroupUnavailable(e.errno, f"cannot make groups at {cgroups.root}: {e}") from e
    return cgroups
