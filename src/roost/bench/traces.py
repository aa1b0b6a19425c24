"""Loaders for the public traces the placement benchmarks replay.

The traces are not part of roost: users download them (docs/benchmarks.md says from
where) into a data directory, ``../shared/data`` beside the project by default. Every
loader reads upstream files unmodified and fails with the path it wanted when one is
missing.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from roost.decide.placement import NodeView
from roost.domain.catalog import InstanceType
from roost.domain.fit import FreeCapacity
from roost.domain.resources import GPU_MILLI, Resources

OPENB = "alibaba-openb"
FGD_PUBLISHED = "fgd-published"
AZURE_V1 = "azure-v1"


def default_data_dir() -> Path:
    """``../shared/data`` relative to the project root (the directory holding
    pyproject.toml), found from this file so it works from any working directory."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file():
            return parent.parent / "shared" / "data"
    return Path.cwd().parent / "shared" / "data"


class TraceMissing(FileNotFoundError):
    def __init__(self, path: Path, hint: str) -> None:
        super().__init__(f"{path} not found. {hint}")
        self.path = path


def require(path: Path, hint: str = "See docs/benchmarks.md for where to download it.") -> Path:
    if not path.exists():
        raise TraceMissing(path, hint)
    return path


def _rows(path: Path) -> Iterator[dict[str, str]]:
    with require(path).open(newline="") as f:
        yield from csv.DictReader(f)


# -- Alibaba openb (cluster-trace-gpu-v2023) ------------------------------------------


def load_nodes(path: Path) -> list[NodeView]:
    """openb node list (``sn,cpu_milli,memory_mib,gpu,model``) as empty nodes, sorted by
    id so that index order is tie-break order. The figures are already allocatable."""
    nodes = []
    for row in _rows(path):
        res = Resources(int(row["cpu_milli"]), int(row["memory_mib"]))
        n = int(row["gpu"])
        free = FreeCapacity(res, (GPU_MILLI,) * n, (row["model"],) * n)
        nodes.append(NodeView(row["sn"], res, free))
    nodes.sort(key=lambda v: v.node_id)
    return nodes


def pod_type(cpu_milli: int, mem_mib: int, num_gpu: int, gpu_milli: int, spec: str) -> InstanceType:
    """A pod request as an instance type, following the FGD protocol: ``num_gpu > 1``
    whole GPUs; ``num_gpu == 1`` a ``gpu_milli`` share of one device (1000 is a whole
    one); ``num_gpu == 0`` none. ``spec`` is the pod's GPU model constraint: empty for
    any model, else one model or several joined by ``|``, any of which will do."""
    models = tuple(sorted({m for m in spec.split("|") if m}))
    name = f"openb.c{cpu_milli}-m{mem_mib}-g{num_gpu}x{gpu_milli}"
    if models:
        name += "-" + "-".join(m.lower() for m in models)
    if num_gpu > 1 or (num_gpu == 1 and gpu_milli >= GPU_MILLI):
        return InstanceType(name, cpu_milli, mem_mib, gpu_count=num_gpu, gpu_models=models)
    if num_gpu == 1:
        return InstanceType(name, cpu_milli, mem_mib, gpu_milli=gpu_milli, gpu_models=models)
    return InstanceType(name, cpu_milli, mem_mib)


def load_pods(path: Path) -> list[InstanceType]:
    """openb pod list in trace order: by ``creation_time``, file order among equals (the
    artifact's simulator sorts the same way when it does not shuffle). The default list
    is stored in that order; ``cpu050`` is stored with its CPU-only pods first. Pods of
    one shape share one `InstanceType` object."""
    shapes: dict[tuple[int, int, int, int, str], InstanceType] = {}
    rows = list(_rows(path))
    if rows and "creation_time" in rows[0]:
        rows.sort(key=lambda r: int(r["creation_time"] or 0))
    pods = []
    for row in rows:
        spec = "|".join(sorted({m for m in (row.get("gpu_spec") or "").split("|") if m}))
        key = (
            int(row["cpu_milli"]),
            int(row["memory_mib"]),
            int(row["num_gpu"]),
            int(row["gpu_milli"]),
            spec,
        )
        t = shapes.get(key)
        if t is None:
            t = shapes[key] = pod_type(*key)
        pods.append(t)
    return pods


# -- The FGD artifact's published results ---------------------------------------------

PUBLISHED_LABELS = {
    "01-Random": "Random",
    "02-DotProd": "DotProd",
    "03-GpuClustering": "GpuClustering",
    "04-GpuPacking": "GpuPacking",
    "05-BestFit": "BestFit",
    "06-FGD": "FGD",
}


