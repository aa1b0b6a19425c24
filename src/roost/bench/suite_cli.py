"""Running the suite from the command line: progress, the table, the files."""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from roost.bench.autoscale import SimConfig
from roost.bench.report import machine, write_json
from roost.bench.suite import (
    HEADER,
    SLO_SECONDS,
    curves,
    markdown,
    plot_curve,
    read_baselines,
    run_point,
    summary,
    table_rows,
)
from roost.decide.snapshot import PlanSettings, PoolSpec

MAX_REPLICAS = 5000
"""Room for the largest point (peak 100/s x 30 s service = 3000 tasks in service)."""


def run_suite(data_dir: Path, out_dir: Path, *, full: bool, seed: int,
              only: set[str] | None, peaks: set[float] | None = None,
              baselines: Path | None = None) -> dict[str, Any]:
    console = Console(stderr=True)
    kept = {}
    if baselines is not None:
        try:
            kept = read_baselines(baselines, seed)
        except (OSError, ValueError, KeyError) as exc:
            raise click.ClickException(f"--baselines {baselines}: {exc}") from None
    todo, missing = curves(data_dir, full=full)
    if only:
        unknown = only - {c.name for c in todo}
        if unknown:
            raise click.ClickException(f"no such curve: {', '.join(sorted(unknown))}")
        todo = [c for c in todo if c.name in only]
    if peaks:
        todo = [replace(c, points=tuple(p for p in c.points if p.peak in peaks))
                for c in todo]
        todo = [c for c in todo if c.points]
    for note in missing:
        console.print(f"[yellow]{note}[/]")
    base = SimConfig(min_replicas=1, max_replicas=MAX_REPLICAS, seed=seed)
    rows = []
    total = sum(len(c.points) for c in todo)
    started = time.monotonic()
    for c in todo:
        mine = []
        for pt in c.points:
            t = time.monotonic()
            row = run_point(c, pt, base,
                            baseline=kept.get((c.name, pt.peak, pt.startup, pt.service)))
            mine.append(row)
            rows.append(row)
            console.print(f"[{len(rows)}/{total}] {c.name} ({c.kind}), {pt.label}: roost/hpa "
                          f"{row['roost_over_hpa']} ({time.monotonic() - t:.0f}s)")
        plot_curve(out_dir / f"{c.name}.png", mine, title=f"{c.name} ({c.kind}, {c.resolution})")
    spec = PoolSpec("bench", 1, MAX_REPLICAS, base.target_per_replica, 500, 512, 1)
    doc: dict[str, Any] = {
        "slo_seconds": SLO_SECONDS,
        "settings": {
            "plan": asdict(PlanSettings()),
            "pool": {k: getattr(spec, k) for k in ("target_per_replica", "growth_replicas",
                                                  "growth_percent", "disruption_replicas",
                                                  "disruption_percent")},
            "slots": base.slots, "roost_interval": base.interval, "seed": seed,
            "full": full, "peaks": sorted(peaks) if peaks else None,
        },
        "machine": machine(),
        "seconds": round(time.monotonic() - started, 1),
        "missing": missing,
        "rows": rows,
    }
    reused = sum(1 for r in rows if r["reused"])
    if reused:
        doc["baselines"] = (
            f"hpa and keda figures of {reused} of {len(rows)} points reused from "
            f"{baselines} (same seed, same task count per point; their code reads none of "
            "roost's settings); roost re-simulated on every point")
    doc["summary"] = summary(rows)
    write_json(out_dir / "suite.json", doc)
    (out_dir / "suite.md").write_text(markdown(doc))
    table = Table(title="roost bench autoscale --suite")
    for col in HEADER:
        table.add_column(col)
    for r in table_rows(rows):
        table.add_row(*r)
    out = Console()
    out.print(table)
    s = doc["summary"]
    out.print(f"met {s['met']}/{s['points']}; geometric mean roost/hpa "
              f"{s['geomean_roost_over_hpa']:.3f} (tuning {s['geomean_tuning']:.3f}, held out "
              f"{s['geomean_held_out']:.3f}); results in {out_dir}")
    return doc
