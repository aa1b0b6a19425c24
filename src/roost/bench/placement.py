"""``roost bench placement``: GPU placement quality on the Alibaba openb trace.

Runs the FGD evaluation protocol (`roost.bench.fgd_protocol`) with the gateway's own
policies from `roost.decide.placement`, and sets the results beside the FGD artifact's
published means. Writes JSON, a Markdown table and a PNG of the curves.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from roost.bench import fgd_protocol, plots, report
from roost.bench.traces import (
    FGD_PUBLISHED,
    OPENB,
    PublishedCurve,
    TraceMissing,
    default_data_dir,
    load_nodes,
    load_pods,
    load_published,
)
from roost.decide.placement import POLICIES, NodeView, Policy, gpu_inventory, make_policy
from roost.decide.workload import Workload
from roost.domain.catalog import InstanceType

# Which published policy each roost policy corresponds to.
COUNTERPART = {"anycast": "Random", "dotprod": "DotProd", "pack": "BestFit", "fgd": "FGD"}
QUICK_NODE_STRIDE = 10  # --quick: every 10th node (the mix of node types survives)
QUICK_FILL = 0.9  # --quick: a trace prefix asking 90% of the small cluster's GPUs


@dataclass(frozen=True, slots=True)
class PolicySummary:
    policy: str
    seeds: tuple[int, ...]
    runs: tuple[fgd_protocol.RunResult, ...]
    seconds: float

    @property
    def at_100(self) -> float | None:
        vals = [r.at_100 for r in self.runs if r.at_100 is not None]
        return sum(vals) / len(vals) if vals else None

    def mean_curve(self) -> list[float | None]:
        out: list[float | None] = []
        for k in range(fgd_protocol.CURVE_POINTS):
            vals = [v for r in self.runs if (v := r.curve[k]) is not None]
            out.append(sum(vals) / len(vals) if vals else None)
        return out


def seeds_text(seeds: Sequence[int]) -> str:
    if len(seeds) > 1 and list(seeds) == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(map(str, seeds))


def _policy_factory(name: str, nodes: Sequence[NodeView]) -> fgd_protocol.PolicyFactory:
    """Policies as the gateway builds them: on the workload and the cluster's GPUs."""
    inventory = gpu_inventory(nodes)

    def make(workload: Workload | None) -> Policy:
        return make_policy(name, workload, inventory)

    return make


def _one_run(
    nodes: Sequence[NodeView],
    pods: Sequence[InstanceType],
    name: str,
    seed: int,
    inflation: float,
    shuffled: bool,
    online: bool,
) -> fgd_protocol.RunResult:
    return fgd_protocol.run(nodes, pods, _policy_factory(name, nodes), seed=seed,
                            inflation=inflation, shuffled=shuffled, online=online)


def resolve(path: Path, data_dir: Path) -> Path:
    """A path as given if it exists, else the openb file of that name in the data dir."""
    if path.exists():
        return path
    candidate = data_dir / OPENB / path.name
    if candidate.exists():
        return candidate
    raise TraceMissing(
        candidate,
        "Download the openb CSVs from github.com/alibaba/clusterdata, "
        "cluster-trace-gpu-v2023/csv/ (see docs/benchmarks.md), or pass --data-dir.",
    )


def quick_slice(
    nodes: Sequence[NodeView], pods: Sequence[InstanceType]
) -> tuple[list[NodeView], list[InstanceType]]:
    """A small cluster (every 10th node) and the trace prefix that asks 90% of its GPUs."""
    small = list(nodes[::QUICK_NODE_STRIDE])
    budget = QUICK_FILL * sum(n.gpu_total_milli for n in small)
    prefix: list[InstanceType] = []
    asked = 0
    for p in pods:
        if asked + p.gpu_total_milli > budget:
            break
        prefix.append(p)
        asked += p.gpu_total_milli
    return small, prefix


