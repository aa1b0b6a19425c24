"""Task functions that worker processes started by tests run (``tests.worker_tasks:NAME``).

Each writes a line to ``payload["log"]`` when it starts, so a test can see from outside
which process ran which attempt, and when."""

from __future__ import annotations

import os
import time
from typing import Any

from roost.worker import current_task


def _note(payload: dict[str, Any], what: str) -> None:
    t = current_task()
    with open(payload["log"], "a") as f:
        f.write(f"{what} task={t.task_id} attempt={t.attempt} pid={os.getpid()}\n")


def hang(payload: dict[str, Any]) -> Any:
    """Start, then never finish (the test kills the process)."""
    _note(payload, "start")
    time.sleep(300)
    return None


def slow(payload: dict[str, Any]) -> Any:
    _note(payload, "start")
    time.sleep(float(payload.get("seconds", 1.0)))
    _note(payload, "end")
    return {"slept": payload.get("seconds", 1.0), "pid": os.getpid()}
