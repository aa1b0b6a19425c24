"""The worker runtime library: register, heartbeat, leases and drain.

    from roost.worker import Worker, WorkerConfig

    async def handle(payload):
        return {"echo": payload}

    reason = await Worker(handle, WorkerConfig(dsn=..., pool="demo", concurrency=4)).run()

or, from a shell, ``roost worker --pool demo mymodule:handle``. The protocol (leases,
execution tokens, drain) is described in docs/worker.md.
"""

from roost.worker.config import WorkerConfig, instance_ref_from_env
from roost.worker.errors import PermanentTaskError, RetryTask, TaskError, retry_delay
from roost.worker.runtime import ExitReason, TaskContext, Worker, WorkerStats, current_task

__all__ = [
    "ExitReason",
    "PermanentTaskError",
    "RetryTask",
    "TaskContext",
    "TaskError",
    "Worker",
    "WorkerConfig",
    "WorkerStats",
    "current_task",
    "instance_ref_from_env",
    "retry_delay",
]
