"""``roost bench vm-trace``: VM placement with departures on the Azure V1 trace.

Per policy and host shape: the fewest identical hosts that serve the whole test split
with zero rejections (binary search, `roost.bench.vm_sim`), and at the demand peak on
that many hosts: empty hosts, and CPU and memory stranded (free, but on a host whose
other resource fits no flavor). Writes JSON, a Markdown table and a PNG.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from roost.bench import plots, report
from roost.bench.traces import TraceMissing, VmTrace, default_data_dir, load_azure
from roost.bench.vm_sim import (
    Outcome,
    find_peak,
    flavor_types,
    lower_bound,
    min_hosts,
    peak_state,
    replay,
)
from roost.decide.placement import POLICIES, make_policy
from roost.decide.workload import Workload
from roost.domain.resources import Resources, parse_quantity

QUICK_ARRIVALS = 4000


def _pct(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 3) if whole else 0.0


def run_policy(
    trace: VmTrace,
    policy_name: str,
    host: Resources,
    host_text: str,
    *,
    seed: int,
    progress: Progress,
) -> dict[str, Any]:
    types = flavor_types(trace)
    workload = Workload.from_requests(types[a.flavor] for a in trace.arrivals)
    policy = make_policy(policy_name, workload)
    peak = find_peak(trace, types)
    bound = lower_bound(peak, host)
    task = progress.add_task(f"{policy_name} @ {host_text}", total=None)

    def served(count: int) -> Outcome:
        progress.update(task, description=f"{policy_name} @ {host_text}: {count} hosts")
        out, _ = replay(trace, types, policy, host=host, count=count, seed=seed,
                        tick=lambda n: progress.advance(task, n))
        return out

    started = time.perf_counter()
    search = min_hosts(served, lower=bound)
    _, cluster = replay(trace, types, policy, host=host, count=search.min_hosts, seed=seed,
                        stop_at=peak.index)
    state = peak_state(cluster, types)
    seconds = time.perf_counter() - started
    progress.update(task, description=f"{policy_name} @ {host_text}: {search.min_hosts} hosts",
                    total=1, completed=1)
    return {
        "policy": policy_name,
        "host": host_text,
        "min_hosts_zero_rejections": search.min_hosts,
        "lower_bound_hosts": bound,
        "over_lower_bound_pct": _pct(search.min_hosts - bound, bound),
        "tried": [{"hosts": o.hosts, "rejected": o.rejected > 0,
                   "first_rejection": o.first_rejection} for o in search.tried],
        "peak": {
            **dataclasses.asdict(peak),
            "empty_hosts": state.empty_hosts,
            "stranded_cpu_pct": _pct(state.stranded_cpu_milli, state.cluster_cpu_milli),
            "stranded_mem_pct": _pct(state.stranded_mem_mib, state.cluster_mem_mib),
            "free_cpu_on_used_hosts_pct": _pct(state.cpu_free_milli, state.cluster_cpu_milli),
            "free_mem_on_used_hosts_pct": _pct(state.mem_free_mib, state.cluster_mem_mib),
        },
        "seconds": round(seconds, 1),
    }


HEADER = ["policy", "host", "min hosts (0 rejections)", "lower bound", "over bound %",
          "empty hosts at peak", "stranded CPU %", "stranded mem %", "free CPU % (used hosts)",
          "free mem % (used hosts)"]


def _rows(results: Sequence[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for r in results:
        p = r["peak"]
        rows.append([
            r["policy"], r["host"], str(r["min_hosts_zero_rejections"]),
            str(r["lower_bound_hosts"]), report.fmt(r["over_lower_bound_pct"]),
            str(p["empty_hosts"]), report.fmt(p["stranded_cpu_pct"]),
            report.fmt(p["stranded_mem_pct"]), report.fmt(p["free_cpu_on_used_hosts_pct"]),
            report.fmt(p["free_mem_on_used_hosts_pct"]),
        ])
    return rows


def check_flavors_fit(trace: VmTrace, host: Resources, host_text: str) -> None:
    for t in flavor_types(trace):
        if not host.covers(t.resources):
            raise click.ClickException(
                f"flavor {t.name} ({t.cpu_milli // 1000} vCPU, {t.mem_mib} MiB) does not fit "
                f"an empty {host_text} host; no host count serves the trace"
            )


@click.command("vm-trace")
@click.option("--data-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Where the traces live [default: ../shared/data beside the project].")
@click.option("--host", "hosts_text", multiple=True, default=("64vcpu,512GiB",),
              show_default=True, help="Host shape, repeatable, e.g. 48vcpu,128GiB.")
@click.option("--policy", "policies", multiple=True, default=("all",), show_default=True,
              help=f"Repeatable; one of {', '.join(POLICIES)}, or 'all'.")
@click.option("--split", type=click.Choice(["train", "dev", "test"]), default="test",
              show_default=True)
@click.option("--seed", type=int, default=42, show_default=True,
              help="For anycast's random choices.")
@click.option("--json", "json_out", type=click.Path(path_type=Path, dir_okay=False),
              default=None, help="Write results here, with .md and .png beside it.")
@click.option("--quick", is_flag=True, help=f"A smoke run: the first {QUICK_ARRIVALS} VMs.")
def vm_trace_command(
    data_dir: Path | None,
    hosts_text: tuple[str, ...],
    policies: tuple[str, ...],
    split: str,
    seed: int,
    json_out: Path | None,
    quick: bool,
) -> None:
    """VM placement with departures: fewest hosts for zero rejections on Azure V1."""
    console = Console(stderr=True)
    data = data_dir or default_data_dir()
    names = list(POLICIES) if "all" in policies else list(dict.fromkeys(policies))
    for n in names:
        if n not in POLICIES:
            raise click.BadParameter(f"unknown policy {n!r}; known: {', '.join(POLICIES)}",
                                     param_hint="--policy")
    censor = {"train": 1800000, "dev": 2100000, "test": 2591400}[split]
    try:
        shapes = [(h, parse_quantity(h)) for h in hosts_text]
        trace = load_azure(data, split=split, censor=censor)
    except (TraceMissing, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if quick:
        trace = dataclasses.replace(trace, arrivals=trace.arrivals[:QUICK_ARRIVALS])
    for text, host in shapes:
        check_flavors_fit(trace, host, text)
    started = time.perf_counter()
    results = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed} VMs"),
                  TimeElapsedColumn(), console=console) as progress:
        for text, host in shapes:
            for name in names:
                results.append(run_policy(trace, name, host, text, seed=seed, progress=progress))
    table = Table(title=f"Azure V1 {split}: fewest hosts with zero rejections")
    for h in HEADER:
        table.add_column(h)
    for row in _rows(results):
        table.add_row(*row)
    Console().print(table)
    if json_out is not None:
        doc = {
            "benchmark": "vm-trace",
            "split": split,
            "vms": len(trace.arrivals),
            "trace_seconds": trace.end,
            "quick": quick,
            "seed": seed,
            "seconds_total": round(time.perf_counter() - started, 1),
            "machine": report.machine(),
            "results": results,
        }
        report.write_json(json_out, doc)
        md = (f"### Azure V1 {split} split: {len(trace.arrivals)} VMs over "
              f"{trace.end / 86400:.1f} days\n\n")
        json_out.with_suffix(".md").write_text(md + report.markdown_table(HEADER, _rows(results)))
        for text, _ in shapes:
            mine = {r["policy"]: r["min_hosts_zero_rejections"] for r in results
                    if r["host"] == text}
            bound = next(r["lower_bound_hosts"] for r in results if r["host"] == text)
            suffix = "" if len(shapes) == 1 else "-" + text.replace(",", "-")
            plots.host_bars(json_out.with_name(json_out.stem + suffix + ".png"), mine,
                            lower_bound=bound, title=f"Azure V1 {split}, hosts of {text}")
        console.print(f"wrote {json_out} (+ .md, .png)")
