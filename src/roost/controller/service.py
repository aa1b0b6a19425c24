"""Running a controller: migrations, the orchestrator adapters, leadership, the loop and
the HTTP server, started together and stopped together.

`roost controller` calls `serve()`; `roost up` and tests can call it too, with their own
adapters, clock and stop event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from pathlib import Path

import uvicorn

from roost.controller.adapters import FakeOrchestrator, StaticOrchestrator
from roost.controller.clock import Clock, SystemClock
from roost.controller.config import ControllerConfig, SettingError
from roost.controller.http import build_app
from roost.controller.leadership import Leadership
from roost.controller.loop import Controller
from roost.controller.orchestrator import Orchestrator
from roost.store import notify
from roost.store.migrations import migrate_dsn
from roost.store.session import SessionBounds, create_pool

log = logging.getLogger("roost.controller")


def build_orchestrators(config: ControllerConfig, clock: Clock) -> dict[str, Orchestrator]:
    """The adapters this controller serves, by the name pools refer to. `SettingError`
    when one cannot be configured (a kubernetes file that does not load, no cluster)."""
    out: dict[str, Orchestrator] = {}
    if config.static_config:
        out["static"] = StaticOrchestrator(Path(config.static_config), now=clock.time)
    if config.kubernetes_config:
        # Imported here: lightkube is loaded only by controllers that talk to a cluster.
        from roost.controller.adapters.k8s.config import load_settings
        from roost.controller.adapters.kubernetes import KubernetesOrchestrator

        try:
            settings = load_settings(Path(config.kubernetes_config))
            out["kubernetes"] = KubernetesOrchestrator.from_settings(settings, now=clock.time)
        except ValueError as exc:
            raise SettingError(f"kubernetes_config: {exc}") from None
    if config.native_config:
        from roost.controller.adapters.native import NativeOrchestrator
        from roost.controller.adapters.native import load_settings as load_native

        try:
            native = load_native(Path(config.native_config), dsn=config.dsn,
                                 controller_url=f"http://{config.http_host}:{config.http_port}")
        except ValueError as exc:
            raise SettingError(f"native_config: {exc}") from None
        out["native"] = NativeOrchestrator(native, now=clock.time)
    if config.fake:
        out["fake"] = FakeOrchestrator(now=clock.time)
    return out


def pool_bounds(config: ControllerConfig) -> SessionBounds:
    """Every pooled controller connection: queries bounded by io_timeout, transactions
    (a fenced write's share lock on the lease row among them) by half a lease."""
    return SessionBounds(statement_timeout=config.io_timeout,
                         transaction_bound=config.lease_duration / 2,
                         application_name=f"roost-controller {config.holder_name} pool")


async def serve(
    config: ControllerConfig,
    *,
    orchestrators: Mapping[str, Orchestrator] | None = None,
    clock: Clock | None = None,
    stop: asyncio.Event | None = None,
    started: asyncio.Event | None = None,
) -> None:
    """Run until ``stop`` is set or the process gets SIGINT/SIGTERM (via uvicorn)."""
    clock = clock or SystemClock()
    stop = stop or asyncio.Event()
    adapters = dict(orchestrators) if orchestrators is not None else build_orchestrators(
        config, clock)
    try:
        if config.migrate:
            applied = await migrate_dsn(config.dsn)
            for m in applied:
                log.info("applied migration %04d %s", m.version, m.name)
        db = await create_pool(config.dsn, pool_bounds(config), connect_timeout=config.io_timeout)
    except BaseException:
        for adapter in adapters.values():
            await adapter.close()
        raise
    leadership = Leadership(
        config.dsn, holder=config.holder_name, clock=clock,
        retry_interval=config.follower_retry, keepalive_timeout=config.keepalive_timeout,
        lease_duration=config.lease_duration,
    )
    controller = Controller(db=db, leadership=leadership, orchestrators=adapters,
                            config=config, clock=clock)
    # A new leader ticks at once rather than at the end of a follower's interval.
    leadership.on_change = lambda leading: controller.wake.set() if leading else None
    server = uvicorn.Server(uvicorn.Config(
        build_app(controller), host=config.http_host, port=config.http_port,
        log_level="warning", lifespan="off", access_log=False,
    ))
    listener = await notify.listen_tasks(config.dsn, controller.task_created)
    loop_task = asyncio.create_task(controller.run(stop), name="controller-loop")
    lease_task = asyncio.create_task(leadership.keep(stop), name="controller-lease")
    http_task = asyncio.create_task(server.serve(), name="controller-http")
    log.info("controller %s on http://%s:%s (shadow=%s)", config.holder_name,
             config.http_host, config.http_port, config.shadow)
    try:
        # uvicorn offers a flag, not an event, for "listening".
        while not server.started and not http_task.done():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        if started is not None:
            started.set()
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({loop_task, http_task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
    finally:
        stop.set()
        server.should_exit = True
        for task in (lease_task, loop_task, http_task):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if listener is not None:
            await listener.close()
        for adapter in adapters.values():
            await adapter.close()
        await db.close()
