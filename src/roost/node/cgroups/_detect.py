"""Finding which cgroup version this host gives us, and where this node's groups go.

v1 wins whenever its needed controllers are bound to v1 hierarchies, even beside a
cgroup2 mount (hybrid hosts): a controller lives in one hierarchy only, so an empty
cgroup2 mount next to them can enforce nothing.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from roost.node.cgroups import _v1, _v2
from roost.node.cgroups._group import Cgroups, Hierarchy, parse_proc_cgroup
from roost.node.cgroups._types import CgroupError, CgroupUnavailable, check_id, root_name

V1_CONTROLLERS = frozenset(
    "cpu cpuacct cpuset memory devices freezer net_cls net_prio blkio perf_event "
    "hugetlb pids rdma misc".split()
)


@dataclass(frozen=True, slots=True)
class Mount:
    """One cgroup mount from mountinfo. `root` is the cgroup path the mount point shows
    (not '/' when a container bind-mounts a subtree); `controllers` is empty for v2."""

    fstype: str
    point: Path
    root: str
    controllers: frozenset[str]

    def dir_of(self, cgroup_path: str) -> Path | None:
        """The directory of a cgroup path, or None when this mount cannot reach it."""
        root = self.root.rstrip("/")
        if cgroup_path != root and not cgroup_path.startswith(root + "/"):
            return None
        rest = cgroup_path[len(root) :].strip("/")
        return self.point / rest if rest else self.point


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    mounts: list[Mount] = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if len(fields) < sep + 4 or len(fields) < 5:
            continue
        fstype, options = fields[sep + 1], fields[sep + 3].split(",")
        if fstype not in ("cgroup", "cgroup2"):
            continue
        controllers = frozenset(o for o in options if o in V1_CONTROLLERS)
        if fstype == "cgroup" and not controllers:
            continue  # a named hierarchy such as name=systemd: no controllers to use
        mounts.append(Mount(fstype, Path(_unescape(fields[4])), _unescape(fields[3]), controllers))
    return mounts


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as e:
        raise CgroupUnavailable(e.errno, f"cannot read {path}: {e.strerror}") from e


def detect(
    node_id: str,
    *,
    mountinfo: Path = Path("/proc/self/mountinfo"),
    proc_self_cgroup: Path = Path("/proc/self/cgroup"),
    parent: str | None = None,
    proc: Path = Path("/proc"),
) -> Cgroups:
    """This host's cgroups for node `node_id`, proven writable. `parent` (a path under
    the cgroup2 mount, for delegated setups) applies to v2 only; `proc` is read by
    `group_of`. Raises `CgroupUnavailable` with a one-line reason."""
    check_id("node id", node_id)
    if not sys.platform.startswith("linux"):
        raise CgroupUnavailable(f"cgroups need Linux, this is {sys.platform}")
    mounts = parse_mountinfo(_read(mountinfo))
    own = parse_proc_cgroup(_read(proc_self_cgroup))
    found_v1 = _v1_layout(node_id, mounts, own, proc)
    if isinstance(found_v1, Cgroups):
        cgroups: Cgroups = found_v1
    else:
        found_v2 = _v2_layout(node_id, mounts, own, parent, proc)
        if not isinstance(found_v2, Cgroups):
            raise CgroupUnavailable(f"no usable cgroups: v1 {found_v1}; v2 {found_v2}")
        cgroups = found_v2
    if isinstance(cgroups, _v1.V1Cgroups):
        cgroups.check_hierarchical()
    try:
        cgroups.probe()
    except CgroupError as e:
        raise CgroupUnavailable(e.errno, f"cannot make groups at {cgroups.root}: {e}") from e
    return cgroups


def _v1_layout(node_id: str, mounts: list[Mount], own: dict[str, str], proc: Path) -> Cgroups | str:
    """The v1 layout, or why not (a reason string, for the combined message)."""
    chosen: dict[frozenset[str], Path] = {}
    for controller in (*_v1.REQUIRED, *_v1.OPTIONAL):
        candidates = [m for m in mounts if m.fstype == "cgroup" and controller in m.controllers]
        if not candidates:
            if controller in _v1.OPTIONAL:
                continue
            return f"no {controller} hierarchy mounted"
        path = own.get(controller)
        if path is None:
            return f"/proc/self/cgroup has no {controller} line"
        reachable = [(m, d) for m in candidates if (d := m.dir_of(path)) is not None]
        if not reachable:
            return f"own {controller} group {path} is outside every {controller} mount"
        m, d = reachable[0]
        chosen.setdefault(m.controllers, d)
    hierarchies = []
    own_dirs = {}
    name = root_name()
    for controllers, own_dir in chosen.items():
        key = ",".join(sorted(controllers))
        path = own[min(controllers)].rstrip("/")
        own_dirs[key] = own_dir
        hierarchies.append(
            Hierarchy(key, controllers, own_dir / name / node_id, f"{path}/{name}/{node_id}")
        )
    return _v1.V1Cgroups(node_id, hierarchies, own_dirs=own_dirs, proc=proc)


def _v2_layout(
    node_id: str, mounts: list[Mount], own: dict[str, str], parent: str | None, proc: Path
) -> Cgroups | str:
    unified = [m for m in mounts if m.fstype == "cgroup2"]
    if not unified:
        return "no cgroup2 mount"
    path = own.get("", "/")
    reachable = [m for m in unified if m.dir_of(path) is not None] or unified
    mount = reachable[0]
    try:
        have = _v2.available_controllers(mount.point)
    except CgroupError as e:
        return str(e)
    lacking = [c for c in _v2.REQUIRED if c not in have]
    if lacking:
        return f"{mount.point / 'cgroup.controllers'} lacks {','.join(lacking)}"
    return _v2.V2Cgroups(
        node_id, mount=mount.point, mount_root=mount.root, parent=parent, proc=proc
    )
