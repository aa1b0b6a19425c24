"""Host capacity: what a machine offers to instances once the host reserve is kept back.

Parsing is pure (it takes the text of /proc files); reading them is the node's job.
"""

from __future__ import annotations

from dataclasses import dataclass

from roost.domain.fit import FreeCapacity
from roost.domain.resources import GPU_MILLI, GpuDevice, Resources

DEFAULT_RESERVE = Resources(cpu_milli=2000, mem_mib=2048)


def physical_cores(cpuinfo: str) -> int:
    """Distinct (physical id, core id) pairs; falls back to processor count.

    vCPUs are physical cores by default: hyper-threads share execution units, and
    counting them would let a node promise twice what it can run.
    """
    cores: set[tuple[str, str]] = set()
    processors = 0
    phys, core = "0", None
    for line in [*cpuinfo.splitlines(), ""]:
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "processor":
            processors += 1
        elif key == "physical id":
            phys = value
        elif key == "core id":
            core = value
        elif not key and core is not None:
            cores.add((phys, core))
            phys, core = "0", None
    return len(cores) or processors


def mem_total_mib(meminfo: str) -> int:
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise ValueError("MemTotal not found in meminfo")


@dataclass(frozen=True, slots=True)
class HostCapacity:
    """A host's total resources and the reserve kept back for the host itself."""

    total: Resources
    gpus: tuple[GpuDevice, ...] = ()
    reserve: Resources = DEFAULT_RESERVE

    @property
    def allocatable(self) -> Resources:
        left = self.total - self.reserve
        return Resources(max(0, left.cpu_milli), max(0, left.mem_mib))

    def empty(self) -> FreeCapacity:
        """Free capacity of this host with nothing running."""
        return FreeCapacity(
            self.allocatable,
            tuple(GPU_MILLI for _ in self.gpus),
            tuple(g.model for g in self.gpus),
        )


def parse_gpus(spec: str) -> tuple[GpuDevice, ...]:
    """``"2xA10G,1xT4"`` or ``"A10G,A10G"`` -> devices numbered from 0."""
    out: list[GpuDevice] = []
    for raw in spec.split(","):
        part = raw.strip()
        if not part:
            continue
        count_s, sep, model = part.partition("x")
        if sep and count_s.isdigit():
            count = int(count_s)
        else:
            count, model = 1, part
        if not model or count < 0:
            raise ValueError(f"cannot parse GPU spec {part!r}: expected e.g. '2xA10G'")
        base = len(out)
        out.extend(GpuDevice(base + k, model) for k in range(count))
    return tuple(out)
