"""Smoke runs of ``roost bench autoscale``.

The ``--quick`` run replays a per-minute curve generated in the WorldCup98 format
(tests/traces.py), and the real curve too when ../shared/data is beside the project
(skipped otherwise). The synthetic step run needs no file at all.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from roost.bench.autoscale import (
    EPOCH,
    POLICIES,
    POOL,
    WORLDCUP98,
    WORLDCUP_FILE,
    Pool,
    RoostPolicy,
    SimConfig,
    autoscale,
    make_workload,
    run,
    simulate,
)
from roost.bench.suite import UNSEEN_SHAPES, curves, label_held_out
from roost.bench.traces import default_data_dir
from roost.decide.plan import plan
from tests.traces import write_traces

METRICS = ("queue_wait_p50", "queue_wait_p99", "slo_minutes_share", "replica_seconds",
           "scale_actions", "direction_reversals", "tasks_killed")


@pytest.mark.parametrize("source", ["generated", "shared"])
def test_quick_autoscale_on_worldcup98(source: str, tmp_path: Path) -> None:
    data = write_traces(tmp_path / "traces") if source == "generated" else default_data_dir()
    if not (data / WORLDCUP98 / WORLDCUP_FILE).is_file():
        pytest.skip(f"no WorldCup98 curve under {data} (docs/benchmarks.md says where)")
    out = tmp_path / "autoscale.json"
    result = CliRunner().invoke(autoscale, ["--data-dir", str(data), "--quick",
                                            "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    by = {r["policy"]: r for r in doc["results"]}
    assert list(by) == list(POLICIES)
    for r in by.values():
        for name in METRICS:
            assert name in r, (r["policy"], name)
        assert r["tasks"] > 0
        assert r["tasks_served"] == r["tasks"]
        assert 0 <= r["slo_minutes_share"] <= 1
        assert r["replica_seconds"] > 0
    assert by["roost"]["tasks_killed"] == 0
    assert doc["roost_over_hpa_replica_seconds"] is not None
    assert out.with_suffix(".md").is_file() and out.with_suffix(".png").is_file()
    assert doc["settings"]["phase"] == 0.0

    # --phase: the same curve with every policy's tick grid shifted within its tick
    shifted = tmp_path / "shifted.json"
    result = CliRunner().invoke(autoscale, ["--data-dir", str(data), "--quick", "--phase",
                                            "0.5", "--policy", "hpa", "--json", str(shifted)])
    assert result.exit_code == 0, result.output
    doc2 = json.loads(shifted.read_text())
    assert doc2["settings"]["phase"] == 0.5
    assert doc2["results"][0]["tasks"] == by["hpa"]["tasks"]
    # HPA samples the queue at other moments: its figures are not phase 0's
    assert doc2["results"][0]["replica_seconds"] != by["hpa"]["replica_seconds"]
    for bad in ("1", "-0.1", "half"):
        refused = CliRunner().invoke(autoscale, ["--data-dir", str(data), "--quick",
                                                 "--phase", bad])
        assert refused.exit_code == 2 and "--phase" in refused.output, (bad, refused.output)


def test_synthetic_step_demand_needs_no_data() -> None:
    """A low-high-low step: every policy serves every task, roost grows for the step,
    shrinks after it through drained workers only, and kills nothing."""
    rates = [1.0] * 3 + [8.0] * 4 + [0.5] * 10
    cfg = SimConfig(slots=2, target_per_replica=2, startup=20.0, seed=7)
    results = run(rates, POLICIES, cfg, service_mean=1.0, service_sigma=0.5, slo_seconds=5.0)
    by = {r["policy"]: r for r in results}
    for r in results:
        assert r["tasks_served"] == r["tasks"] > 0
        for name in METRICS:
            assert name in r
    roost = by["roost"]
    assert roost["tasks_killed"] == 0
    reps = roost["replicas_per_minute"]
    assert max(reps[3:8]) > reps[0]  # scaled up for the step
    assert reps[-1] < max(reps)  # and back down after it
    assert roost["scale_actions"] >= 2


def test_hpa_rules_tolerance_stabilization_and_scale_up_limit() -> None:
    from roost.bench.autoscale import HpaPolicy

    cfg = SimConfig(target_per_replica=2)
    hpa = HpaPolicy(cfg, lag_only=False)
    assert hpa.desired(10, 0, 21) == 10  # ratio 1.05: within the 0.1 tolerance
    assert hpa.desired(10, 10, 20) == 15
    assert hpa.desired(10, 0, 4) == 2
    keda = HpaPolicy(cfg, lag_only=True)
    assert keda.desired(10, 3, 100) == 2  # the lag alone: ceil(3 / 2)

    class FakePool:
        def __init__(self) -> None:
            self.now, self.target, self.load = 0.0, 10, (0, 20)

        def outstanding(self) -> tuple[int, int]:
            return self.load

        def scale_to(self, n: int) -> None:
            self.target = n

    pool = FakePool()
    hpa.tick(pool)  # type: ignore[arg-type]
    pool.now, pool.load = 15.0, (0, 2)
    hpa.tick(pool)  # type: ignore[arg-type]
    assert pool.target == 10  # scale-down held by the 300 s stabilization
    pool.now = 316.0
    hpa.tick(pool)  # type: ignore[arg-type]
    assert pool.target == 1
    pool.now, pool.load = 331.0, (200, 0)
    hpa.tick(pool)  # type: ignore[arg-type]
    assert pool.target == 5  # at most max(+100 %, +4) per sync


def _suite(out: Path, args: list[str]) -> dict[str, Any]:
    """``roost bench autoscale`` with ``args`` into ``out``, which must succeed; its
    JSON."""
    result = CliRunner().invoke(autoscale, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads((out / "suite.json").read_text())
    return doc


def test_the_suite_runs_a_chosen_curve_at_chosen_peaks(tmp_path: Path) -> None:
    """``--suite --only --peaks``: one curve at peak 10 (its four points), every
    policy, the JSON, the table and the plot; no trace needed."""
    out = tmp_path / "suite"
    doc = _suite(out, [
        "--suite", "--data-dir", str(tmp_path / "none"), "--only", "spike-train",
        "--peaks", "10"])
    assert [(r["curve"], r["peak"]) for r in doc["rows"]] == [("spike-train", 10.0)] * 4
    assert doc["summary"]["points"] == 4 and doc["settings"]["peaks"] == [10.0]
    for row in doc["rows"]:
        assert [r["policy"] for r in row["results"]] == list(POLICIES)
        assert row["results"][0]["tasks_killed"] == 0
    assert (out / "suite.md").is_file() and (out / "spike-train.png").is_file()
    bad = CliRunner().invoke(autoscale, ["--suite", "--peaks", "ten", "--out", str(out)])
    assert bad.exit_code == 2 and "--peaks" in bad.output

    # --baselines: HPA's and KEDA's figures reused where a point holds the same tasks,
    # roost simulated again (and, being deterministic, the same)
    assert {r["kind"] for r in doc["rows"]} == {"tuning"}
    assert doc["summary"]["geomean_held_out"] is None  # no point of that kind: no NaN
    assert "Every point of this run is labelled tuning" in (out / "suite.md").read_text()
    doc["rows"][0]["tasks"] += 1  # as if its workload had changed: simulated again
    base = tmp_path / "base.json"
    base.write_text(json.dumps(doc))
    again = tmp_path / "again"
    doc2 = _suite(again, [
        "--suite", "--data-dir", str(tmp_path / "none"), "--only", "spike-train",
        "--peaks", "10", "--baselines", str(base), "--held-out"])
    assert [r["reused"] for r in doc2["rows"]] == [[]] + [["hpa", "keda"]] * 3
    assert "3 of 4 points reused" in doc2["baselines"]
    assert [r["results"] for r in doc2["rows"]] == [r["results"] for r in doc["rows"]]
    # --held-out: the synthetic shape labelled so, and summed apart
    assert {r["kind"] for r in doc2["rows"]} == {"held-out"}
    assert doc2["summary"]["geomean_held_out"] == doc2["summary"]["geomean_roost_over_hpa"]
    assert doc2["summary"]["geomean_tuning"] is None
    assert doc2["settings"]["held_out"] is True
    assert "spike-train (held out)" in (again / "suite.md").read_text()
    other = CliRunner().invoke(autoscale, [
        "--suite", "--data-dir", str(tmp_path / "none"), "--only", "spike-train",
        "--peaks", "10", "--seed", "7", "--out", str(again), "--baselines", str(base)])
    assert other.exit_code == 1 and "seed 42, not 7" in other.output


def test_the_suite_runs_service_times_outside_its_matrix(tmp_path: Path) -> None:
    """``--services``: the chosen curve's peaks and start-ups with other tasks, every
    policy, said in the JSON and the Markdown; bad lists refused as usage errors."""
    out = tmp_path / "suite"
    doc = _suite(out, [
        "--suite", "--data-dir", str(tmp_path / "none"), "--only", "spike-train",
        "--peaks", "10", "--services", "2,0.5"])
    assert sorted((r["startup"], r["service_mean"]) for r in doc["rows"]) == [
        (10.0, 0.5), (10.0, 2.0), (90.0, 0.5), (90.0, 2.0)]
    assert doc["settings"]["services"] == [0.5, 2.0]
    for row in doc["rows"]:
        assert [r["policy"] for r in row["results"]] == list(POLICIES)
        assert row["tasks"] > 0 and row["roost_over_hpa"] > 0
    assert "Service times 0.5 s, 2 s instead of the suite's" in (out / "suite.md").read_text()
    for bad in ("two", "0", "-1,2", "inf", ","):
        refused = CliRunner().invoke(autoscale, ["--suite", "--services", bad,
                                                 "--out", str(out)])
        assert refused.exit_code == 2 and "--services" in refused.output, (bad, refused.output)


def test_the_suite_runs_another_spread_of_service_times(tmp_path: Path) -> None:
    """``--service-sigma``: the same curves, means and arrivals with the service times
    spread otherwise; recorded per row and in the settings, every point held out with
    --held-out, and an earlier run at another spread never reused as a baseline."""
    args = ["--suite", "--data-dir", str(tmp_path / "none"), "--only", "step-up-10x",
            "--peaks", "10"]
    usual = _suite(tmp_path / "usual", args)
    assert usual["settings"]["service_sigma"] == 0.6
    assert {r["service_sigma"] for r in usual["rows"]} == {0.6}
    fixed = _suite(tmp_path / "fixed", [
        *args, "--service-sigma", "0", "--held-out",
        "--baselines", str(tmp_path / "usual" / "suite.json")])
    assert fixed["settings"]["service_sigma"] == 0.0
    assert {(r["service_sigma"], r["kind"]) for r in fixed["rows"]} == {(0.0, "held-out")}
    assert [r["reused"] for r in fixed["rows"]] == [[]] * 4 and "baselines" not in fixed
    # the same arrivals: only how long each task runs differs
    assert [r["tasks"] for r in fixed["rows"]] == [r["tasks"] for r in usual["rows"]]
    assert [r["results"] for r in fixed["rows"]] != [r["results"] for r in usual["rows"]]
    text = (tmp_path / "fixed" / "suite.md").read_text()
    assert "lognormal sigma of 0 instead of the suite's 0.6" in text
    assert "Every point of this run is held out" in text
    # a run at the same spread is reused
    again = _suite(tmp_path / "again", [
        *args, "--service-sigma", "0", "--baselines", str(tmp_path / "fixed" / "suite.json")])
    assert [r["reused"] for r in again["rows"]] == [["hpa", "keda"]] * 4
    traced = CliRunner().invoke(autoscale, [
        "--data-dir", str(tmp_path / "none"), "--trace", "step-up-10x:10:10:0.2",
        "--trace-between", "0:0", "--service-sigma", "1.5"])
    assert traced.exit_code == 0 and "service 0.2s (sigma 1.5), seed 42" in traced.output
    for bad in ("-0.1", "nan", "4.5", "wide"):
        refused = CliRunner().invoke(autoscale, [*args, "--service-sigma", bad,
                                                 "--out", str(tmp_path / "bad")])
        assert refused.exit_code == 2 and "--service-sigma" in refused.output, refused.output


def test_the_suite_runs_other_workers(tmp_path: Path) -> None:
    """``--slots --target``: every policy's workers run that many tasks at once, sized
    at that many outstanding per replica; said in the settings and the Markdown, every
    point held out with --held-out, and a baseline run with other workers refused."""
    base = ["--suite", "--data-dir", str(tmp_path / "none"), "--only", "step-up-10x",
            "--peaks", "10"]
    args = [*base, "--slots", "1", "--target", "1", "--held-out"]
    doc = _suite(tmp_path / "one", args)
    assert doc["settings"]["slots"] == 1 and doc["settings"]["pool"]["target_per_replica"] == 1
    assert {r["kind"] for r in doc["rows"]} == {"held-out"}
    text = (tmp_path / "one" / "suite.md").read_text()
    assert "Workers run 1 task at once, sized at 1 outstanding per replica" in text
    assert "Every point of this run is held out (--held-out with --slots" in text
    # one task a replica: at peak 10 with 30 s tasks, about 300 replicas at the top,
    # where the suite's workers (4 slots, 3 per replica) need about 100
    top = max(r["results"][0]["peak_replicas"] for r in doc["rows"])
    assert top >= 250, top
    again = _suite(tmp_path / "again", [*args, "--baselines",
                                        str(tmp_path / "one" / "suite.json")])
    assert [r["reused"] for r in again["rows"]] == [["hpa", "keda"]] * 4
    other = CliRunner().invoke(autoscale, [
        *base, "--out", str(tmp_path / "other"),
        "--baselines", str(tmp_path / "one" / "suite.json")])
    assert other.exit_code == 1 and "was run with 1 slot a worker and a target of 1 per " \
        "replica, not 4 and 3" in other.output, other.output
    for bad in (["--slots", "0"], ["--target", "0"], ["--slots", "two"]):
        refused = CliRunner().invoke(autoscale, [*base, *bad,
                                                 "--out", str(tmp_path / "bad")])
        assert refused.exit_code == 2 and bad[0] in refused.output, refused.output


def test_trace_prints_the_plan_at_every_tick_of_one_point(tmp_path: Path) -> None:
    """``--trace``: one point under roost alone, a line per tick within the window with
    the decision and its reason, the demand model's steps under it, then the figures."""
    result = CliRunner().invoke(autoscale, [
        "--data-dir", str(tmp_path / "none"), "--trace", "step-up-10x:10:10:0.2",
        "--trace-between", "100:150"])
    assert result.exit_code == 0, result.output
    ticks = [line for line in result.output.splitlines() if line.startswith("t=")]
    assert [int(re.match(r"t=\s*(\d+)s", line)[1]) for line in ticks] == [  # type: ignore[index]
        100, 110, 120, 130, 140, 150]
    assert all("replicas 1 -> 1:" in line for line in ticks), ticks
    assert "load = max(arrivals x service, in service)" in result.output
    assert "step-up-10x peak 10/s, start-up 10s, service 0.2s, seed 42: SLO minutes " \
        in result.output and "killed 0" in result.output
    # then the minutes that missed the SLO, roost's and HPA's (none on this point)
    assert "roost: minutes whose p99 wait is above 5s (minute, p99): none" in result.output
    assert re.search(r"hpa: minutes whose p99 wait is above 5s \(minute, p99\): none; "
                     r"replica-seconds \d+", result.output), result.output
    # --phase moves the tick grid: the first tick at 10 s x 1.5, then every 10 s
    phased = CliRunner().invoke(autoscale, [
        "--data-dir", str(tmp_path / "none"), "--trace", "step-up-10x:10:10:0.2",
        "--trace-between", "100:150", "--phase", "0.5"])
    assert phased.exit_code == 0, phased.output
    assert [int(re.match(r"t=\s*(\d+)s", line)[1])  # type: ignore[index]
            for line in phased.output.splitlines() if line.startswith("t=")] == [
        105, 115, 125, 135, 145]
    assert "service 0.2s, seed 42, phase 0.5: SLO minutes" in phased.output
    # a point with misses lists each minute with its p99 wait, every one above the SLO
    spiky = CliRunner().invoke(autoscale, [
        "--data-dir", str(tmp_path / "none"), "--trace", "spike-train:100:10:0.2",
        "--trace-between", "0:0"])
    assert spiky.exit_code == 0, spiky.output
    for who in ("roost", "hpa"):
        line = next(x for x in spiky.output.splitlines() if x.startswith(f"{who}: minutes"))
        listed = re.findall(r"(\d+) \((\d+\.\d)s\)", line.split("(minute, p99): ")[1])
        assert listed and all(float(p99) > 5.0 for _, p99 in listed), line
        assert len({m for m, _ in listed}) == len(listed) and all(
            0 <= int(m) < 60 for m, _ in listed), line
    for args, code, text in (
            (["--trace", "step-up-10x:10:10"], 2, "curve:peak:startup:service"),
            (["--trace", "step-up-10x:0:10:0.2"], 2, "must be above 0"),
            (["--trace", "step-up-10x:10:10:nan"], 2, "must be above 0"),
            (["--trace", "step-up-10x:inf:10:0.2"], 2, "all finite"),
            (["--trace", "step-up-10x:10:10:0.2", "--trace-between", "9:1"], 2, "after TO"),
            (["--trace", "nope:10:10:0.2"], 1, "no such curve: nope")):
        bad = CliRunner().invoke(autoscale, ["--data-dir", str(tmp_path / "none"), *args])
        assert bad.exit_code == code and text in bad.output, bad.output


