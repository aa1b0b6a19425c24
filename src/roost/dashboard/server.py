"""The dashboard as a service inside any asyncio program: `roost up`, `roost demo`,
`roost dashboard` and the tests. It binds its own socket, so ``port=0`` works and `url`
names the real port."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import uvicorn

from roost.bus.auth import NatsAuth
from roost.dashboard.access import check_bind
from roost.dashboard.app import DashboardSettings, build_app
from roost.dashboard.history import History
from roost.dashboard.model import LaunchCounters
from roost.dashboard.recorder import DEFAULT_INTERVAL, Recorder
from roost.dashboard.sources import LiveSource

log = logging.getLogger(__name__)

DEFAULT_PORT = 8780


@dataclass(frozen=True)
class DashboardConfig:
    nats_urls: Sequence[str]
    controller_url: str = ""
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    credentials: Mapping[str, str] = field(default_factory=dict)
    ec2_endpoint: str = "$AWS_ENDPOINT_URL_EC2"
    gateway_metrics_url: str = ""
    interval: float = DEFAULT_INTERVAL
    """Seconds between samples (and live updates)."""
    nats_auth: NatsAuth | None = None
    """The dashboard's NATS user (it drains nodes and stops instances: an admin one)."""

    def check(self) -> None:
        check_bind(self.host, self.credentials)
        if self.interval <= 0:
            raise ValueError("the dashboard's interval must be positive")


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the embedding program owns them."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Dashboard:
    def __init__(self, config: DashboardConfig, *,
                 launches: Callable[[], LaunchCounters] | None = None) -> None:
        config.check()
        self.config = config
        self.source = LiveSource(config.nats_urls, nats_auth=config.nats_auth,
                                 controller_url=config.controller_url,
                                 gateway_metrics_url=config.gateway_metrics_url,
                                 launches=launches)
        self.recorder = Recorder(self.source, History(), interval=config.interval)
        self._server: _Server | None = None
        self._serving: asyncio.Task[None] | None = None
        self._sock: socket.socket | None = None

    @property
    def url(self) -> str:
        if self._sock is None:
            raise RuntimeError("the dashboard is not started")
        host = self.config.host
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return f"http://{shown}:{self._sock.getsockname()[1]}"

    async def start(self) -> None:
        cfg = self.config
        await self.source.start()
        self.recorder.start()
        app = build_app(self.source, self.recorder, DashboardSettings(
            host=cfg.host, credentials=cfg.credentials, ec2_endpoint=cfg.ec2_endpoint))
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((cfg.host, cfg.port))
        # Event streams stay open: give them a second to notice the stop, not forever.
        self._server = _Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                              lifespan="off", timeout_graceful_shutdown=1))
        self._serving = asyncio.create_task(self._server.serve(sockets=[self._sock]))
        while not self._server.started:
            if self._serving.done():
                self._serving.result()
                raise RuntimeError("the dashboard's HTTP server exited while starting")
            await asyncio.sleep(0.01)
        log.info("dashboard on %s", self.url)

    async def stop(self) -> None:
        await self.recorder.stop()
        if self._server is not None and self._serving is not None:
            self._server.should_exit = True
            await asyncio.gather(self._serving, return_exceptions=True)
        await self.source.stop()
        if self._sock is not None:
            self._sock.close()
