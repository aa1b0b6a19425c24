"""The controller's configuration: defaults, then a TOML file, then environment variables
(``ROOST_CONTROLLER_*``), then flags; later sources win. The CLI does the layering; this
module holds the typed result and reads the file.

The TOML file holds the same names as the flags, with underscores, either at the top
level or under ``[controller]``::

    [controller]
    dsn = "postgresql://postgres@127.0.0.1:5432/postgres"
    interval = 10
    scale_up_window = 30
    scale_down_window = 60
    small_pool_replicas = 5
    memory_target_percent = 80
    static_config = "static-pools.toml"
    kubernetes_config = "kubernetes.toml"
    native_config = "native.toml"
"""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path
from typing import Any

import msgspec

from roost.controller import tomlfile
from roost.decide.demand import past_span
from roost.decide.snapshot import PlanSettings

MIN_TASK_RETENTION = 3600.0
"""The shortest retention of finished tasks, whatever the settings: an hour (a new
leader reads back 1,230 s with the defaults)."""


class SettingError(ValueError):
    """A setting names something unusable (a file that does not load, a cluster that
    cannot be configured); found when the controller starts, not when flags are parsed."""


class ControllerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    dsn: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    interval: float = 10.0
    scale_up_window: float = 30.0
    scale_down_window: float = PlanSettings().scale_down_window
    small_pool_replicas: int = PlanSettings().small_pool_replicas
    drain_timeout: float = 600.0
    rate_window: float = PlanSettings().rate_window
    peak_grain: float = PlanSettings().peak_grain
    drain_horizon: float = PlanSettings().drain_horizon
    startup_default: float = PlanSettings().startup_default
    flap_window: float = PlanSettings().flap_window
    headroom_window: float = PlanSettings().headroom_window
    headroom_sigmas: float = PlanSettings().headroom_sigmas
    growth_period: float = PlanSettings().growth_period
    disruption_period: float = PlanSettings().disruption_period
    memory_target_percent: float = 80.0
    memory_hard_percent: float = 90.0
    cpu_target_percent: float = 80.0
    max_input_age: float | None = None
    """Inputs older than this freeze the plan; default 3 intervals (at least 30 s)."""
    heartbeat_timeout: float = 30.0
    db_total_connections: int | None = None
    db_non_worker_connections: int = 10
    db_connections_per_sync_peer: int = 1
    db_expected_sync_peers: int = 0
    follower_retry: float = 2.0
    """Seconds between a follower's tries for the lead and between a leader's renewals
    (a Kubernetes Lease's retryPeriod)."""
    lease_duration: float = 10.0
    """A leader silent this long loses the lead (a Kubernetes Lease's leaseDuration):
    Postgres ends its lock session, and no transaction of a controller outlives half
    of it. A frozen leader is replaced within lease_duration + follower_retry + 1 s."""
    keepalive_timeout: float = 2.0
    io_timeout: float = 5.0
    http_host: str = "127.0.0.1"
    http_port: int = 9180
    shadow: bool = False
    holder: str = ""
    static_config: str | None = None
    kubernetes_config: str | None = None
    native_config: str | None = None
    """TOML settings of the native adapter (gateway endpoint and keys, see
    roost.controller.adapters.native); serves pools on roost's own nodes."""
    """A TOML file of Kubernetes settings (``roost.controller.adapters.k8s.config``);
    set, the controller serves the ``kubernetes`` orchestrator."""
    fake: bool = False
    """Serve an in-memory ``fake`` orchestrator (demos and tests only)."""
    migrate: bool = True
    task_retention: float = 7 * 86400.0
    """Seconds a finished (done or failed) task is kept after it finished; then the
    leader deletes it. 0 keeps every task."""

    @property
    def holder_name(self) -> str:
        return self.holder or f"{socket.gethostname()}:{os.getpid()}"

    @property
    def least_task_retention(self) -> float:
        """The shortest `task_retention`: an hour, or the span a new leader reads back
        at the default start-up if longer (a longer start-up measured later keeps the
        tasks longer while it holds: `Controller._prune`)."""
        return max(MIN_TASK_RETENTION, past_span(None, self.plan_settings()))

    @property
    def input_age_limit(self) -> float:
        if self.max_input_age is not None:
            return self.max_input_age
        return max(30.0, 3 * self.interval)

    def plan_settings(self) -> PlanSettings:
        return PlanSettings(
            scale_up_window=self.scale_up_window,
            scale_down_window=self.scale_down_window,
            small_pool_replicas=self.small_pool_replicas,
            drain_timeout=self.drain_timeout,
            rate_window=self.rate_window,
            peak_grain=self.peak_grain,
            drain_horizon=self.drain_horizon,
            startup_default=self.startup_default,
            flap_window=self.flap_window,
            headroom_window=self.headroom_window,
            headroom_sigmas=self.headroom_sigmas,
            growth_period=self.growth_period,
            disruption_period=self.disruption_period,
            interval=self.interval,
            memory_target_percent=self.memory_target_percent,
            memory_hard_percent=self.memory_hard_percent,
            cpu_target_percent=self.cpu_target_percent,
            max_input_age=self.input_age_limit,
            heartbeat_timeout=self.heartbeat_timeout,
            db_total_connections=self.db_total_connections,
            db_non_worker_connections=self.db_non_worker_connections,
            db_connections_per_sync_peer=self.db_connections_per_sync_peer,
            db_expected_sync_peers=self.db_expected_sync_peers,
        )

    def validate(self) -> ControllerConfig:
        """Raise ValueError naming the setting at fault."""
        for name in ("interval", "follower_retry", "keepalive_timeout", "io_timeout",
                     "lease_duration"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.lease_duration < 2 * max(self.follower_retry, self.keepalive_timeout):
            raise ValueError("lease_duration must be at least twice follower_retry and "
                             "keepalive_timeout: a leader renews every follower_retry, "
                             "each renewal may take keepalive_timeout")
        if not 0 <= self.http_port <= 65535:
            raise ValueError("http_port must be a TCP port")
        self.plan_settings().validate()
        least = self.least_task_retention
        if self.task_retention != 0 and not least <= self.task_retention < math.inf:
            raise ValueError(f"task_retention must be 0 (keep every task) or at least "
                             f"{least:g} s (finite): an hour, or what a new leader reads "
                             "back with these settings if longer")
        return self


def load_file(path: Path) -> dict[str, Any]:
    """The settings in a TOML file (top level or ``[controller]``), not yet validated."""
    out = tomlfile.section(tomlfile.read(path), "controller", path)
    tomlfile.resolve_paths(out, ("static_config", "kubernetes_config", "native_config"), path)
    return out


def build(*layers: dict[str, Any]) -> ControllerConfig:
    """A config from layered settings (later wins; None means "not given")."""
    merged: dict[str, Any] = {}
    for layer in layers:
        merged.update({k: v for k, v in layer.items() if v is not None})
    try:
        cfg = msgspec.convert(merged, ControllerConfig, strict=False)
    except msgspec.ValidationError as exc:
        raise ValueError(f"controller config: {exc}") from None
    return cfg.validate()
