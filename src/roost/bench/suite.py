"""``roost bench autoscale --suite``: one setting, many demand curves.

A rule tuned to one curve fails on the next, so the suite replays every curve with the
same defaults (`PlanSettings()` and `PoolSpec`'s bounds; nothing per curve) against HPA
and KEDA as `roost.bench.autoscale` models them:

- **synthetic**, generated here from a seed, per second: a 10x step up, a step down, a
  spike train (10 s bursts every 5 minutes), a sawtooth, a noisy diurnal sine, and
  on/off Poisson bursts. The defaults were chosen on these (the *tuning* set);
- the WorldCup98 busiest day (per minute, the trace's resolution): held out at first,
  it is *tuning* since the noise-weighted tasks in service and the flap guard's
  short-of-capacity condition, which were chosen while looking at it;
- the Azure LLM code-service hour at its own resolution (each request's timestamp;
  scaling to a peak keeps every request's time and draws ``Poisson(factor)`` copies of
  it within the same second): held out at first, it is *tuning* since its misses were
  read while choosing the start-up-aware capacity and the 5 s drain horizon.

What stays held out is the seed: the synthetic shapes drawn at a seed never looked at
while choosing (``--seed``; docs/autoscaling.md lists which), service times the
rules were not chosen on (``--services``), and four shapes written down after the rules
and never used to choose them (``--unseen-shapes``: a ramp and hold, flash crowds
that decay, a three-level Markov-modulated rate, heavy-tailed bursts). The suite cannot
know which seeds were looked at: ``--held-out`` says so for a run, and labels its points
(`label_held_out`).

Each curve runs at every point of a matrix: peaks (tasks/s of the busiest minute),
replica start-up times and mean service times. The default matrix is the issue's
(peaks 10 and 100, start-up 10 and 90 s, service 0.2 and 30 s) except that the
WorldCup98 day runs at peak 10 only, since a day at 100 tasks/s is 4 million tasks per
policy: ``--full`` adds it.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from roost.bench.autoscale import (
    SERVICE_SIGMA,
    SLOTS,
    TARGET_PER_REPLICA,
    SimConfig,
    Workload,
    busiest_window,
    make_policy,
    make_workload,
    measure,
    rates_per_second,
    read_demand,
    simulate,
    with_service,
)

TUNING = "tuning"
HELD_OUT = "held-out"
PEAKS = (10.0, 100.0)
STARTUPS = (10.0, 90.0)
SERVICES = (0.2, 30.0)
SLO_SECONDS = 5.0
WORKERS = (SLOTS, TARGET_PER_REPLICA)
"""The suite's workers: tasks one runs at once, outstanding tasks per replica."""
AZURE_FILE = Path("azure-llm-2023") / "AzureLLMInferenceTrace_code.csv"
WORLDCUP_FILE = Path("worldcup98") / "invocation_count.csv"


@dataclass(frozen=True, slots=True)
class Point:
    peak: float
    startup: float
    service: float
    sigma: float = SERVICE_SIGMA
    """The service times' lognormal sigma: their spread about the mean."""

    @property
    def label(self) -> str:
        spread = "" if self.sigma == SERVICE_SIGMA else f" (sigma {self.sigma:g})"
        return (f"peak {self.peak:g}/s, start-up {self.startup:g}s, "
                f"service {self.service:g}s{spread}")

    @property
    def key(self) -> tuple[float, float, float, float]:
        return (self.peak, self.startup, self.service, self.sigma)


# ------------------------------------------------------------------ synthetic shapes
# Each returns per-second rates with a peak of 1.0, from its own generator.

Shape = Callable[[np.random.Generator], npt.NDArray[np.float64]]

def step_up(rng: np.random.Generator) -> npt.NDArray[np.float64]:
    out: npt.NDArray[np.float64] = np.concatenate([np.full(20 * 60, 0.1), np.full(40 * 60, 1.0)])
    return out


