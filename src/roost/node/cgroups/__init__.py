"""Cgroup isolation for the node agent: one group per instance, limits on CPU, memory
(swap off) and pids, usage readings, and a kill that cannot miss a forked or detached
process.

Each instance's group lives under one node root, so the agent lists, re-adopts and
cleans up only its own groups, never the host's:

- **v1** (hybrid hosts): in every hierarchy it uses, under the agent's *own* group
  there (from /proc/self/cgroup), at `<own>/roost/<node_id>/<instance_id>`, so instance
  groups count against whatever limits the environment put on the agent.
  Needs memory, cpu, cpuacct and pids mounted as v1 hierarchies (freezer optional),
  write access there, and `memory.use_hierarchy=1` on the agent's memory group.
  Enforces: `cpu.cfs_quota_us`/`cpu.cfs_period_us`, `memory.limit_in_bytes` with
  `memory.memsw.limit_in_bytes` equal (when swap accounting exists) and
  `memory.swappiness=0`, `pids.max`. Kill freezes via `freezer.state` when mounted;
  without a freezer it re-reads and re-signals until no new pid appears.
- **v2** (unified hosts): at `<mount>/roost/<node_id>/<instance_id>` (or under an
  explicit delegated `parent=`), with +memory +cpu +pids enabled in each
  `cgroup.subtree_control` on the way down. Needs those controllers in the mount's
  `cgroup.controllers` and a parent with no processes of its own (the v2 "no internal
  processes" rule; the root is exempt). Enforces: `cpu.max`, `memory.max`,
  `memory.swap.max=0` (when swap accounting exists), `pids.max`. Kill uses
  `cgroup.kill` for SIGKILL, and `cgroup.freeze` around other signals.

A process joins its group before any user code runs: `join_command` wraps argv in a
shell shim that writes its own pid into every procs file and then execs.
"""

from roost.node.cgroups._detect import detect
from roost.node.cgroups._group import JOIN_SHIM, Cgroups, InstanceCgroup
from roost.node.cgroups._types import (
    ROOT_ENV,
    CgroupError,
    CgroupUnavailable,
    Limits,
    Usage,
    root_name,
)

__all__ = [
    "JOIN_SHIM",
    "ROOT_ENV",
    "CgroupError",
    "CgroupUnavailable",
    "Cgroups",
    "InstanceCgroup",
    "Limits",
    "Usage",
    "detect",
    "root_name",
]
