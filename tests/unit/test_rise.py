"""A sustained rise of the arrival rate (`roost.decide.demand.rise`): read on window
means of a ramp, never on one step or burst, wherever it falls against the reads; what
the plan does with it (the slots for the rate ahead, the backlog's projection, the
scale-down it holds)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import pytest

from roost.decide.demand import RISE_WINDOWS, Estimates, carried, rise, size
from roost.decide.snapshot import Demand, PlanSettings
from tests.unit.test_plan_helpers import NOW, SETTINGS, held, pool, run, snap, spec, worker

S = PlanSettings()


def _reads(rate: Callable[[float], float], until: float, every: float = 10.0
           ) -> tuple[tuple[float, float], ...]:
    """Noise-free reads of the rate window's mean every ``every`` seconds up to
    ``until``: what the controller reads with no Poisson noise."""
    w = S.rate_window
    out = []
    t = every
    while t <= until + 1e-9:
        mean = sum(rate(t - w + (k + 0.5) * 0.5) for k in range(int(w / 0.5))) / (w / 0.5)
        out.append((t, mean))
        t += every
    return tuple(out)


@pytest.mark.parametrize("span", [10.0, 30.0, 90.0])
def test_a_ramp_is_read_once_enough_spans_show_it(span: float) -> None:
    # 0.5/s per second: a span's rise (15/s or more) clears two standard errors of
    # two 30 s window means up to 360/s (9.8/s there)
    def ramp(t: float) -> float:
        return 10.0 + 0.5 * max(0.0, t)

    span_read = max(span, S.rate_window)
    first = RISE_WINDOWS * span_read + S.rate_window  # reads reach back that far
    for until in range(300, 700, 10):
        got = rise(_reads(ramp, until), float(until), span, S)
        assert got is not None, until
        slope, reads = got
        assert slope == pytest.approx(0.5, rel=1e-6)
        assert len(reads) == RISE_WINDOWS + 1
    assert rise(_reads(ramp, first - 40), first - 40, span, S) is None


@pytest.mark.parametrize("span", [10.0, 30.0, 90.0])
@pytest.mark.parametrize("length", [5.0, 10.0, 40.0, 70.0, 1e9])  # 1e9: a step up
def test_one_burst_or_step_is_never_a_rise(span: float, length: float) -> None:
    for start in range(100, 400, 3):
        def burst(t: float, start: float = start) -> float:
            return 100.0 if start <= t < start + length else 10.0

        reads = _reads(burst, 800)
        for k in range(len(reads)):
            assert rise(reads[:k + 1], reads[k][0], span, S) is None, (start, reads[k][0])


def test_a_rise_within_the_noise_is_not_read() -> None:
    # 0.01/s per second at 50/s: 0.9/s over 90 s, under two standard errors of two
    # 30 s means (about 3.7/s)
    reads = _reads(lambda t: 50.0 + 0.01 * t, 600)
    assert rise(reads, 600.0, 90.0, S) is None


def test_only_the_newest_read_now_counts() -> None:
    reads = _reads(lambda t: 10.0 + 0.15 * t, 600)
    assert rise(reads, 610.0, 90.0, S) is None  # no read at this tick
    assert rise((), 600.0, 90.0, S) is None


def _ramp_reads(slope: float, rate_now: float, *, seconds: float = 400.0,
                until: float = NOW) -> tuple[tuple[float, float], ...]:
    """Reads every 10 s up to ``until`` of a rate rising ``slope`` per second to
    ``rate_now``."""
    n = int(seconds // 10)
    return tuple((until - 10 * k, rate_now - slope * 10 * k) for k in range(n, -1, -1))


def _flat_reads(rate: float, *, until: float = NOW) -> tuple[tuple[float, float], ...]:
    return tuple((until - 10 * k, rate) for k in range(40, -1, -1))


# a pool of 0.2 s tasks on one-slot workers sized at one task a replica, 90 s start-ups
EST = Estimates(service=0.2, service_at=NOW, startup=90.0)
QUEUED = Demand(20, 12, arrival_rate=60.0, service_time=0.2)


def test_a_sustained_rise_sizes_the_slots_for_the_rate_a_replica_asked_now_meets() -> None:
    rising = replace(EST, arrivals=_ramp_reads(0.15, 60.0))
    got = size(QUEUED, rising, replicas=14, target=1, s=S, now=NOW, slots=1)
    # the window's mean lags by half a window; the replica serves a start-up on
    ahead = 60.0 + 0.15 * (S.rate_window / 2 + 90.0)
    need = carried(ahead * 0.2, 1, 1)
    assert need > ahead * 0.2  # one-slot workers queue: more replicas than Erlangs
    assert got.rising == math.ceil(need - 1e-9)
    assert got.effective >= got.rising, got.explain
    assert any(line.startswith("a sustained rise: the rate read at least 90s apart")
               for line in got.explain), got.explain
    assert any(line.startswith("slots for the rise: the fewest replicas of 1 slots each")
               for line in got.explain), got.explain
    assert any(line.startswith(f"carried = the slots for the rise, {got.rising} tasks")
               for line in got.explain), got.explain
    # the same pool with the rate flat at 60/s: no rise, no room for it, a smaller size
    flat = size(QUEUED, replace(EST, arrivals=_flat_reads(60.0)), replicas=14, target=1,
                s=S, now=NOW, slots=1)
    assert flat.rising == 0 and flat.effective < got.effective
    assert not any("sustained rise" in line for line in flat.explain)


def test_without_the_workers_slots_a_rise_only_projects_the_backlog() -> None:
    # 13 replicas clear 65/s at the target: at the rate read now (60/s) they clear the
    # 20 queued within the start-up; at the mean rate until a new replica serves (60 +
    # 0.15 x (30 + 90) / 2 = 69/s) they clear none of them
    rising = replace(EST, arrivals=_ramp_reads(0.15, 60.0))
    got = size(QUEUED, rising, replicas=13, target=1, s=S, now=NOW, slots=None)
    flat = size(QUEUED, replace(EST, arrivals=_flat_reads(60.0)), replicas=13, target=1,
                s=S, now=NOW, slots=None)
    assert got.rising == 0 and flat.rising == 0
    assert got.overdue == 20 and flat.overdue == 0.0, (got.explain, flat.explain)
    assert got.effective > flat.effective
    assert any("slots for the rise: no worker reported its slots" in line
               for line in got.explain)


def test_a_sustained_rise_holds_a_scale_down() -> None:
    s = replace(SETTINGS, scale_down_window=30.0)
    ws = [replace(worker(f"p-w{i}"), slots=1) for i in range(20)]
    inputs = replace(pool(spec(target_per_replica=1, max_replicas=40), running=10,
                          replicas=20, workers=ws),
                     demand=Demand(0, 10, arrival_rate=50.0, service_time=0.2))
    # demand has been below 20 replicas for the window, and the rate rises 0.15/s per
    # second: the reads kept end one tick before NOW, the plan adds NOW's own
    est = replace(EST, arrivals=_ramp_reads(0.15, 50.0 - 1.5, until=NOW - 10))
    hist = replace(held(10), estimates=est)
    p = run(snap(inputs), {"p": hist}, settings=s).pool("p")
    ahead = 50.0 + 0.15 * (S.rate_window / 2 + 90.0)
    room = math.ceil(carried(ahead * 0.2, 1, 1) - 1e-9)
    assert 10 < room < 20
    assert p.desired_replicas == room, p.reason
    assert f"a sustained rise keeps {room}" in p.reason, p.reason
    # the same pool with the rate flat: it scales down to what the load needs
    calm = replace(hist, estimates=replace(EST, arrivals=_flat_reads(50.0, until=NOW - 10)))
    q = run(snap(inputs), {"p": calm}, settings=s).pool("p")
    assert q.desired_replicas < room, q.reason


def _observed(est: Estimates, rate: Callable[[float], float], ticks: range) -> Estimates:
    """``est`` after the plan's reads at ``NOW - k`` for ``k`` in ``ticks`` (seconds),
    the arrival rate at each from ``rate``: the history `rise` reads, kept as the plan
    keeps it."""
    for k in ticks:
        t = NOW - k
        est = est.observe(Demand(0, 10, arrival_rate=rate(t), service_time=0.2,
                                 completed=100), None, t, S)
    return est


def _ramp(t: float) -> float:
    return 10.0 + 0.5 * (t - NOW + 600)  # 0.5/s per second, 10/s at 600 s before NOW


@pytest.mark.parametrize("startup", [90.0, 91.0, 93.0, 41.0, 30.5, 60.2])
def test_the_history_kept_reaches_back_to_every_read_a_rise_picks(startup: float) -> None:
    # each pick lands up to a tick further back than a whole start-up: a start-up that
    # is not a whole number of ticks needs that tick kept too
    est = _observed(Estimates(service=0.2, service_at=NOW, startup=startup), _ramp,
                    range(600, -1, -10))
    got = rise(est.arrivals, NOW, startup, S)
    assert got is not None
    assert got[0] == pytest.approx(0.5)
    oldest = min(t for t, _ in est.arrivals)
    assert oldest >= NOW - RISE_WINDOWS * (startup + 2 * S.interval) - S.interval


def test_a_replica_starting_longer_than_the_estimate_keeps_the_rise_read() -> None:
    # the estimate says 30 s, a replica has been starting 120 s: the reads a rise picks
    # are the estimate's span apart (the history was kept for it), and the rate ahead
    # is read over the 120 s the start-up is at least
    est = _observed(Estimates(service=0.2, service_at=NOW, startup=30.0,
                              starting_since=(NOW - 120,)), _ramp, range(600, -1, -10))
    demand = Demand(20, 12, arrival_rate=_ramp(NOW), service_time=0.2)
    got = size(demand, est, replicas=14, target=1, s=S, now=NOW, slots=1)
    assert got.rising > 0, got.explain
    ahead = _ramp(NOW) + 0.5 * (S.rate_window / 2 + 120.0)
    assert got.rising == math.ceil(carried(ahead * 0.2, 1, 1) - 1e-9)
    assert any(line.startswith("a sustained rise: the rate read at least 30s apart")
               for line in got.explain), got.explain


def test_no_noise_bound_turns_the_read_off() -> None:
    # headroom_sigmas 0 turns the headroom off; without a noise bound any three rises
    # in a row would count, so it turns the read of a rise off too
    reads = _reads(lambda t: 10.0 + 0.5 * t, 600)
    assert rise(reads, 600.0, 90.0, S) is not None
    assert rise(reads, 600.0, 90.0, replace(S, headroom_sigmas=0.0)) is None
