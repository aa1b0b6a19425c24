"""A sustained rise of the arrival rate (`roost.decide.demand.rise`): read on window
means of a ramp, never on one step or burst, wherever it falls against the reads."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from roost.decide.demand import RISE_WINDOWS, rise
from roost.decide.snapshot import PlanSettings

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
