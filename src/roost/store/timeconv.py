"""Float epoch seconds (what the plan and the injectable clock use) <-> timestamptz."""

from __future__ import annotations

from datetime import UTC, datetime


def to_ts(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def from_ts(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()