def test_held_out_labels_the_seeded_shapes_and_with_other_services_every_curve() -> None:
    """A trace's demand is the same at any seed, so a new seed holds out only the
    synthetic shapes; service times never chosen on hold out every curve."""
    [shape, *_] = [c for c in curves(Path("/nonexistent"), full=False)[0]]
    azure = replace(shape, name="azure-llm-code-hour")
    assert [c.kind for c in label_held_out([shape, azure], every_point=False)] == [
        "held-out", "tuning"]
    assert [c.kind for c in label_held_out([shape, azure], every_point=True)] == [
        "held-out", "held-out"]


def test_phases_read_the_bar_on_medians_over_where_the_tick_grid_falls(
        tmp_path: Path) -> None:
    """``--phases``: the spike train's bursts start on multiples of 300 s, which HPA's
    15 s sync grid meets at phase 0 exactly as each burst begins (it sees none of
    them at peak 10 with 0.5 s tasks); at other phases it does. The bar is read on the
    medians, and a re-run with ``--baselines`` reuses HPA's phases."""
    out = tmp_path / "phased"
    args = ["--suite", "--data-dir", str(tmp_path / "none"), "--only", "spike-train",
            "--peaks", "10", "--services", "0.5", "--phases", "3"]
    doc = _suite(out, args)
    assert doc["settings"]["phases"] == pytest.approx([0, 1 / 3, 2 / 3])
    row = doc["rows"][0]
    hpa = [r["replica_seconds"] for r in row["phases"]["hpa"]]
    assert hpa[0] == next(r for r in row["results"] if r["policy"] == "hpa")["replica_seconds"]
    assert len(set(hpa)) > 1  # where the grid falls matters here
    assert row["medians"]["hpa"]["replica_seconds"] == sorted(hpa)[1]
    ratio = row["medians"]["roost"]["replica_seconds"] / sorted(hpa)[1]
    assert row["medians"]["roost_over_hpa"] == pytest.approx(ratio, abs=1e-4)
    assert doc["summary"]["geomean_roost_over_hpa"] == pytest.approx(
        (row["medians"]["roost_over_hpa"] * doc["rows"][1]["medians"]["roost_over_hpa"])
        ** 0.5, abs=1e-4)
    assert "Phases: roost and HPA each ran every point" in (out / "suite.md").read_text()

    again = tmp_path / "again"
    doc2 = _suite(again, [*args, "--baselines", str(out / "suite.json")])
    assert [r["reused_phases"] for r in doc2["rows"]] == [["hpa"], ["hpa"]]
    assert [r["medians"] for r in doc2["rows"]] == [r["medians"] for r in doc["rows"]]
    bad = CliRunner().invoke(autoscale, [*args, "--phases", "0", "--out", str(again)])
    assert bad.exit_code == 2 and "--phases" in bad.output


