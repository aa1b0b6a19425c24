"""The task `roost demo` runs: sleep a moment, return the input."""

from __future__ import annotations

import time
from typing import Any


def echo(payload: dict[str, Any]) -> Any:
    time.sleep(float(payload.get("seconds", 0.3)))
    return payload
