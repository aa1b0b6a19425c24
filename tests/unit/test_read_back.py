"""A new leader's estimates read back from the task table (`Estimates.read_back`): the
same reads a leader reading all along would have made, from tasks counted by age."""

from __future__ import annotations

import math
import random

import pytest

from roost.decide.demand import Estimates, read_back_span, rise, rise_span
from roost.decide.plan import PoolHistory, read_back
from roost.decide.snapshot import Demand, PastArrivals, PlanSettings

S = PlanSettings()
NOW = 1_000_000.0


def counted(arrivals: list[float], done: list[tuple[float, float]], span: float,
            now: float = NOW, grain: float = S.peak_grain) -> PastArrivals:
    """What the store's query returns: tasks by age bucket of ``grain`` seconds."""
    n = math.ceil(span / grain)
    created, completed, ran = [0] * n, [0] * n, [0.0] * n
    for t in arrivals:
        if now - span < t <= now:
            created[min(n - 1, int((now - t) // grain))] += 1
    for t, r in done:
        if now - span < t <= now:
            k = min(n - 1, int((now - t) // grain))
            completed[k] += 1
            ran[k] += r
    return PastArrivals(grain, span, tuple(created), tuple(completed), tuple(ran))


def live_read(arrivals: list[float], done: list[tuple[float, float]], t: float,
              s: PlanSettings = S) -> Demand:
    """What the controller's own queries read at ``t``, from the task times: the rate
    and service over the rate window, the busiest grain since the previous read
    (buckets aligned to ``NOW``, as the store's ages are)."""
    w, g = s.rate_window, s.peak_grain
    since = min(max(s.interval, g), w)
    rate = sum(1 for x in arrivals if t - w < x <= t) / w
    runs = [r for x, r in done if t - w < x <= t]
    buckets: dict[int, int] = {}
    for x in arrivals:
        if t - since < x <= t:
            k = int((NOW - x) // g)
            buckets[k] = buckets.get(k, 0) + 1
    peak = max(buckets.values(), default=0) / g
    return Demand(0, 0, rate, sum(runs) / len(runs) if runs else None, peak, len(runs))


def ramp_and_bursts(seed: int, seconds: float) -> tuple[list[float], list[tuple[float, float]]]:
    """Poisson arrivals rising from 2/s to 12/s, with 10 s bursts at 40/s every 300 s,
    and 0.2 s tasks each done 1 s after it arrived."""
    rng = random.Random(seed)
    out, t = [], NOW - seconds
    while True:
        age = NOW - t
        rate = 2 + 10 * (1 - age / seconds) + (40 if age % 300 < 10 else 0)
        t += rng.expovariate(rate)
        if t > NOW:
            break
        out.append(t)
    return out, [(x + 1.0, rng.uniform(0.1, 0.3)) for x in out if x + 1.0 <= NOW]


def test_buckets_are_read_by_their_middles() -> None:
    past = PastArrivals(5.0, 40.0, created=(1, 2, 3, 4, 5, 6, 7, 8),
                        completed=(0, 1, 0, 1, 0, 1, 0, 1), ran=(0, 2, 0, 4, 0, 6, 0, 8))
    assert past.between(10, 30) == (3 + 4 + 5 + 6, 1 + 1, 4 + 6, 20)  # whole buckets
    assert past.between(12, 33) == (3 + 4 + 5 + 6 + 7, 2, 10, 25)  # middles 12.5 .. 32.5
    assert past.between(0, 100) == (36, 4, 20, 100)  # beyond the span: none there
    assert past.between(11, 12) == (3, 0, 0, 5)  # never less than one bucket
    assert past.busiest(10, 20) == 4 and past.busiest(30, 40) == 8
    assert past.busiest(50, 60) == 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_read_back_makes_the_reads_a_leader_reading_all_along_made(seed: int) -> None:
    span = S.rate_window + read_back_span(None, S)
    arrivals, done = ramp_and_bursts(seed, span + 100)
    live = Estimates()
    t = NOW - read_back_span(None, S)
    while t < NOW - 1e-6:
        live = live.observe(live_read(arrivals, done, t), None, t, S)
        t += S.interval
    back = Estimates().read_back(counted(arrivals, done, span), NOW, S)
    assert back.read_back_at == (NOW, pytest.approx(read_back_span(None, S)))
    for got, want in ((back.arrivals, live.arrivals), (back.rates, live.rates)):
        assert [x for pair in got for x in pair] == pytest.approx(
            [x for pair in want for x in pair])
    assert back.service == pytest.approx(live.service)
    assert back.service_weight == pytest.approx(live.service_weight)
    assert back.recurred is not None and live.recurred is not None
    assert back.recurred == pytest.approx(live.recurred)
    peak = back.peak_rate(S)
    assert peak is not None and peak.recurs  # the bursts every 300 s, on the first tick


def test_a_new_leader_reads_a_rise_that_began_before_it() -> None:
    """A rate flat at 2/s, then rising to 60/s over the last 300 s: a new leader without
    the task table's reads has one read, and no rise; with them, the rise on its first
    tick."""
    rng = random.Random(7)
    arrivals, t = [], NOW - 1230
    while True:
        t += rng.expovariate(2 + 58 * max(0.0, 1 - (NOW - t) / 300))
        if t > NOW:
            break
        arrivals.append(t)
    read = live_read(arrivals, [], NOW)
    fresh = Estimates().observe(read, None, NOW, S)
    assert rise(fresh.arrivals, NOW, rise_span(None, S), S) is None
    history = read_back({}, {"p": counted(arrivals, [], 1230)}, now=NOW, settings=S)
    est = history["p"].estimates.observe(read, None, NOW, S)
    got = rise(est.arrivals, NOW, rise_span(None, S), S)
    assert got is not None
    assert got[0] == pytest.approx(58 / 300, rel=0.25)  # tasks/s per second


def test_only_a_pool_with_no_reads_yet_is_read_back() -> None:
    past = counted([NOW - 100.0], [], 1230)
    seen = Estimates().observe(Demand(0, 0, 1.0), None, NOW - 5, S)
    history = read_back({"p": PoolHistory(estimates=seen)}, {"p": past, "q": past},
                        now=NOW, settings=S)
    assert history["p"].estimates is seen  # this leadership reads it already
    assert history["q"].estimates.read_back_at is not None


def test_a_span_shorter_than_one_window_reads_nothing_back() -> None:
    past = counted([NOW - 1.0], [], S.rate_window)
    assert Estimates().read_back(past, NOW, S) == Estimates()


@pytest.mark.parametrize(("window", "grain"), [(32.0, 5.0), (33.0, 5.0), (7.0, 5.0),
                                               (45.0, 30.0)])
def test_a_window_of_no_whole_number_of_buckets_reads_the_rate_unbiased(
        window: float, grain: float) -> None:
    """Tasks at exactly 1/s: every replayed read is 1/s, whatever the window's fit to
    the buckets (it is read over the nearest whole number of them)."""
    s = PlanSettings(rate_window=window, peak_grain=grain)
    span = s.rate_window + read_back_span(None, s)
    past = counted([NOW - k - 0.5 for k in range(int(span))], [], span, grain=grain)
    est = Estimates().read_back(past, NOW, s)
    assert est.arrivals and all(r == pytest.approx(1.0, rel=0.02) for _, r in est.arrivals)
