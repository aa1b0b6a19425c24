"""cgroup v1: one directory per hierarchy (memory, cpu, cpuacct, pids, and freezer when
mounted), each nested under the agent's own group in that hierarchy."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from roost.node.cgroups import _fs
from roost.node.cgroups._group import FREEZE_TIMEOUT, Cgroups, Hierarchy, InstanceCgroup
from roost.node.cgroups._types import (
    CPU_PERIOD_US,
    CgroupUnavailable,
    Limits,
    Usage,
    root_name,
)

REQUIRED = ("memory", "cpu", "cpuacct", "pids")
OPTIONAL = ("freezer",)


class V1InstanceCgroup(InstanceCgroup):
    version = 1

    def _dir(self, controller: str) -> Path:
        """The directory of the hierarchy holding `controller` (co-mounts share one)."""
        for key, d in self.dirs.items():
            if controller in key.split(","):
                return d
        raise KeyError(controller)

    def set_limits(self, limits: Limits) -> None:
        cpu = self._dir("cpu")
        _fs.write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
        _fs.write(cpu / "cpu.cfs_quota_us", str(limits.cpu_quota_us))
        self._set_memory(limits.mem_bytes)
        _fs.write(self._dir("pids") / "pids.max", str(limits.pids_max))

    def _set_memory(self, limit: int) -> None:
        """The kernel keeps memsw >= mem at every step, so the order of the two writes
        depends on whether the limit rises or falls."""
        mem = self._dir("memory")
        memsw = mem / "memory.memsw.limit_in_bytes"
        _fs.write(mem / "memory.swappiness", "0")
        if not memsw.exists():  # no swap accounting: swappiness 0 is all we can do
            _fs.write(mem / "memory.limit_in_bytes", str(limit))
            return
        if limit > _fs.read_int(memsw):
            _fs.write(memsw, str(limit))
            _fs.write(mem / "memory.limit_in_bytes", str(limit))
        else:
            _fs.write(mem / "memory.limit_in_bytes", str(limit))
            _fs.write(memsw, str(limit))

    def populated(self) -> bool:
        return bool(self.pids())

    def usage(self) -> Usage:
        mem = self._dir("memory")
        return Usage(
            cpu_seconds=_fs.read_int(self._dir("cpuacct") / "cpuacct.usage") / 1e9,
            memory_current_bytes=_fs.read_int(mem / "memory.usage_in_bytes"),
            memory_peak_bytes=_fs.read_int(mem / "memory.max_usage_in_bytes"),
            oom_kills=_fs.read_key(mem / "memory.oom_control", "oom_kill", default=0),
        )

    @property
    def can_freeze(self) -> bool:
        return any("freezer" in key.split(",") for key in self.dirs)

    def set_frozen(self, frozen: bool) -> bool:
        state = self._dir("freezer") / "freezer.state"
        want = "FROZEN" if frozen else "THAWED"
        _fs.write(state, want)
        return _fs.wait_until(lambda: _fs.read(state).strip() == want, timeout=FREEZE_TIMEOUT)


class V1Cgroups(Cgroups):
    version = 1

    def __init__(
        self,
        node_id: str,
        hierarchies: list[Hierarchy],
        *,
        own_dirs: Mapping[str, Path],
        proc: Path = Path("/proc"),
    ) -> None:
        """`own_dirs` maps each hierarchy key to the agent's own group directory there;
        the node root is `<own>/roost/<node_id>` in each."""
        super().__init__(
            node_id,
            hierarchies,
            shared_dirs=[own_dirs[h.key] / root_name() for h in hierarchies],
            proc=proc,
        )
        self.own_dirs = dict(own_dirs)

    def _instance(self, instance_id: str, dirs: Mapping[str, Path]) -> InstanceCgroup:
        return V1InstanceCgroup(instance_id, dirs)

    def _memory_key(self) -> str:
        return next(h.key for h in self.hierarchies if "memory" in h.controllers)

    def check_hierarchical(self) -> None:
        """A memory group outside the agent's hierarchy would not count against the
        environment's own limit: refuse rather than let instances escape it."""
        memory = self._memory_key()
        node = next(h for h in self.hierarchies if h.key == memory)
        if node.node_path == f"/roost/{self.node_id}":
            return  # the agent sits at the top: roost/ itself is made hierarchical below
        flag = self.own_dirs[memory] / "memory.use_hierarchy"
        if flag.exists() and _fs.read(flag).strip() == "0":
            raise CgroupUnavailable(f"{flag} is 0: groups below would escape its memory limit")

    def _prepare_root(self) -> None:
        self.check_hierarchical()
        memory = self._memory_key()
        for h in self.hierarchies:
            for d in (h.node_dir.parent, h.node_dir):
                if _fs.mkdir(d) and h.key == memory:
                    flag = d / "memory.use_hierarchy"
                    if flag.exists() and _fs.read(flag).strip() == "0":
                        _fs.write(flag, "1")  # only legal while the dir has no children