def step_down(rng: np.random.Generator) -> npt.NDArray[np.float64]:
    out: npt.NDArray[np.float64] = np.concatenate([np.full(20 * 60, 1.0), np.full(40 * 60, 0.1)])
    return out


def spike_train(rng: np.random.Generator) -> npt.NDArray[np.float64]:
    r = np.full(60 * 60, 0.1)
    for start in range(150, len(r), 300):  # 10 s bursts every 5 minutes
        r[start:start + 10] = 1.0
    return r


def sawtooth(rng: np.random.Generator) -> npt.NDArray[np.float64]:
    t = np.arange(60 * 60, dtype=np.float64)
    return 0.1 + 0.9 * (t % 600) / 600


def noisy_diurnal(rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """A day compressed to two hours, with noise that holds for 10 s at a time."""
    t = np.arange(120 * 60, dtype=np.float64)
    base = 0.55 - 0.45 * np.cos(2 * math.pi * t / len(t))
    noise = np.repeat(rng.normal(1.0, 0.15, len(t) // 10 + 1), 10)[:len(t)]
    r: npt.NDArray[np.float64] = np.clip(base * noise, 0.0, None)
    return r / float(r.max())


def onoff_poisson(rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """Bursts at full rate for exponential on-times (mean 2 min) between exponential
    quiet spells at a tenth (mean 5 min)."""
    out: list[npt.NDArray[np.float64]] = []
    n, on = 0, False
    while n < 90 * 60:
        length = max(10, int(rng.exponential(120 if on else 300)))
        out.append(np.full(length, 1.0 if on else 0.1))
        n += length
        on = not on
    r: npt.NDArray[np.float64] = np.concatenate(out)[:90 * 60]
    return r


SHAPES: dict[str, Shape] = {
    "step-up-10x": step_up,
    "step-down": step_down,
    "spike-train": spike_train,
    "sawtooth": sawtooth,
    "noisy-diurnal": noisy_diurnal,
    "on-off-poisson": onoff_poisson,
}


# ------------------------------------------------------------------ unseen shapes
# Four more shapes, written down (and committed) before any rule ran on them, so that
# they stay a test of the rules rather than a set to tune on: ``--unseen-shapes``.


def ramp_hold(rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """A trapezoid: 10 min low, a 15 min linear rise to the peak, 15 min there, a 10 min
    linear fall, 10 min low."""
    out: npt.NDArray[np.float64] = np.concatenate([
        np.full(10 * 60, 0.1), np.linspace(0.1, 1.0, 15 * 60), np.full(15 * 60, 1.0),
        np.linspace(1.0, 0.1, 10 * 60), np.full(10 * 60, 0.1)])
    return out


def flash_crowd(rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """Events at exponential gaps (mean 15 min, the first after minute 5), each a jump
    to the peak that decays exponentially (time constant 1 to 4 min) over a tenth."""
    t = np.arange(90 * 60, dtype=np.float64)
    r = np.full(len(t), 0.1)
    at = 300.0 + rng.exponential(900.0)
    while at < len(t):
        tau = rng.uniform(60.0, 240.0)
        after = t >= at
        r[after] += 0.9 * np.exp(-(t[after] - at) / tau)
        at += rng.exponential(900.0)
    out: npt.NDArray[np.float64] = np.clip(r, 0.0, 1.0)
    return out


def mmpp_three(rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """A three-level Markov-modulated rate (a tenth, 0.4 and the peak): each level
    holds for an exponential time (mean 2 min, at least 10 s), then one of the other
    two follows at random."""
    levels = (0.1, 0.4, 1.0)
    out: list[npt.NDArray[np.float64]] = []
    n, state = 0, 0
    while n < 90 * 60:
        length = max(10, int(rng.exponential(120)))
        out.append(np.full(length, levels[state]))
        n += length
        state = (state + int(rng.integers(1, 3))) % 3
    r: npt.NDArray[np.float64] = np.concatenate(out)[:90 * 60]
    return r


def heavy_tailed_bursts(rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """Bursts on a base of a fifth, at exponential gaps (mean 4 min): Pareto lengths
    (shape 1.5, at least 5 s, at most 10 min), each lifting the rate to 0.5-1.0 of the
    peak; overlapping bursts add (then the whole is scaled to its own peak)."""
    r = np.full(90 * 60, 0.2)
    at = rng.exponential(240.0)
    while at < len(r):
        length = min(600, int(5 * (1 + rng.pareto(1.5))))
        start = int(at)
        r[start:start + length] += rng.uniform(0.3, 0.8)
        at += rng.exponential(240.0)
    out: npt.NDArray[np.float64] = r / float(r.max())
    return out


UNSEEN_SHAPES: dict[str, Shape] = {
    "ramp-hold": ramp_hold,
    "flash-crowd": flash_crowd,
    "mmpp-three-level": mmpp_three,
    "heavy-tailed-bursts": heavy_tailed_bursts,
}


# ------------------------------------------------------------------ curves


@dataclass(frozen=True, slots=True)
class Curve:
    name: str
    kind: str
    """TUNING or HELD_OUT."""
    resolution: str
    make: Callable[[Point, int], Workload]
    points: tuple[Point, ...]


def _synthetic(name: str) -> Callable[[Point, int], Workload]:
    def make(pt: Point, seed: int) -> Workload:
        rng = np.random.default_rng(seed)
        shape = (SHAPES.get(name) or UNSEEN_SHAPES[name])(rng)
        return make_workload(list(shape * pt.peak), service_mean=pt.service,
                             service_sigma=pt.sigma, seed=seed, resolution=1.0)
    return make


def _worldcup(path: Path) -> Callable[[Point, int], Workload]:
    counts = read_demand(path)
    start = busiest_window(counts, 1440)
    window = counts[start:start + 1440]

    def make(pt: Point, seed: int) -> Workload:
        return make_workload(rates_per_second(window, pt.peak), service_mean=pt.service,
                             service_sigma=pt.sigma, seed=seed)
    return make


def read_azure(path: Path) -> npt.NDArray[np.float64]:
    """Request times, seconds from the first."""
    times = []
    with path.open(newline="") as f:
        rows = csv.reader(f)
        next(rows)
        for row in rows:
            times.append(datetime.fromisoformat(row[0][:26]).timestamp())
    t: npt.NDArray[np.float64] = np.sort(np.asarray(times, dtype=np.float64))
    return t - float(t[0])


def _azure(path: Path) -> Callable[[Point, int], Workload]:
    times = read_azure(path)

    def make(pt: Point, seed: int) -> Workload:
        rng = np.random.default_rng(seed)
        busiest = np.bincount((times // 60).astype(np.int64)).max() / 60.0
        copies = rng.poisson(pt.peak / busiest, len(times))
        base = np.repeat(times, copies)
        jitter = rng.uniform(0.0, 1.0, len(base)) * (copies.repeat(copies) > 1)
        arrivals = np.sort(base + jitter)
        minutes = np.bincount((arrivals // 60).astype(np.int64)) / 60.0
        return with_service(arrivals, [float(x) for x in minutes], service_mean=pt.service,
                            service_sigma=pt.sigma, rng=rng)
    return make


def matrix(peaks: Sequence[float] = PEAKS) -> tuple[Point, ...]:
    return tuple(Point(p, s, d) for p in peaks for s in STARTUPS for d in SERVICES)


def unseen_curves() -> list[Curve]:
    """The unseen shapes at the suite's matrix, every point held out."""
    return [Curve(name, HELD_OUT, "1 s", _synthetic(name), matrix()) for name in UNSEEN_SHAPES]


def curves(data_dir: Path, *, full: bool) -> tuple[list[Curve], list[str]]:
    """The suite's curves, and a note for each trace that is missing."""
    out = [Curve(name, TUNING, "1 s", _synthetic(name), matrix()) for name in SHAPES]
    missing = []
    wc = data_dir / WORLDCUP_FILE
    if wc.is_file():
        out.append(Curve("worldcup98-busiest-day", TUNING, "1 min", _worldcup(wc),
                         matrix() if full else matrix((10.0,))))
    else:
        missing.append(f"{wc} not found: WorldCup98 skipped")
    az = data_dir / AZURE_FILE
    if az.is_file():
        out.append(Curve("azure-llm-code-hour", TUNING, "raw timestamps", _azure(az),
                         matrix()))
    else:
        missing.append(f"{az} not found: the Azure LLM code hour skipped")
    return out, missing


# ------------------------------------------------------------------ running


BASELINES = ("hpa", "keda")


BaselineKey = tuple[str, float, float, float, float]


def baseline_key(row: dict[str, Any]) -> BaselineKey:
    """A row's curve and point; rows written before the spread was an option have the
    suite's own."""
    return (row["curve"], float(row["peak"]), float(row["startup"]),
            float(row["service_mean"]), float(row.get("service_sigma", SERVICE_SIGMA)))


def read_baselines(path: Path, seed: int, *, slots: int = SLOTS,
                   target: int = TARGET_PER_REPLICA
                   ) -> dict[BaselineKey, dict[str, Any]]:
    """HPA's and KEDA's figures per point from an earlier ``suite.json`` of the same
    seed. Their code does not read roost's settings, and the workloads are drawn from
    the seed, so re-simulating them gives the same figures; `run_point` still checks
    each point's task count before it reuses one."""
    import json

    doc = json.loads(path.read_text())
    if doc["settings"]["seed"] != seed:
        raise ValueError(f"{path} was run with seed {doc['settings']['seed']}, not {seed}")
    ran = _workers(doc["settings"])
    if ran != (slots, target):
        raise ValueError(f"{path} was run with {ran[0]} slot{'s' if ran[0] != 1 else ''} "
                         f"a worker and a target of {ran[1]} per replica, not {slots} and "
                         f"{target}")
    return {baseline_key(r): r for r in doc["rows"]}


PHASED = ("roost", "hpa")
"""The policies the bar compares, simulated at every phase with ``--phases``."""

KEPT = ("replica_seconds", "slo_minutes_share", "tasks_killed")
"""What a phase keeps of each run: the bar's figures."""


def phases(count: int) -> tuple[float, ...]:
    """``count`` phases spread evenly over a tick, the first 0 (the grid as it falls)."""
    return tuple(i / count for i in range(count))


def run_point(curve: Curve, pt: Point, base: SimConfig, *,
              policies: Sequence[str] = ("roost", "hpa", "keda"),
              baseline: dict[str, Any] | None = None,
              at: Sequence[float] = (0.0,)) -> dict[str, Any]:
    """Every policy on one point; with ``baseline`` (the point's row of an earlier run,
    `read_baselines`), HPA's and KEDA's figures are taken from it when it holds the same
    tasks, and only the others are simulated. With more than one phase in ``at``,
    roost and HPA also run at the others, and the row keeps each phase's figures and
    their medians (`medians`): the bar is then read on those."""
    seed = base.seed
    work = curve.make(pt, seed)
    cfg = replace(base, startup=pt.startup)
    kept: dict[str, Any] = {}
    kept_phases: dict[str, Any] = {}
    if baseline is not None and baseline["tasks"] == len(work.arrivals):
        kept = {r["policy"]: r for r in baseline["results"] if r["policy"] in BASELINES}
        old = baseline.get("phases")
        if old is not None and old["at"] == list(at):
            kept_phases = {k: v for k, v in old.items() if k in BASELINES}

    def run(name: str, phase: float) -> dict[str, Any]:
        here = replace(cfg, phase=phase)
        return measure(work, simulate(work, make_policy(name, here), here), name, SLO_SECONDS)

    results = {name: kept[name] if name in kept else run(name, at[0]) for name in policies}
    hpa = results.get("hpa", {}).get("replica_seconds")
    ratio = (results["roost"]["replica_seconds"] / hpa) if hpa and "roost" in results else None
    row = {
        "curve": curve.name, "kind": curve.kind, "resolution": curve.resolution,
        "peak": pt.peak, "startup": pt.startup, "service_mean": pt.service,
        "service_sigma": pt.sigma, "tasks": len(work.arrivals),
        "demand_per_minute": [round(r, 3) for r in work.rates],
        "roost_over_hpa": None if ratio is None else round(ratio, 4),
        "results": list(results.values()),
        "reused": sorted(kept),
    }
    if len(at) > 1:
        by_phase: dict[str, Any] = {"at": list(at)}
        for name in PHASED:
            if name in kept_phases:
                by_phase[name] = kept_phases[name]
                continue
            runs = [results[name], *(run(name, phase) for phase in at[1:])]
            by_phase[name] = [{k: r[k] for k in KEPT} for r in runs]
        row["phases"] = by_phase
        row["medians"] = medians(by_phase)
        row["reused_phases"] = sorted(kept_phases)
    return row


def medians(by_phase: dict[str, Any]) -> dict[str, Any]:
    """Per policy, the median replica-seconds and SLO share over the phases and the most
    tasks killed at any; and roost's median over HPA's."""
    out: dict[str, Any] = {
        name: {"replica_seconds": statistics.median(r["replica_seconds"] for r in runs),
               "slo_minutes_share": statistics.median(r["slo_minutes_share"] for r in runs),
               "tasks_killed": max(r["tasks_killed"] for r in runs)}
        for name, runs in by_phase.items() if name in PHASED}
    hpa = out["hpa"]["replica_seconds"]
    out["roost_over_hpa"] = round(out["roost"]["replica_seconds"] / hpa, 4) if hpa else None
    return out


def bar_figures(row: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], float | None]:
    """roost's and HPA's figures the bar reads, and their replica-seconds ratio: the
    medians over the phases when the row has them, else the one run's."""
    if "medians" in row:
        m = row["medians"]
        return m["roost"], m["hpa"], m["roost_over_hpa"]
    by = {r["policy"]: r for r in row["results"]}
    return by["roost"], by["hpa"], row["roost_over_hpa"]


def ratio_text(row: dict[str, Any]) -> str:
    """roost/hpa for a label: the one run's, or with phases phase 0's (what a plot of
    its replicas shows) and the medians' (what the bar reads)."""
    if "medians" in row:
        return f"{row['roost_over_hpa']} at phase 0, {row['medians']['roost_over_hpa']} median"
    return str(row["roost_over_hpa"])


def verdict(row: dict[str, Any]) -> list[str]:
    """The issue's per-curve bar, as the misses (empty: met)."""
    roost, hpa, ratio = bar_figures(row)
    misses = []
    if roost["slo_minutes_share"] < hpa["slo_minutes_share"]:
        misses.append("SLO below HPA")
    if roost["tasks_killed"]:
        misses.append("killed tasks")
    if ratio is not None and ratio > 1.0:
        misses.append("replica-seconds above HPA")
    return misses


def geomean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


# ------------------------------------------------------------------ report


def table_rows(rows: Sequence[dict[str, Any]]) -> list[list[str]]:
    out = []
    for row in rows:
        by = {r["policy"]: r for r in row["results"]}
        ro, hp = by["roost"], by["hpa"]
        ke = by.get("keda")
        bro, bhp, ratio = bar_figures(row)
        misses = verdict(row)
        out.append([
            row["curve"] + (" (held out)" if row["kind"] == HELD_OUT else ""),
            f"{row['peak']:g}", f"{row['startup']:g}", f"{row['service_mean']:g}",
            f"{bro['replica_seconds']:.0f}", f"{bhp['replica_seconds']:.0f}",
            f"{ratio:.3f}" if ratio is not None else "-",
            f"{bro['slo_minutes_share'] * 100:.1f}", f"{bhp['slo_minutes_share'] * 100:.1f}",
            f"{ke['slo_minutes_share'] * 100:.1f}" if ke else "-",
            str(bro["tasks_killed"]), str(bhp["tasks_killed"]),
            f"{ro['scale_actions']}/{hp['scale_actions']}",
            f"{ro['direction_reversals']}/{hp['direction_reversals']}",
            f"{ro['peak_replicas']}/{hp['peak_replicas']}",
            "met" if not misses else "MISS: " + ", ".join(misses),
        ])
    return out


def label_held_out(todo: Sequence[Curve], *, every_point: bool) -> list[Curve]:
    """``todo`` as a run of data never looked at while choosing: the synthetic shapes
    (their seed is new), and with ``every_point`` (other service times, means or spread,
    or other workers) every curve (the traces' demand is the same at any seed, their
    points with those tasks or workers are not)."""
    return [replace(c, kind=HELD_OUT) if every_point or c.name in SHAPES else c
            for c in todo]


HEADER = ["curve", "peak/s", "start-up s", "service s", "roost replica-s", "hpa replica-s",
          "roost/hpa", "roost SLO %", "hpa SLO %", "keda SLO %", "roost killed",
          "hpa killed", "actions roost/hpa", "reversals roost/hpa", "peak roost/hpa",
          "verdict"]


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ratios = [(r, bar_figures(r)[2]) for r in rows]

    def gm(kind: str | None) -> float | None:
        """The geometric mean over ``kind``'s points (all: None); None without any (JSON
        has no NaN)."""
        mean = geomean([x for r, x in ratios if x is not None and kind in (None, r["kind"])])
        return None if math.isnan(mean) else round(mean, 4)
    wc = [x for r, x in ratios if r["curve"].startswith("worldcup98")]
    return {
        "points": len(rows),
        "met": sum(1 for r in rows if not verdict(r)),
        "geomean_roost_over_hpa": gm(None),
        "geomean_tuning": gm(TUNING),
        "geomean_held_out": gm(HELD_OUT),
        "worldcup98_roost_over_hpa": wc,
        "max_roost_over_hpa": max((x or 0.0) for _, x in ratios) if rows else None,
    }


def geomeans(s: dict[str, Any]) -> str:
    """A summary's geometric means, overall and for each kind of point the run has."""
    overall = s["geomean_roost_over_hpa"]
    parts = [f"{overall:.3f} overall" if overall is not None else "- overall (no point)"]
    for key, what in (("geomean_tuning", "on the tuning set"), ("geomean_held_out", "held out")):
        if s.get(key) is not None:
            parts.append(f"{s[key]:.3f} {what}")
    return ", ".join(parts)


def _kinds(settings: dict[str, Any]) -> str:
    """What of this run is tuning and what is held out, in a sentence."""
    if settings.get("unseen_shapes"):
        return ("Every point of this run is held out (--unseen-shapes): demand shapes "
                "written down after the defaults were chosen, and never used to choose them.")
    if not settings.get("held_out"):
        return ("Every point of this run is labelled tuning: the defaults were chosen on "
                "every curve at seed 42 (the synthetic shapes, WorldCup98, the Azure LLM "
                "code hour); a run at a seed or service times never looked at while "
                "choosing says so with --held-out.")
    if settings.get("services") or _spread(settings) != SERVICE_SIGMA:
        return ("Every point of this run is held out (--held-out with --services or "
                "--service-sigma): service times the defaults were not chosen on.")
    if _workers(settings) != WORKERS:
        return ("Every point of this run is held out (--held-out with --slots or "
                "--target): workers the defaults were not chosen on.")
    return ("The synthetic shapes of this run are held out (--held-out): drawn at a seed "
            "never looked at while choosing; WorldCup98 and the Azure LLM code hour, whose "
            "demand is the same at any seed, stay tuning.")


def _workers(settings: dict[str, Any]) -> tuple[int, int]:
    """A run's slots per worker and target per replica (a run that does not say: the
    suite's)."""
    return (int(settings.get("slots", SLOTS)),
            int((settings.get("pool") or {}).get("target_per_replica", TARGET_PER_REPLICA)))


def _spread(settings: dict[str, Any]) -> float:
    """A run's service-time sigma (runs written before it was an option: the suite's)."""
    return float(settings.get("service_sigma", SERVICE_SIGMA))


def markdown(doc: dict[str, Any]) -> str:
    from roost.bench.report import markdown_table

    s = doc["summary"]
    text = ["# roost bench autoscale --suite", "",
            f"Defaults for every curve: `{doc['settings']}`.",
            f"SLO: a minute meets it when its tasks' p99 queue wait is at most "
            f"{doc['slo_seconds']:g} s. {_kinds(doc['settings'])}", "",
            markdown_table(HEADER, table_rows(doc["rows"])), "",
            f"Met the bar on {s['met']} of {s['points']} points. Geometric mean of "
            f"roost/hpa replica-seconds: {geomeans(s)}.", ""]
    services = doc["settings"].get("services")
    if services:
        text += [f"Service times {', '.join(f'{x:g} s' for x in services)} instead of the "
                 "suite's: points outside the matrix the rules were chosen on.", ""]
    sigma = _spread(doc["settings"])
    if sigma != SERVICE_SIGMA:
        text += [f"Service times spread with a lognormal sigma of {sigma:g} instead of the "
                 f"suite's {SERVICE_SIGMA:g} (`--service-sigma`): the same means, "
                 "points outside the matrix the rules were chosen on.", ""]
    slots, target = _workers(doc["settings"])
    if (slots, target) != WORKERS:
        text += [f"Workers run {slots} task{'s' if slots != 1 else ''} at once, sized at "
                 f"{target} outstanding per replica, instead of the suite's "
                 f"{SLOTS} and {TARGET_PER_REPLICA} (`--slots`, "
                 "`--target`): points outside the matrix the rules were chosen on.", ""]
    own = doc["settings"]["pool"].get("scale_down_window")
    if own is not None:
        text += [f"roost's pool has its own scale-down window of {own} s "
                 "(`--pool-down-window`), an operator's choice for one pool: not the "
                 "defaults the bar is read on.", ""]
    at = doc["settings"].get("phases") or [0.0]
    if len(at) > 1:
        text += [f"Phases: roost and HPA each ran every point with its first tick at "
                 f"{len(at)} places within its tick ({', '.join(f'{x:g}' for x in at)} of "
                 "it): replica-seconds, SLO shares, roost/hpa and the verdict are the "
                 "medians over them (killed: the most at any); KEDA's figures, actions, "
                 "reversals and peaks are phase 0's.", ""]
    if doc.get("baselines"):
        text += [f"Baselines: {doc['baselines']}.", ""]
    if doc.get("missing"):
        text += ["Missing: " + "; ".join(doc["missing"]), ""]
    return "\n".join(text)


def plot_curve(path: Path, rows: Sequence[dict[str, Any]], *, title: str) -> None:
    """One figure per curve: a panel per matrix point with demand, roost's and HPA's
    replicas per minute."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(rows)
    cols = 2 if n > 1 else 1
    nrows = math.ceil(n / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(7 * cols, 2.6 * nrows), squeeze=False)
    for ax, row in zip(axes.flat, rows, strict=False):
        demand = row["demand_per_minute"]
        xs = [m / 60.0 for m in range(len(demand))]
        ax2 = ax.twinx()
        ax2.fill_between(xs, demand, color="0.85", step="post", label="demand")
        ax2.set_ylabel("tasks/s", fontsize=7)
        for r in row["results"]:
            if r["policy"] in ("roost", "hpa"):
                ys = r["replicas_per_minute"]
                ax.step(xs[:len(ys)], ys, where="post", lw=1.1, label=r["policy"])
        ax.set_zorder(ax2.get_zorder() + 1)
        ax.patch.set_visible(False)
        ax.set_title(f"{row['peak']:g}/s, start-up {row['startup']:g}s, service "
                     f"{row['service_mean']:g}s: roost/hpa {ratio_text(row)}", fontsize=8)
        ax.set_ylabel("replicas", fontsize=7)
        ax.tick_params(labelsize=7)
        ax2.tick_params(labelsize=7)
        ax.legend(loc="upper left", fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.supxlabel("hours")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
