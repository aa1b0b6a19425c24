"""``roost worker --pool P module:function``: run a worker process.

Exit status: 0 after a drain (SIGTERM, or the controller removed this worker's
replica), 1 on a fatal error, 2 on bad usage, 3 after an aborted drain (a second
signal), 4 if the worker's row vanished (its pool was deleted).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import click

from roost.store.errors import StoreError
from roost.store.workers import MAX_SLOTS
from roost.worker.config import INSTANCE_REF_ENVS, WorkerConfig
from roost.worker.enroll import EnrollmentFailed, enrollment_requested, fetch_dsn
from roost.worker.errors import TargetNotFound
from roost.worker.metrics import serve_metrics
from roost.worker.runtime import ExitReason, Worker

ENV = "ROOST_WORKER_"
EXIT_CODES = {ExitReason.STOPPED: 0, ExitReason.REMOVED: 0, ExitReason.ABORTED: 3,
              ExitReason.UNREGISTERED: 4}


def load_target(target: str, app_dir: str | None = None) -> Callable[[Any], Any]:
    """``package.module:function`` (or ``:object.attribute``) -> the callable."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise TargetNotFound(f"{target!r} is not module:function")
    if app_dir is not None:
        sys.path.insert(0, str(Path(app_dir).resolve()))
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise TargetNotFound(f"cannot import {module_name!r}: {exc}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TargetNotFound(f"{module_name!r} has no {attr!r}") from None
    if not callable(obj):
        raise TargetNotFound(f"{target!r} is not callable")
    return obj  # type: ignore[no-any-return]


async def _serve(fn: Callable[[Any], Any], config: WorkerConfig, *,
                 metrics: tuple[str, int] | None = None) -> ExitReason:
    worker = Worker(fn, config)
    if metrics is not None:
        host, port = metrics
        try:
            serve_metrics(worker, host=host, port=port)
        except OSError as exc:
            # Tasks matter more than figures: a port already taken (say, by another
            # worker on the same host, all started with one environment) costs the
            # metrics, not the worker.
            logging.getLogger("roost.worker").warning(
                "not serving metrics: cannot listen on %s:%d: %s", host, port, exc.strerror)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    try:
        return await worker.run()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _opt(*decls: str, **kw: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    envvar = kw.pop("envvar", ENV + decls[0].lstrip("-").replace("-", "_").upper())
    return click.option(*decls, envvar=envvar, show_envvar=True, show_default=True, **kw)


@click.command("worker")
@click.argument("target", metavar="MODULE:FUNCTION")
@_opt("--pool", required=True, help="The worker pool whose tasks to run.")
@_opt("--dsn", envvar=[ENV + "DSN", "ROOST_DSN"], default=None,
      help="Postgres DSN. Without it, a worker launched by a native pool enrolls with the "
           "controller for one (ROOST_WORKER_ENROLL_TOKEN and _URL in its user data).")
@_opt("--concurrency", "-c", type=click.IntRange(1, MAX_SLOTS), default=1,
      help="Tasks run at once (registered: the controller sizes the pool's queue from it).")
@_opt("--lease", type=click.FloatRange(0, min_open=True), default=30.0,
      help="Seconds a claim holds a task between heartbeats.")
@_opt("--heartbeat", type=click.FloatRange(0), default=0.0,
      help="Seconds between heartbeats (0: a third of the lease).")
@_opt("--poll", type=click.FloatRange(0, min_open=True), default=1.0,
      help="Longest wait between claims when the queue is empty.")
@_opt("--revision", envvar=[ENV + "REVISION", "ROOST_REVISION"], default="",
      help="The release this worker runs (the controller freezes on a mismatch).")
@_opt("--instance-ref", envvar=[ENV + "INSTANCE_REF", *INSTANCE_REF_ENVS], default="",
      help="The orchestrator's name for this replica (ROOST_INSTANCE_ID on a roost node, "
           "POD_NAME on Kubernetes).")
@_opt("--worker-id", default="", help="Default: <instance ref or host>-<random>.")
@_opt("--db-pool-size", type=click.IntRange(1), default=2,
      help="Database connections this worker opens.")
@_opt("--retry-backoff", type=click.FloatRange(0), default=1.0,
      help="Seconds before the first retry of a failed task; doubles per attempt.")
@_opt("--retry-backoff-max", type=click.FloatRange(0), default=300.0)
@_opt("--metrics-port", type=click.IntRange(1, 65535), default=None,
      help="Serve Prometheus /metrics on this port (default: none).")
@_opt("--metrics-host", default="127.0.0.1",
      help="Address for --metrics-port (loopback by default; a Kubernetes pod that is "
           "scraped sets 0.0.0.0, as the example Deployment does).")
@_opt("--app-dir", default=".", help="Directory put first on sys.path to import MODULE.")
@_opt("--log-level", default="info",
      type=click.Choice(["debug", "info", "warning", "error"]))
def worker(target: str, pool: str, dsn: str | None, concurrency: int, lease: float,
           heartbeat: float, poll: float, revision: str, instance_ref: str, worker_id: str,
           db_pool_size: int, retry_backoff: float, retry_backoff_max: float,
           metrics_port: int | None, metrics_host: str, app_dir: str, log_level: str) -> None:
    """Run MODULE:FUNCTION for each task of a pool: claim under a lease, heartbeat, and
    drain on SIGTERM or when the controller asks."""
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if dsn is None:
        if not enrollment_requested():
            raise click.UsageError("give --dsn (or ROOST_WORKER_DSN), or run where the "
                                   "controller's enrollment token is set")
        try:
            dsn = fetch_dsn()
        except EnrollmentFailed as exc:
            raise click.ClickException(str(exc)) from None
    try:
        fn = load_target(target, app_dir)
        config = WorkerConfig(
            dsn=dsn, pool=pool, concurrency=concurrency, lease=lease,
            heartbeat_interval=heartbeat, poll_interval=poll, revision=revision,
            instance_ref=instance_ref, worker_id=worker_id, db_pool_size=db_pool_size,
            retry_backoff=retry_backoff, retry_backoff_max=retry_backoff_max,
        ).validate()
    except (TargetNotFound, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    try:
        metrics = None if metrics_port is None else (metrics_host, metrics_port)
        reason = asyncio.run(_serve(fn, config, metrics=metrics))
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    except (OSError, asyncpg.PostgresError) as exc:
        raise click.ClickException(f"database: {exc}") from None
    sys.exit(EXIT_CODES[reason])
