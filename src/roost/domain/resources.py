"""Resource vectors and GPU devices.

CPU is counted in milli-vCPU and memory in MiB so that all arithmetic is integral: a
ledger that sums floats drifts, and a drifting ledger over-commits.
"""

from __future__ import annotations

from dataclasses import dataclass

GPU_MILLI = 1000  # one whole GPU device, in milli


@dataclass(frozen=True, slots=True)
class Resources:
    """A CPU/memory amount. GPUs are tracked per device, see `GpuDevice`."""

    cpu_milli: int = 0
    mem_mib: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.cpu_milli + other.cpu_milli, self.mem_mib + other.mem_mib)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.cpu_milli - other.cpu_milli, self.mem_mib - other.mem_mib)

    def covers(self, other: Resources) -> bool:
        return self.cpu_milli >= other.cpu_milli and self.mem_mib >= other.mem_mib

    def is_negative(self) -> bool:
        return self.cpu_milli < 0 or self.mem_mib < 0

    def scaled(self, factor: int) -> Resources:
        return Resources(self.cpu_milli * factor, self.mem_mib * factor)


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One physical GPU of a host: its index on the host and its model name."""

    index: int
    model: str


def parse_quantity(text: str) -> Resources:
    """Parse a capacity such as ``8vcpu,32GiB`` or ``500m,512MiB`` into a `Resources`.

    Accepted CPU units: ``vcpu``/``cpu`` (whole vCPUs, decimals allowed) and ``m``
    (milli). Memory units: ``MiB``, ``GiB``, ``TiB``. Raises ValueError with the offending
    part named.
    """
    cpu: int | None = None
    mem: int | None = None
    for raw in text.split(","):
        part = raw.strip()
        low = part.lower()
        if not part:
            continue
        try:
            if low.endswith("vcpu") or low.endswith("cpu"):
                cpu = round(float(low.removesuffix("vcpu").removesuffix("cpu")) * 1000)
            elif low.endswith("mib"):
                mem = int(low[:-3])
            elif low.endswith("gib"):
                mem = round(float(low[:-3]) * 1024)
            elif low.endswith("tib"):
                mem = round(float(low[:-3]) * 1024 * 1024)
            elif low.endswith("m") and low[:-1].isdigit():
                cpu = int(low[:-1])
            else:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"cannot parse {part!r}: expected e.g. '8vcpu', '500m', '32GiB' or '512MiB'"
            ) from None
    if cpu is None or mem is None:
        raise ValueError(f"capacity {text!r} must give both CPU and memory, e.g. '8vcpu,32GiB'")
    if cpu < 0 or mem < 0:
        raise ValueError(f"capacity {text!r} must not be negative")
    return Resources(cpu, mem)