def test_unseen_shapes_run_apart_from_the_suite_and_are_held_out(tmp_path: Path) -> None:
    """``--unseen-shapes``: the four shapes the defaults were never chosen on, instead
    of the suite's curves, each point labelled held out; each shape is a per-second
    rate whose peak is 1.0, the same at the same seed; ``--trace`` finds them too."""
    for name, make in UNSEEN_SHAPES.items():
        a, b = make(np.random.default_rng(5)), make(np.random.default_rng(5))
        assert np.array_equal(a, b), name
        assert len(a) >= 60 * 60 and a.max() == pytest.approx(1.0), name
        assert a.min() >= 0.05 and a.min() < 0.5, name  # a low level as well as the peak
    out = tmp_path / "unseen"
    doc = _suite(out, [
        "--suite", "--unseen-shapes", "--only", "ramp-hold", "--peaks", "10"])
    assert {(r["curve"], r["kind"]) for r in doc["rows"]} == {("ramp-hold", "held-out")}
    assert len(doc["rows"]) == 4 and doc["settings"]["unseen_shapes"] is True
    assert doc["summary"]["geomean_held_out"] == doc["summary"]["geomean_roost_over_hpa"]
    assert "(--unseen-shapes)" in (out / "suite.md").read_text()
    wrong = CliRunner().invoke(autoscale, ["--suite", "--unseen-shapes", "--only",
                                           "sawtooth", "--out", str(out)])
    assert wrong.exit_code == 1 and "no such curve: sawtooth" in wrong.output
    alone = CliRunner().invoke(autoscale, ["--unseen-shapes", "--phases", "3"])
    assert alone.exit_code == 2 and "--unseen-shapes, --phases only with --suite" in alone.output
    traced = CliRunner().invoke(autoscale, [
        "--data-dir", str(tmp_path / "none"), "--trace", "flash-crowd:10:10:0.2",
        "--trace-between", "0:30"])
    assert traced.exit_code == 0, traced.output
    assert "flash-crowd peak 10/s" in traced.output


