"""Numbers in the units a person reads: vCPU, GiB, GPUs, %, seconds and minutes."""

from __future__ import annotations

from datetime import UTC, datetime

NONE = "\u2013"
"""What a figure with no value shows (an en dash)."""


def _trim(x: float, places: int = 1) -> str:
    text = f"{x:,.{places}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def vcpu(milli: int | float) -> str:
    return f"{_trim(milli / 1000)} vCPU"


def gib(mib: int | float) -> str:
    return f"{_trim(mib / 1024)} GiB"


def gpus(milli: int | float) -> str:
    """Milli-GPUs as GPUs: 2500 -> "2.5 GPU", 125 -> "0.125 GPU"."""
    return f"{_trim(milli / 1000, 3)} GPU"


def pct(part: float, whole: float) -> str:
    if whole <= 0:
        return NONE
    return f"{round(100 * part / whole)} %"


def pct_num(part: float, whole: float) -> float:
    return 0.0 if whole <= 0 else round(100 * part / whole, 1)


def age(seconds: float | None) -> str:
    if seconds is None:
        return NONE
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def millis(seconds: float | None) -> str:
    if seconds is None:
        return NONE
    return f"{_trim(seconds * 1000)} ms"


def rate(per_min: float | None) -> str:
    return NONE if per_min is None else f"{_trim(per_min)}/min"


def clock(ts: float | None) -> str:
    """Wall-clock seconds as UTC time of day, as the event log shows it."""
    if ts is None:
        return NONE
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S")


def iso_age(iso: str | None, now: float) -> str:
    if not iso:
        return "never"
    try:
        then = datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return iso
    return f"{age(max(0.0, now - then))} ago"


FILTERS = {"vcpu": vcpu, "gib": gib, "gpus": gpus, "age": age, "millis": millis,
           "rate": rate, "clock": clock}
