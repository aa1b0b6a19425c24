"""A worker's settings and identity."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace

from roost.store.workers import MAX_SLOTS

INSTANCE_REF_ENVS = ("ROOST_INSTANCE_ID", "POD_NAME")
"""Where a worker finds its orchestrator ref: the instance id a roost node gives the
processes it launches, or the pod name Kubernetes' downward API provides."""


def instance_ref_from_env(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return next((env[k] for k in INSTANCE_REF_ENVS if env.get(k)), "")


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    dsn: str
    pool: str
    concurrency: int = 1
    """Tasks run at once."""
    lease: float = 30.0
    """Seconds a claim holds a task without a heartbeat."""
    heartbeat_interval: float = 0.0
    """Seconds between heartbeats; 0 means a third of the lease."""
    poll_interval: float = 1.0
    """Longest wait between claims when the queue is empty."""
    revision: str = ""
    instance_ref: str = ""
    """The orchestrator's name for the replica this worker runs in (empty: none)."""
    worker_id: str = ""
    """Empty: ``<instance ref or host>-<random>``."""
    db_pool_size: int = 2
    """Connections this worker opens; the pool's ``worker_db_pool_size`` budgets it."""
    retry_backoff: float = 1.0
    retry_backoff_max: float = 300.0

    def validate(self) -> WorkerConfig:
        if not 1 <= self.concurrency <= MAX_SLOTS:  # it registers as workers.slots
            raise ValueError(f"concurrency must be within 1..{MAX_SLOTS}")
        if self.lease <= 0:
            raise ValueError("lease must be > 0")
        if self.heartbeat_interval < 0 or self.heartbeat_interval >= self.lease:
            raise ValueError("heartbeat interval must be shorter than the lease")
        if self.poll_interval <= 0:
            raise ValueError("poll interval must be > 0")
        if self.db_pool_size < 1:
            raise ValueError("a worker needs at least one database connection")
        if self.retry_backoff < 0 or self.retry_backoff_max < self.retry_backoff:
            raise ValueError("need 0 <= retry backoff <= retry backoff max")
        out = self
        if not out.heartbeat_interval:
            out = replace(out, heartbeat_interval=out.lease / 3)
        if not out.worker_id:
            host = out.instance_ref or socket.gethostname()
            out = replace(out, worker_id=f"{host}-{secrets.token_hex(4)}")
        return out
