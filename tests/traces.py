"""Small generated traces in the upstream formats the benchmarks read (no tests here).

The benchmarks replay public traces that live outside the repository (../shared/data, or
a ``--data-dir``; docs/benchmarks.md says where each comes from). So that ``make test``
passes on a fresh clone with nothing beside it, the smoke tests run on traces written
here into a tmp dir: same folder and file names, same columns and line syntax, a few
hundred rows of seeded random data shaped like the real thing. They exercise the loaders
and the ``--quick`` paths; the figures only the real traces give stay benchmarks.

Formats (docs/benchmarks.md links each upstream):

- ``alibaba-openb/``: ``openb_node_list_gpu_node.csv`` (``sn,cpu_milli,memory_mib,gpu,
  model``) and ``openb_pod_list_default.csv`` (``name,cpu_milli,memory_mib,num_gpu,
  gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time``), and
  ``openb_pod_list_gpuspec20.csv``, the same pods with GPU model sets (``V100M32|T4``).
- ``fgd-published/analysis_allo_discrete.csv``: ``workload,sc_policy,tune,seed,
  total_gpus,0..130``, GPU allocation % per % of capacity arrived.
- ``azure-v1/``: ``flav_map.txt`` (``<vcpus>,<GiB> <letter>``), ``v1.interval_map.txt``
  (``<seconds> <bin>``), ``v1.test.txt`` (``<t> <letters, | between batches>``) and the
  parallel ``v1.test.c2591400.txt`` (``U<bin>`` finished, ``C<bin>`` still running).
- ``worldcup98/invocation_count.csv``: ``period,count`` per minute.
"""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta
from pathlib import Path

NODE_SHAPES = [  # (model, GPUs, cpu_milli, memory_mib, share of the nodes)
    ("V100M32", 8, 96000, 786432, 0.2),
    ("P100", 2, 64000, 262144, 0.3),
    ("T4", 2, 96000, 524288, 0.3),
    ("G2", 8, 128000, 786432, 0.1),
    ("A10", 1, 128000, 1048576, 0.1),
]
GPU_SHARES = [1000, 1000, 1000, 500, 460, 250, 200, 100]
"""``gpu_milli`` of one-GPU pods: whole GPUs most often, then the usual fractions."""
FLAVORS = ["1,0.75 a", "1,1.75 b", "1,2 c", "2,4 d", "2,8 e", "4,8 f", "4,16 g", "8,32 h",
           "8,56 i", "16,112 j"]
POLICIES = ["01-Random", "02-DotProd", "03-GpuClustering", "04-GpuPacking", "05-BestFit",
            "06-FGD"]


def write_traces(root: Path, *, seed: int = 7) -> Path:
    """Write every generated trace under ``root`` (a data dir) and return ``root``."""
    rng = random.Random(seed)
    write_openb(root, rng)
    write_fgd_published(root, rng)
    write_azure_v1(root, rng)
    write_worldcup98(root, rng)
    return root


def write_openb(root: Path, rng: random.Random, *, nodes: int = 600, pods: int = 600) -> None:
    """Enough nodes that ``--quick`` (every 10th node) keeps some 200 GPUs: the curve has a
    point at every 1% of arrived load, as the real trace gives."""
    d = root / "alibaba-openb"
    d.mkdir(parents=True, exist_ok=True)
    rows = ["sn,cpu_milli,memory_mib,gpu,model"]
    for i in range(nodes):
        model, gpus, cpu, mem, _ = rng.choices(NODE_SHAPES, [s[4] for s in NODE_SHAPES])[0]
        rows.append(f"openb-node-{i:04d},{cpu},{mem},{gpus},{model}")
    (d / "openb_node_list_gpu_node.csv").write_text("\n".join(rows) + "\n")
    rows = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
            "creation_time,deletion_time,scheduled_time"]
    t = 0
    for i in range(pods):
        kind = rng.random()
        if kind < 0.1:
            num_gpu, milli = 0, 0
        elif kind < 0.85:
            num_gpu, milli = 1, rng.choice(GPU_SHARES)
        else:
            num_gpu, milli = rng.choice([2, 2, 4, 8]), 1000
        cpu = rng.choice([1000, 2000, 4000, 6000, 8000, 12000, 16000])
        mem = cpu * rng.choice([1, 2, 4]) * 1024 // 1000
        t += rng.randrange(1, 3600)
        rows.append(f"openb-pod-{i:04d},{cpu},{mem},{num_gpu},{milli},,LS,Running,"
                    f"{t},{t + rng.randrange(60, 10**6)},{t}")
    (d / "openb_pod_list_default.csv").write_text("\n".join(rows) + "\n")
    (d / "openb_pod_list_gpuspec20.csv").write_text("\n".join(with_gpu_specs(rows)) + "\n")


