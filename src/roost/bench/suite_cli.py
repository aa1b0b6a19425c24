"""Running the suite from the command line: progress, the table, the files."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from roost.bench.autoscale import (
    SERVICE_SIGMA,
    SLOTS,
    TARGET_PER_REPLICA,
    RoostPolicy,
    SimConfig,
    make_policy,
    measure,
    minute_p99s,
    simulate,
)
from roost.bench.report import machine, write_json
from roost.bench.suite import (
    HEADER,
    SLO_SECONDS,
    WORKERS,
    Point,
    curves,
    geomeans,
    label_held_out,
    markdown,
    phases,
    plot_curve,
    ratio_text,
    read_baselines,
    run_point,
    summary,
    table_rows,
    unseen_curves,
)
from roost.decide.plan import Plan
from roost.decide.snapshot import PlanSettings, PoolSpec, Snapshot

MAX_REPLICAS = 5000
"""Room for the largest point (peak 100/s x 30 s service = 3000 tasks in service)."""


def suite_config(seed: int, *, pool_down_window: int | None, slots: int,
                 target: int, failover_every: float | None = None,
                 read_back: bool = True) -> SimConfig:
    """The simulation every policy runs in, for a suite run and a trace alike (each
    point sets its own start-up)."""
    return SimConfig(min_replicas=1, max_replicas=MAX_REPLICAS, seed=seed,
                     pool_down_window=pool_down_window, slots=slots,
                     target_per_replica=target, failover_every=failover_every,
                     read_back=read_back)


def run_suite(data_dir: Path, out_dir: Path, *, full: bool, seed: int,
              only: set[str] | None, peaks: set[float] | None = None,
              services: set[float] | None = None,
              baselines: Path | None = None, held_out: bool = False,
              phase_count: int = 1, unseen: bool = False,
              pool_down_window: int | None = None,
              service_sigma: float = SERVICE_SIGMA, slots: int = SLOTS,
              target: int = TARGET_PER_REPLICA, failover_every: float | None = None,
              read_back: bool = True) -> dict[str, Any]:
    console = Console(stderr=True)
    kept = {}
    if baselines is not None:
        try:
            kept = read_baselines(baselines, seed, slots=slots, target=target)
        except (OSError, ValueError, KeyError) as exc:
            raise click.ClickException(f"--baselines {baselines}: {exc}") from None
    todo, missing = ((unseen_curves(), []) if unseen else curves(data_dir, full=full))
    if only:
        unknown = only - {c.name for c in todo}
        if unknown:
            raise click.ClickException(f"no such curve: {', '.join(sorted(unknown))}")
        todo = [c for c in todo if c.name in only]
    if peaks:
        todo = [replace(c, points=tuple(p for p in c.points if p.peak in peaks))
                for c in todo]
        todo = [c for c in todo if c.points]
    if services:  # points outside the matrix: the same peaks and start-ups, other tasks
        todo = [replace(c, points=tuple(dict.fromkeys(
            Point(p.peak, p.startup, s) for p in c.points for s in sorted(services))))
            for c in todo]
    if service_sigma != SERVICE_SIGMA:  # the same means, spread otherwise
        todo = [replace(c, points=tuple(replace(p, sigma=service_sigma) for p in c.points))
                for c in todo]
    if held_out:
        todo = label_held_out(todo, every_point=bool(services)
                              or service_sigma != SERVICE_SIGMA
                              or (slots, target) != WORKERS)
    for note in missing:
        console.print(f"[yellow]{note}[/]")
    base = suite_config(seed, pool_down_window=pool_down_window, slots=slots, target=target,
                        failover_every=failover_every, read_back=read_back)
    at = phases(phase_count)
    rows = []
    total = sum(len(c.points) for c in todo)
    started = time.monotonic()
    for c in todo:
        mine = []
        for pt in c.points:
            t = time.monotonic()
            row = run_point(c, pt, base, at=at,
                            baseline=kept.get((c.name, *pt.key)))
            mine.append(row)
            rows.append(row)
            console.print(f"[{len(rows)}/{total}] {c.name} ({c.kind}), {pt.label}: roost/hpa "
                          f"{ratio_text(row)} ({time.monotonic() - t:.0f}s)")
        plot_curve(out_dir / f"{c.name}.png", mine, title=f"{c.name} ({c.kind}, {c.resolution})")
    spec = PoolSpec("bench", 1, MAX_REPLICAS, base.target_per_replica, 500, 512, 1,
                    scale_down_window=pool_down_window)
    doc: dict[str, Any] = {
        "slo_seconds": SLO_SECONDS,
        "settings": {
            "plan": asdict(PlanSettings()),
            "pool": {k: getattr(spec, k) for k in ("target_per_replica", "growth_replicas",
                                                  "growth_percent", "disruption_replicas",
                                                  "disruption_percent",
                                                  "scale_down_window")},
            "slots": base.slots, "roost_interval": base.interval, "seed": seed,
            "full": full, "peaks": sorted(peaks) if peaks else None,
            "services": sorted(services) if services else None,
            "service_sigma": service_sigma,
            "held_out": held_out, "unseen_shapes": unseen, "phases": list(at),
            **({} if failover_every is None else
               {"roost_failover_every": failover_every, "roost_read_back": read_back}),
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
    out.print(f"met {s['met']}/{s['points']}; geometric mean roost/hpa: {geomeans(s)}; "
              f"results in {out_dir}")
    return doc


def parse_point(text: str) -> tuple[str, Point]:
    """``curve:peak:startup:service``, e.g. ``sawtooth:100:90:0.2``."""
    parts = text.split(":")
    try:
        if len(parts) != 4:
            raise ValueError
        peak, startup, service = (float(x) for x in parts[1:])
    except ValueError:
        raise click.BadParameter(f"{text!r} is not curve:peak:startup:service "
                                 "(e.g. sawtooth:100:90:0.2)", param_hint="--trace") from None
    if not (0 < peak < math.inf and 0 <= startup < math.inf and 0 < service < math.inf):
        raise click.BadParameter(f"{text!r}: the peak and the service time must be above 0, "
                                 "the start-up at least 0, all finite", param_hint="--trace")
    return parts[0], Point(peak, startup, service)


def trace_point(data_dir: Path, *, seed: int, point: str,
                between: tuple[float, float] | None = None,
                phase: float = 0.0, pool_down_window: int | None = None,
                service_sigma: float = SERVICE_SIGMA, slots: int = SLOTS,
                target: int = TARGET_PER_REPLICA, failover_every: float | None = None,
                read_back: bool = True) -> dict[str, Any]:
    """Replay one point of the suite under roost and print the plan at every tick (what
    `/status` shows a live controller's operator: demand, the decision and its reason,
    the demand model's steps), from ``between[0]`` to ``between[1]`` seconds; then the
    minutes that missed the SLO, roost's and HPA's (simulated at the same ``phase``)."""
    name, pt = parse_point(point)
    pt = replace(pt, sigma=service_sigma)
    todo, missing = curves(data_dir, full=True)
    todo += unseen_curves()
    found = [c for c in todo if c.name == name]
    if not found:
        hint = f" ({'; '.join(missing)})" if missing else ""
        raise click.ClickException(
            f"no such curve: {name} (one of {', '.join(c.name for c in todo)}){hint}")
    base = suite_config(seed, pool_down_window=pool_down_window, slots=slots, target=target,
                        failover_every=failover_every, read_back=read_back)
    work = found[0].make(pt, seed)
    cfg = replace(base, startup=pt.startup, phase=phase)
    lo, hi = between if between is not None else (0.0, float("inf"))

    def show(t: float, snap: Snapshot, p: Plan) -> None:
        if not lo <= t <= hi:
            return
        pool, d = p.pools[0], snap.pools[0].demand
        demand = "demand not read" if d is None else (
            f"queued {d.queued} running {d.running} rate "
            f"{d.arrival_rate if d.arrival_rate is not None else float('nan'):.3g}/s")
        # plain echo, not rich: reasons are text, never markup, and lines stay whole
        click.echo(f"t={t:7.0f}s {demand} replicas {pool.current_replicas} -> "
                   f"{pool.desired_replicas}: {pool.reason}")
        for line in pool.sizing:
            click.echo(f"           {line}")

    pool = simulate(work, RoostPolicy(cfg, on_plan=show), cfg)
    r = measure(work, pool, "roost", SLO_SECONDS)
    at = f", phase {phase:g}" if phase else ""
    click.echo(f"{name} {pt.label}, seed {seed}{at}: SLO minutes "
               f"{r['slo_minutes_share'] * 100:.1f} %, replica-seconds "
               f"{r['replica_seconds']:.0f}, peak replicas {r['peak_replicas']}, "
               f"killed {r['tasks_killed']}")
    hpa = simulate(work, make_policy("hpa", cfg), cfg)
    for who, p in (("roost", pool), ("hpa", hpa)):
        missed = [f"{m} ({w:.1f}s)" for m, w in minute_p99s(work, p) if w > SLO_SECONDS]
        click.echo(f"{who}: minutes whose p99 wait is above {SLO_SECONDS:g}s (minute, p99): "
                   + (", ".join(missed) if missed else "none")
                   + ("" if who == "roost" else
                      f"; replica-seconds {p.replica_seconds:.0f}"))
    return r