def test_a_pools_own_scale_down_window_in_the_bench(tmp_path: Path) -> None:
    """``--pool-down-window``: roost's pool holds its size for that window (the
    reasons say so), the suite records it and says it is an operator's choice, not
    the defaults; out of HPA's range it is a usage error."""
    args = ["--data-dir", str(tmp_path / "none"), "--trace", "spike-train:100:10:0.2",
            "--trace-between", "170:260"]
    own = CliRunner().invoke(autoscale, [*args, "--pool-down-window", "300"])
    assert own.exit_code == 0, own.output
    assert re.search(r"stabilization: demand 1 < \d+ not yet held for 300s", own.output)
    plain = CliRunner().invoke(autoscale, args)
    assert "not yet held for 300s" not in plain.output
    assert "not yet held for 60s" in plain.output
    out = tmp_path / "suite"
    doc = _suite(out, [
        "--suite", "--data-dir", str(tmp_path / "none"), "--only", "step-down",
        "--peaks", "10", "--pool-down-window", "120"])
    assert doc["settings"]["pool"]["scale_down_window"] == 120
    assert "its own scale-down window of 120 s" in (out / "suite.md").read_text()
    bad = CliRunner().invoke(autoscale, [*args, "--pool-down-window", "3601"])
    assert bad.exit_code == 2 and "--pool-down-window" in bad.output


