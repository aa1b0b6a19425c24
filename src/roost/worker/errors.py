"""What a task function raises to steer its retry, and what the runtime raises.

Raised by task code (the retry decision made explicit, as kopf's TemporaryError and
PermanentError do):

TaskError
 ├── RetryTask           run again after ``delay`` seconds (default: exponential
 │                       backoff), while attempts are left
 └── PermanentTaskError  fail now; no further attempts

Any other exception counts as `RetryTask` with the default backoff.

Raised by the runtime:

WorkerError
 └── TargetNotFound      ``module:function`` could not be imported
"""

from __future__ import annotations


class TaskError(Exception):
    pass


class RetryTask(TaskError):
    def __init__(self, message: str = "", *, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentTaskError(TaskError):
    pass


class WorkerError(Exception):
    pass


class TargetNotFound(WorkerError):
    pass


def retry_delay(attempt: int, *, base: float, cap: float) -> float:
    """Exponential backoff after failed attempt ``attempt`` (1-based): base, 2*base, 4*base
    ... up to ``cap``."""
    if attempt < 1 or base <= 0:
        return 0.0
    return float(min(cap, base * 2 ** min(attempt - 1, 62)))