@dataclass(frozen=True, slots=True)
class PublishedCurve:
    workload: str
    policy: str
    seeds: tuple[int, ...]
    mean: tuple[float | None, ...]  # allocation % at arrived % = index (0..130)

    def at(self, arrived_pct: int) -> float | None:
        return self.mean[arrived_pct] if arrived_pct < len(self.mean) else None


def load_published(path: Path, workload: str) -> list[PublishedCurve]:
    """Mean curve over seeds, per policy, for one workload (e.g. ``openb_pod_list_default``)."""
    by_policy: dict[str, list[tuple[int, list[float | None]]]] = {}
    for row in _rows(path):
        if row["workload"] != workload:
            continue
        cols = [row.get(str(k), "") for k in range(131)]
        values = [float(v) if v else None for v in cols]
        by_policy.setdefault(row["sc_policy"], []).append((int(row["seed"]), values))
    out = []
    for policy, runs in sorted(by_policy.items()):
        mean: list[float | None] = []
        for k in range(131):
            vals = [v[k] for _, v in runs if v[k] is not None]
            mean.append(sum(vals) / len(vals) if vals else None)  # type: ignore[arg-type]
        label = PUBLISHED_LABELS.get(policy, policy)
        out.append(PublishedCurve(workload, label, tuple(s for s, _ in runs), tuple(mean)))
    return out


def published_workloads(path: Path) -> list[str]:
    return sorted({row["workload"] for row in _rows(path)})


# -- Azure VM trace v1 (processed by huaweicloud/trace_generation_rnn) ---------------


@dataclass(frozen=True, slots=True)
class Flavor:
    letter: str
    vcpus: float
    mem_gib: float


@dataclass(frozen=True, slots=True)
class VmArrival:
    time: int  # seconds from the trace's start
    flavor: int  # index into VmTrace.flavors
    departs: int | None  # seconds; None when still running at the trace's end


@dataclass(frozen=True, slots=True)
class VmTrace:
    flavors: tuple[Flavor, ...]
    arrivals: tuple[VmArrival, ...]
    end: int


def _bin_edges(path: Path) -> list[tuple[int, int]]:
    """Duration bin -> [low, high) seconds, from ``<seconds> <bin>`` lines."""
    lows: dict[int, int] = {}
    highs: dict[int, int] = {}
    step = 0
    prev = None
    for line in require(path).read_text().split("\n"):
        if not line.strip():
            continue
        sec_s, bin_s = line.split()
        sec, b = int(sec_s), int(bin_s)
        lows.setdefault(b, sec)
        if prev is not None:
            step = sec - prev
        prev = sec
        highs[b] = sec
    return [(lows[b], highs[b] + step) for b in range(max(lows) + 1)]


def _split_line(line: str) -> tuple[int, list[str]]:
    head, _, rest = line.partition(" ")
    return int(head), [t for t in rest.strip().split(",") if t and t != "|"]


def load_azure(
    data_dir: Path, *, split: str = "test", censor: int = 2591400
) -> VmTrace:
    """The Azure V1 ``split`` trace: flavors, arrivals and departures.

    A finished VM (``U<bin>``) lives for the middle of its duration bin; a censored one
    (``C<bin>``) was still running when the trace ends and never leaves. Arrivals in one
    300 s line all arrive at its timestamp, in trace order.
    """
    base = data_dir / AZURE_V1
    flavors: list[Flavor] = []
    letters: dict[str, int] = {}
    for line in require(base / "flav_map.txt").read_text().split("\n"):
        if not line.strip():
            continue
        size, letter = line.split()
        cpu_s, mem_s = size.split(",")
        letters[letter] = len(flavors)
        flavors.append(Flavor(letter, float(cpu_s), float(mem_s)))
    edges = _bin_edges(base / "v1.interval_map.txt")
    arr_lines = require(base / f"v1.{split}.txt").read_text().split("\n")
    dur_lines = require(base / f"v1.{split}.c{censor}.txt").read_text().split("\n")
    arrivals: list[VmArrival] = []
    start: int | None = None
    end = 0
    for a_line, d_line in zip(arr_lines, dur_lines, strict=True):
        if not a_line.strip():
            continue
        t, vms = _split_line(a_line)
        t2, durs = _split_line(d_line)
        if t != t2 or len(vms) != len(durs):
            raise ValueError(f"{split}: flavor and duration lines disagree at t={t}")
        start = t if start is None else start
        end = t
        for letter, dur in zip(vms, durs, strict=True):
            lo, hi = edges[int(dur[1:])]
            departs = None if dur[0] == "C" else t - start + (lo + hi) // 2
            arrivals.append(VmArrival(t - start, letters[letter], departs))
    return VmTrace(tuple(flavors), tuple(arrivals), end - (start or 0))


def cluster_gpu_milli(nodes: Sequence[NodeView]) -> int:
    return sum(n.gpu_total_milli for n in nodes)
