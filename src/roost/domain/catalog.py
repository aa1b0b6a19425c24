"""The instance-type catalog: EC2 names and sizes, plus operator-defined types.

Sizes follow EC2's published shapes (vCPU and GiB) for the families roost ships. GPU
types ask for whole devices; slice types ask for a fraction of one device (MIG-like).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from roost.domain.resources import GPU_MILLI, Resources


@dataclass(frozen=True, slots=True)
class InstanceType:
    """What one instance of a type asks of a host.

    ``gpu_count`` whole GPUs, or, when ``gpu_milli`` is set, a fraction of one GPU
    (``0 < gpu_milli < 1000``) that must fit on a single device.
    """

    name: str
    cpu_milli: int
    mem_mib: int
    gpu_count: int = 0
    gpu_milli: int = 0
    gpu_models: tuple[str, ...] = ()
    """The GPU models a device may be, any of them; empty means any model. Kept sorted
    and without repeats, so that two types accepting the same set compare equal."""
    pids_max: int = 0
    """The most processes one instance may run; 0 means the node's default (4096)."""

    def __post_init__(self) -> None:
        if isinstance(self.gpu_models, str):  # a lone name would become its letters
            raise TypeError(f"{self.name}: gpu_models is a tuple of names, not a str")
        models = tuple(sorted(set(self.gpu_models)))
        if models != self.gpu_models:
            object.__setattr__(self, "gpu_models", models)

    def accepts_model(self, model: str) -> bool:
        """Whether a device of ``model`` can serve this type's GPU ask."""
        return not self.gpu_models or model in self.gpu_models

    @property
    def resources(self) -> Resources:
        return Resources(self.cpu_milli, self.mem_mib)

    @property
    def vcpus(self) -> int:
        """vCPUs as EC2 reports them (rounded up for fractional types)."""
        return max(1, -(-self.cpu_milli // 1000))

    @property
    def gpu_total_milli(self) -> int:
        return self.gpu_count * GPU_MILLI + self.gpu_milli

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]

    def validate(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"instance type name {self.name!r} must look like 'family.size'")
        if self.cpu_milli <= 0 or self.mem_mib <= 0:
            raise ValueError(f"{self.name}: cpu and memory must be positive")
        if self.gpu_count < 0 or not 0 <= self.gpu_milli < GPU_MILLI:
            raise ValueError(f"{self.name}: gpu_milli must be in [0, 1000) and gpus >= 0")
        if self.gpu_count and self.gpu_milli:
            raise ValueError(f"{self.name}: ask for whole GPUs or a fraction, not both")
        if any(not m or "|" in m for m in self.gpu_models):
            raise ValueError(f"{self.name}: GPU model names must be non-empty, without '|'")
        if self.pids_max < 0 or 0 < self.pids_max < 8:
            raise ValueError(f"{self.name}: pids must be at least 8 (or 0 for the default)")


_NAME = re.compile(r"[a-z][a-z0-9-]*\.[a-z0-9-]+")

_SIZES = {
    "large": 2,
    "xlarge": 4,
    "2xlarge": 8,
    "4xlarge": 16,
    "8xlarge": 32,
    "12xlarge": 48,
    "16xlarge": 64,
    "24xlarge": 96,
}
# GiB per vCPU: m = general purpose, c = compute, r = memory optimised.
_FAMILIES = {"m7i": 4, "c7i": 2, "r7i": 8, "m8a": 4}
_T3 = {
    "nano": (2, 0.5),
    "micro": (2, 1),
    "small": (2, 2),
    "medium": (2, 4),
    "large": (2, 8),
    "xlarge": (4, 16),
    "2xlarge": (8, 32),
}
_T2 = {
    "nano": (1, 0.5),
    "micro": (1, 1),
    "small": (1, 2),
    "medium": (2, 4),
    "large": (2, 8),
    "xlarge": (4, 16),
    "2xlarge": (8, 32),
}
# g5: NVIDIA A10G. (name, vCPU, GiB, GPUs)
_G5 = [
    ("g5.xlarge", 4, 16, 1),
    ("g5.2xlarge", 8, 32, 1),
    ("g5.4xlarge", 16, 64, 1),
    ("g5.8xlarge", 32, 128, 1),
    ("g5.12xlarge", 48, 192, 4),
    ("g5.24xlarge", 96, 384, 4),
    ("g5.48xlarge", 192, 768, 8),
]
# Fractional slices of one GPU (roost's own family; EC2 has no such type).
_GS = [("gs1.eighth", 1, 4, 125), ("gs1.quarter", 2, 8, 250), ("gs1.half", 4, 16, 500)]


def _builtin() -> list[InstanceType]:
    types = [InstanceType(f"t3.{s}", v * 1000, round(g * 1024)) for s, (v, g) in _T3.items()]
    for fam, gib_per_vcpu in _FAMILIES.items():
        for size, vcpu in _SIZES.items():
            types.append(InstanceType(f"{fam}.{size}", vcpu * 1000, vcpu * gib_per_vcpu * 1024))
    for name, vcpu, gib, gpus in _G5:
        types.append(InstanceType(name, vcpu * 1000, gib * 1024, gpu_count=gpus))
    for name, vcpu, gib, milli in _GS:
        types.append(InstanceType(name, vcpu * 1000, gib * 1024, gpu_milli=milli))
    # EC2's default when RunInstances names no type: 1 vCPU, 1.7 GiB.
    types.append(InstanceType("m1.small", 1000, 1740))
    # Earlier generations that everyday boto3 and Terraform code still names, with EC2's
    # shapes: t2 (burstable), t1.micro (0.613 GiB) and m1.medium (3.75 GiB).
    types += [InstanceType(f"t2.{s}", v * 1000, round(g * 1024)) for s, (v, g) in _T2.items()]
    types.append(InstanceType("t1.micro", 1000, 628))
    types.append(InstanceType("m1.medium", 1000, 3840))
    return types


class Catalog(Mapping[str, InstanceType]):
    """An immutable name -> type mapping that keeps a stable order (built-ins first)."""

    def __init__(self, types: Iterable[InstanceType]) -> None:
        self._types: dict[str, InstanceType] = {}
        for t in types:
            t.validate()
            self._types[t.name] = t

    def __getitem__(self, name: str) -> InstanceType:
        return self._types[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._types)

    def __len__(self) -> int:
        return len(self._types)

    def with_types(self, extra: Iterable[InstanceType]) -> Catalog:
        """A catalog with ``extra`` added; an extra type replaces a built-in of its name."""
        return Catalog([*self._types.values(), *extra])


BUILTIN = Catalog(_builtin())


def parse_types_toml(text: str) -> list[InstanceType]:
    """Operator-defined types from TOML::

        [types."x1.big"]
        vcpu = 12          # or cpu_milli = 12000
        memory_gib = 48    # or memory_mib = 49152
        gpus = 0           # whole GPUs, or
        gpu_fraction = 0.5 # a slice of one GPU
        gpu_model = "A10G"  # or any of several models:
        gpu_models = ["V100M16", "V100M32"]
        pids = 512         # the most processes one instance may run (default 4096)

    Raises ValueError naming the type and field at fault.
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"invalid TOML: {exc}") from None
    table = doc.get("types", {})
    if not isinstance(table, dict):
        raise ValueError("[types] must be a table of instance types")
    out = []
    for name, spec in table.items():
        if not isinstance(spec, dict):
            raise ValueError(f"types.{name} must be a table")
        try:
            if "cpu_milli" in spec:
                cpu = int(spec["cpu_milli"])
            else:
                cpu = round(float(spec["vcpu"]) * 1000)
            if "memory_mib" in spec:
                mem = int(spec["memory_mib"])
            else:
                mem = round(float(spec["memory_gib"]) * 1024)
            gpus = int(spec.get("gpus", 0))
            frac = round(float(spec.get("gpu_fraction", 0)) * GPU_MILLI)
            pids = int(spec.get("pids", 0))
        except KeyError as exc:
            raise ValueError(f"types.{name}: missing {exc.args[0]!r}") from None
        except (TypeError, ValueError):
            raise ValueError(f"types.{name}: numeric fields must be numbers") from None
        t = InstanceType(name, cpu, mem, gpus, frac, _models(name, spec), pids_max=pids)
        t.validate()
        out.append(t)
    return out


def _models(name: str, spec: dict[str, object]) -> tuple[str, ...]:
    """``gpu_model = "X"`` (a set of one) or ``gpu_models = ["X", "Y"]``, not both."""
    if "gpu_model" in spec and "gpu_models" in spec:
        raise ValueError(f"types.{name}: give gpu_model or gpu_models, not both")
    if "gpu_model" in spec:
        one = spec["gpu_model"]
        if not isinstance(one, str):
            raise ValueError(f"types.{name}: gpu_model must be a string")
        return (one,) if one else ()
    many = spec.get("gpu_models", [])
    if not isinstance(many, list) or not all(isinstance(m, str) for m in many):
        raise ValueError(f"types.{name}: gpu_models must be a list of strings")
    return tuple(str(m) for m in many)