def test_a_change_of_leader_reads_back_the_reads_the_old_one_made() -> None:
    """``--failover-every``: a new leader in the simulation reads the arrivals back from
    the tasks as the controller does, and gets the arrival reads the old leader made,
    read for read (the service and burst figures are within a bucket's alignment)."""
    rates = [2.0, 2.0, 9.0, 1.0, 9.0, 4.0, 6.0, 2.0] * 3
    cfg = SimConfig(slots=2, target_per_replica=2, startup=20.0, seed=3,
                    failover_every=1e9)  # keeps the completions; never changes leader
    work = make_workload(rates, service_mean=0.5, service_sigma=0.6, seed=3)
    compared: list[int] = []

    class Checked(RoostPolicy):
        def tick(self, pool: Pool) -> None:
            super().tick(pool)
            if pool.now > 1240 and len(compared) < 15:
                now = EPOCH + pool.now
                fresh = RoostPolicy(cfg)
                fresh.history = self.history
                fresh.new_leader(pool, now)  # then its first tick, on the same read
                new = plan(fresh.snapshot(pool, now), fresh.history, now=now,
                           settings=fresh.settings).history[POOL].estimates
                old = self.history[POOL].estimates
                assert [x for pair in new.arrivals for x in pair] == pytest.approx(
                    [x for pair in old.arrivals for x in pair])
                assert [t for t, _ in new.rates] == pytest.approx([t for t, _ in old.rates])
                assert new.startup == old.startup and new.startup_remembered
                assert new.service == pytest.approx(old.service, rel=0.05)
                compared.append(len(new.arrivals))

    simulate(work, Checked(cfg), cfg)
    assert len(compared) == 15 and min(compared) > 4


def test_failover_every_changes_the_leader_of_a_trace(tmp_path: Path) -> None:
    """With the arrivals read back, a change of leader every 300 s leaves a spike train's
    SLO as it was; without, each new leader has seen too few bursts to hold room for
    the next (docs/benchmarks.md has the suite's figures)."""
    def share(*args: str) -> float:
        result = CliRunner().invoke(autoscale, [
            "--data-dir", str(tmp_path / "none"), "--trace", "spike-train:100:90:0.2",
            "--trace-between", "0:0", *args])
        assert result.exit_code == 0, result.output
        found = re.search(r"SLO minutes ([\d.]+) %", result.output)
        assert found, result.output
        return float(found[1])

    steady = share()
    assert share("--failover-every", "300") >= steady
    assert share("--failover-every", "300", "--no-read-back") < steady
    bad = CliRunner().invoke(autoscale, ["--data-dir", str(tmp_path / "none"),
                                         "--no-read-back", "--quick"])
    assert bad.exit_code == 2 and "--no-read-back only with --failover-every" in bad.output