def run_benchmark(
    nodes: Sequence[NodeView],
    pods: Sequence[InstanceType],
    policies: Sequence[str],
    seeds: Sequence[int],
    *,
    inflation: float,
    shuffled: bool = False,
    online: bool = False,
    jobs: int = 1,
    console: Console | None = None,
) -> list[PolicySummary]:
    capacity = sum(n.gpu_total_milli for n in nodes)
    lengths = {
        s: len(fgd_protocol.arrivals(pods, cluster_gpu_milli=capacity, inflation=inflation,
                                     seed=s, shuffled=shuffled))
        for s in seeds
    }
    total = sum(lengths.values())
    runs: dict[str, list[fgd_protocol.RunResult]] = {p: [] for p in policies}
    elapsed: dict[str, float] = {p: 0.0 for p in policies}
    with Progress(
        TextColumn("{task.description:>8}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("pods"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        tasks = {p: progress.add_task(p, total=total) for p in policies}
        if jobs <= 1:
            for name in policies:
                task = tasks[name]

                def advance(n: int, task: TaskID = task) -> None:
                    progress.advance(task, n)

                for seed in seeds:
                    started = time.perf_counter()
                    res = fgd_protocol.run(
                        nodes, pods, _policy_factory(name, nodes), seed=seed,
                        inflation=inflation,
                        shuffled=shuffled, online=online, progress=advance,
                    )
                    elapsed[name] += time.perf_counter() - started
                    runs[name].append(res)
        else:
            started = time.perf_counter()
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                futures = {
                    pool.submit(_one_run, nodes, pods, name, seed, inflation, shuffled,
                                online): (name, seed)
                    for name in policies
                    for seed in seeds
                }
                for fut in as_completed(futures):
                    name, seed = futures[fut]
                    runs[name].append(fut.result())
                    progress.advance(tasks[name], lengths[seed])
                    elapsed[name] = time.perf_counter() - started
    out = []
    for name in policies:
        ordered = tuple(sorted(runs[name], key=lambda r: r.seed))
        out.append(PolicySummary(name, tuple(seeds), ordered, elapsed[name]))
    return out


def _document(
    summaries: Sequence[PolicySummary],
    published: Sequence[PublishedCurve],
    meta: dict[str, Any],
) -> dict[str, Any]:
    return {
        "benchmark": "placement",
        **meta,
        "machine": report.machine(),
        "results": [
            {
                "policy": s.policy,
                "seeds": list(s.seeds),
                "gpu_alloc_pct_at_100_arrived": s.at_100,
                "gpu_alloc_pct_at_100_arrived_by_seed": [r.at_100 for r in s.runs],
                "pods_arrived_by_seed": [r.pods for r in s.runs],
                "pods_placed_by_seed": [r.placed for r in s.runs],
                "published_counterpart": COUNTERPART.get(s.policy),
                "seconds": round(s.seconds, 2),
                "curve": s.mean_curve(),
            }
            for s in summaries
        ],
        "published": [
            {
                "policy": c.policy,
                "seeds": list(c.seeds),
                "gpu_alloc_pct_at_100_arrived": c.at(100),
                "curve": list(c.mean),
            }
            for c in published
        ],
    }


def _rows(
    summaries: Sequence[PolicySummary], published: Sequence[PublishedCurve]
) -> list[list[str]]:
    pub = {c.policy: c.at(100) for c in published}
    rows = []
    for s in summaries:
        vals = [v for r in s.runs if (v := r.at_100) is not None]
        spread = f"{min(vals):.2f} to {max(vals):.2f}" if vals else "-"
        counterpart = COUNTERPART.get(s.policy)
        theirs = pub.get(counterpart) if counterpart else None
        rows.append([
            s.policy,
            report.fmt(s.at_100),
            spread,
            counterpart or "-",
            report.fmt(theirs),
            f"{s.seconds:.0f}",
        ])
    return rows


HEADER = ["policy", "alloc % at 100% arrived (mean)", "seed range", "published as",
          "published mean", "seconds"]


def markdown(
    summaries: Sequence[PolicySummary],
    published: Sequence[PublishedCurve],
    meta: dict[str, Any],
) -> str:
    text = (
        f"### {meta['pods_file']} on {meta['nodes_file']}\n\n"
        f"{meta['nodes']} nodes, {meta['cluster_gpus']} GPUs; inflation {meta['inflation']}; "
        f"seeds {meta['seeds_text']}; pod order: {meta['order']}; "
        f"workload: {meta['workload']}.\n\n"
    )
    text += report.markdown_table(HEADER, _rows(summaries, published))
    if published:
        text += "\nPublished means at 100% arrived (FGD artifact, all its policies): "
        text += ", ".join(f"{c.policy} {report.fmt(c.at(100))}" for c in published) + ".\n"
    return text


@click.command("placement")
@click.option("--data-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Where the traces live [default: ../shared/data beside the project].")
@click.option("--nodes", "nodes_path", type=click.Path(path_type=Path),
              default=Path("openb_node_list_gpu_node.csv"), show_default=True,
              help="openb node CSV (a bare name is looked up in DATA_DIR/alibaba-openb).")
@click.option("--pods", "pods_path", type=click.Path(path_type=Path),
              default=Path("openb_pod_list_default.csv"), show_default=True,
              help="openb pod CSV (a bare name is looked up in DATA_DIR/alibaba-openb).")
@click.option("--policy", "policies", multiple=True, default=("all",), show_default=True,
              help=f"Repeatable; one of {', '.join(POLICIES)}, or 'all'.")
@click.option("--seeds", default="42-51", show_default=True, help="e.g. 42-51 or 42,43.")
@click.option("--inflation", type=float, default=1.3, show_default=True,
              help="Arrivals stop at this multiple of the cluster's GPU capacity.")
@click.option("--order", type=click.Choice(["trace", "shuffled"]), default="trace",
              show_default=True,
              help="Pod order: the README protocol (trace) or the artifact's run script "
                   "(shuffled per seed).")
@click.option("--workload", "workload_mode", type=click.Choice(["trace", "online"]),
              default="trace", show_default=True,
              help="What fgd/roost measure against: the whole pod list (as the artifact) "
                   "or only recent arrivals (as a gateway can).")
@click.option("--json", "json_out", type=click.Path(path_type=Path, dir_okay=False),
              default=None, help="Write results here, with .md and .png beside it.")
@click.option("--jobs", type=int, default=1, show_default=True,
              help="Worker processes (runs are independent per policy and seed).")
@click.option("--quick", is_flag=True,
              help="A smoke run: every 10th node, a short trace prefix, the first seed.")
def placement_command(
    data_dir: Path | None,
    nodes_path: Path,
    pods_path: Path,
    policies: tuple[str, ...],
    seeds: str,
    inflation: float,
    order: str,
    workload_mode: str,
    json_out: Path | None,
    jobs: int,
    quick: bool,
) -> None:
    """GPU placement quality: the FGD protocol on the Alibaba openb trace."""
    console = Console(stderr=True)
    data = data_dir or default_data_dir()
    try:
        names = list(POLICIES) if "all" in policies else list(dict.fromkeys(policies))
        for n in names:
            if n not in POLICIES:
                raise click.BadParameter(f"unknown policy {n!r}; known: {', '.join(POLICIES)}",
                                         param_hint="--policy")
        seed_list = report.parse_seeds(seeds)
        nodes_file = resolve(nodes_path, data)
        pods_file = resolve(pods_path, data)
        nodes = load_nodes(nodes_file)
        pods = load_pods(pods_file)
        published_file = data / FGD_PUBLISHED / "analysis_allo_discrete.csv"
        published = (
            load_published(published_file, pods_file.stem) if published_file.exists() else []
        )
    except (TraceMissing, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if quick:
        nodes, pods = quick_slice(nodes, pods)
        seed_list = seed_list[:1]
        published = []  # the published runs used the whole cluster and trace
    capacity = sum(n.gpu_total_milli for n in nodes)
    meta: dict[str, Any] = {
        "nodes_file": nodes_file.name,
        "pods_file": pods_file.name,
        "nodes": len(nodes),
        "cluster_gpus": capacity // 1000,
        "trace_pods": len(pods),
        "inflation": inflation,
        "seeds_text": seeds_text(seed_list),
        "order": order,
        "workload": workload_mode,
        "quick": quick,
    }
    started = time.perf_counter()
    summaries = run_benchmark(
        nodes, pods, names, seed_list, inflation=inflation, shuffled=order == "shuffled",
        online=workload_mode == "online", jobs=jobs, console=console,
    )
    meta["seconds_total"] = round(time.perf_counter() - started, 1)
    table = Table(title=f"GPU allocation % at 100% arrived: {pods_file.name}")
    for h in HEADER:
        table.add_column(h)
    for row in _rows(summaries, published):
        table.add_row(*row)
    Console().print(table)
    if json_out is not None:
        report.write_json(json_out, _document(summaries, published, meta))
        json_out.with_suffix(".md").write_text(markdown(summaries, published, meta))
        plots.allocation_curves(
            json_out.with_suffix(".png"),
            {s.policy: s.mean_curve() for s in summaries},
            {c.policy: list(c.mean) for c in published},
            title=f"{pods_file.stem}: seeds {meta['seeds_text']}, {order} order",
            counterparts=COUNTERPART,
        )
        console.print(f"wrote {json_out} (+ .md, .png)")
