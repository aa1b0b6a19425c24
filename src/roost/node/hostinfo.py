"""Reading this host's capacity from /proc, with overrides by flag or env.

Overrides let tests and `roost up` run several small "hosts" on one machine.
"""

from __future__ import annotations

from pathlib import Path

from roost.domain.host import (
    DEFAULT_RESERVE,
    HostCapacity,
    mem_total_mib,
    parse_gpus,
    physical_cores,
)
from roost.domain.resources import Resources, parse_quantity


def detect_total(proc: Path = Path("/proc")) -> Resources:
    cores = physical_cores((proc / "cpuinfo").read_text())
    mem = mem_total_mib((proc / "meminfo").read_text())
    return Resources(cores * 1000, mem)


def host_capacity(
    *, capacity: str | None = None, reserve: str | None = None, gpus: str = ""
) -> HostCapacity:
    """The host as configured: ``capacity`` (e.g. ``8vcpu,32GiB``) replaces detection,
    ``reserve`` replaces the default 2 vCPU / 2 GiB, ``gpus`` lists devices."""
    total = parse_quantity(capacity) if capacity else detect_total()
    res = parse_quantity(reserve) if reserve else DEFAULT_RESERVE
    return HostCapacity(total=total, gpus=parse_gpus(gpus), reserve=res)