def with_gpu_specs(rows: list[str], *, share: float = 0.2, seed: int = 20) -> list[str]:
    """The pod list with about ``share`` of its GPU pods constrained to GPU models, as
    ``openb_pod_list_gpuspec20`` is: one model, or several joined by ``|`` (any will
    do; upstream repeats a model now and then, so this does too)."""
    rng = random.Random(seed)
    models = [m for m, *_ in NODE_SHAPES]
    out = rows[:1]
    for row in rows[1:]:
        cols = row.split(",")
        if cols[3] != "0" and rng.random() < share:
            picked = rng.sample(models, rng.choice([1, 1, 2, 3]))
            if rng.random() < 0.1:
                picked.append(picked[-1])
            cols[5] = "|".join(picked)
        out.append(",".join(cols))
    return out


def write_fgd_published(root: Path, rng: random.Random) -> None:
    """Rising, saturating curves for each published policy and two seeds."""
    d = root / "fgd-published"
    d.mkdir(parents=True, exist_ok=True)
    rows = ["workload,sc_policy,tune,seed,total_gpus," + ",".join(map(str, range(131)))]
    for rank, policy in enumerate(POLICIES):
        top = 86 + 1.8 * rank
        for seed in (42, 43):
            curve = [min(float(k), top - rng.random()) for k in range(131)]
            rows.append(f"openb_pod_list_default,{policy},1.3,{seed},0,"
                        + ",".join(f"{v:.2f}" for v in curve))
    (d / "analysis_allo_discrete.csv").write_text("\n".join(rows) + "\n")


def write_azure_v1(root: Path, rng: random.Random, *, bins: int = 800) -> None:
    """``bins`` 300 s bins of a few VMs each (more than ``--quick``'s 4,000 VMs), with the
    lifetimes' log-spaced duration bins and a censored tail, as the processed trace has."""
    d = root / "azure-v1"
    d.mkdir(parents=True, exist_ok=True)
    (d / "flav_map.txt").write_text("\n".join(FLAVORS) + "\n")
    edges = [0, 300, 600, 900, 1800, 3600, 7200, 14400, 28800, 86400, 172800, 345600]
    lines = []
    for b in range(len(edges) - 1):
        lines += [f"{s} {b}" for s in range(edges[b], edges[b + 1], 300)]
    (d / "v1.interval_map.txt").write_text("\n".join(lines) + "\n")
    letters = [f.split()[1] for f in FLAVORS]
    arrivals, lifetimes = [], []
    for k in range(bins):
        t = 2_100_000 + 300 * k
        vms, durs = [], []
        for _ in range(rng.randrange(1, 5)):  # tenants' batches, each closed by "|"
            flavor = rng.choice(letters[:8]) if rng.random() < 0.95 else rng.choice(letters)
            for _ in range(rng.choice([1, 1, 1, 2, 3, 8])):
                vms.append(flavor)
                b = min(int(rng.expovariate(0.4)), len(edges) - 2)
                durs.append(("C" if rng.random() < 0.05 else "U") + str(b))
            vms.append("|")
            durs.append("|")
        arrivals.append(f"{t} {','.join(vms)}")
        lifetimes.append(f"{t} {','.join(durs)}")
    (d / "v1.test.txt").write_text("\n".join(arrivals) + "\n")
    (d / "v1.test.c2591400.txt").write_text("\n".join(lifetimes) + "\n")


def write_worldcup98(root: Path, rng: random.Random, *, days: int = 2) -> None:
    """Per-minute requests: a daily cycle, noise and one match-time spike ~20x the mean."""
    d = root / "worldcup98"
    d.mkdir(parents=True, exist_ok=True)
    start = datetime(1998, 4, 30, 21, 30)
    rows = ["period,count"]
    for m in range(days * 1440):
        base = 400 + 300 * math.sin(2 * math.pi * m / 1440)
        spike = 12000 if 1500 <= m < 1590 else 0
        count = max(0, int(base + spike + rng.gauss(0, 40)))
        rows.append(f"{start + timedelta(minutes=m):%Y-%m-%d %H:%M:%S},{count}")
    (d / "invocation_count.csv").write_text("\n".join(rows) + "\n")
