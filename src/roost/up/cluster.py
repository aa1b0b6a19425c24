"""A local roost cluster as a list of components, started in order, stopped in reverse.

`roost up`, `roost bench launch` and the end-to-end tests all build one. A component
is anything with ``start``/``stop``; adding one is one more entry in `build_components`.
`roost up` runs NATS, Postgres, the gateway, the nodes and the capacity controller (with
the ``native`` orchestrator, whose pools are instances on these nodes, and ``fake``).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import asyncpg
from prometheus_client import CollectorRegistry

from roost.bus import subjects
from roost.bus.auth import ClusterAuth, NatsAuth
from roost.bus.connect import connect, key_value
from roost.controller.adapters import FakeOrchestrator, NativeOrchestrator, NativeSettings
from roost.controller.clock import SystemClock
from roost.controller.config import ControllerConfig
from roost.controller.orchestrator import Orchestrator
from roost.controller.service import serve
from roost.dashboard.server import Dashboard, DashboardConfig
from roost.dashboard.sources import launch_counters
from roost.decide.placement import DEFAULT_POLICY
from roost.domain.accounts import DEFAULT_ACCOUNT
from roost.domain.host import HostCapacity
from roost.domain.resources import Resources, parse_quantity
from roost.embedded import NatsServer, PostgresServer
from roost.embedded.proc import describe_exit, port_open, wait_until, write_private
from roost.gateway.accounts import AccountStore, new_key_id, new_secret
from roost.gateway.server import Gateway, GatewayConfig
from roost.gateway.workers import GatewayPool
from roost.node.agent import NodeAgent, NodeConfig
from roost.node.isolation import Level
from roost.store import apitokens
from roost.store.migrations import migrate
from roost.store.roles import WORKER_ROLE, ensure_worker_role

log = logging.getLogger(__name__)


class Component(Protocol):
    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class NatsComponent:
    """nats-server; with ``auth``, its users and permissions are written (0600) under
    ``<data_dir>/../nats-auth`` before it starts, and anonymous clients are refused."""

    name = "nats"

    def __init__(self, data_dir: Path, *, port: int | None = None,
                 auth: ClusterAuth | None = None) -> None:
        self.auth = auth
        self.auth_dir = data_dir.parent / "nats-auth"
        self.server = NatsServer(base_dir=data_dir, port=port,
                                 config_file=self.auth_dir / "nats.conf" if auth else None)

    def client_auth(self, user: str) -> NatsAuth | None:
        """The credentials of ``user`` (admin, gateway, node-<id>); None without auth."""
        return None if self.auth is None else self.auth.auth(user)

    @property
    def url(self) -> str:
        return self.server.url

    async def start(self) -> None:
        await asyncio.to_thread(self._start)

    def _start(self) -> None:
        if self.auth is not None:
            self.auth.write(self.auth_dir)
        # Its own session, unlike `NatsServer.start`: a Ctrl-C in the terminal goes to
        # the whole foreground process group, and NATS must outlive the nodes and the
        # gateway that drain through it while `roost up` shuts down in order.
        server = self.server
        server.proc = subprocess.Popen(server.command(), stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True)
        wait_until(lambda: port_open(server.port) and "Server is ready" in
                   server.log.read_text(errors="replace"),
                   proc=server.proc, what="nats-server", timeout=20.0, log=server.log)

    async def stop(self) -> None:
        await asyncio.to_thread(self.server.stop)

    def exited(self) -> str | None:
        """How nats-server ended, once it has (reaping it); None while it runs."""
        proc = self.server.proc
        code = None if proc is None else proc.poll()
        return None if code is None else f"(pid {self.server.pid}) {describe_exit(code)}"


class NodesComponent:
    """Node agents in this process, one per config."""

    name = "nodes"

    def __init__(self, configs: Sequence[NodeConfig]) -> None:
        self.configs = list(configs)
        self.agents: list[NodeAgent] = []

    async def start(self) -> None:
        # Agents are made here, on the loop's thread: each opens its SQLite state, which
        # must be used from the thread that opened it.
        self.agents = [NodeAgent(c) for c in self.configs]
        await asyncio.gather(*(a.start() for a in self.agents))

    async def stop(self) -> None:
        await asyncio.gather(*(a.stop() for a in self.agents), return_exceptions=True)


class AccountsComponent:
    """Registers the cluster's keys in the accounts bucket as admin keys of the default
    account (the operator's: the dashboard and the controller see every account through
    them), when it first makes that account. From then on they are keys like any other
    (shown by ``roost accounts show 000000000000``, held to its quotas, revocable), and
    a restart does not bring back a key the operator revoked."""

    name = "accounts"

    def __init__(self, nats: NatsComponent, credentials: Mapping[str, str],
                 operator_key: bytes) -> None:
        self.nats = nats
        self.credentials = dict(credentials)
        self.operator_key = operator_key

    async def start(self) -> None:
        nc = await connect([self.nats.url], name="roost-up-accounts",
                           auth=self.nats.client_auth("admin"))
        try:
            store = AccountStore(await key_value(nc, subjects.ACCOUNTS_BUCKET))
            if await store.account(DEFAULT_ACCOUNT) is not None:
                return
            await store.create_account("default", account_id=DEFAULT_ACCOUNT)
            for key_id, secret in self.credentials.items():
                await store.create_key(DEFAULT_ACCOUNT, self.operator_key, admin=True,
                                       key_id=key_id, secret=secret)
        finally:
            await nc.close()

    async def stop(self) -> None:
        pass


class GatewayComponent:
    """The gateway on this process's event loop."""

    name = "gateway"

    def __init__(self, config: GatewayConfig) -> None:
        self.gateway = Gateway(config)

    @property
    def endpoint(self) -> str:
        return self.gateway.endpoint

    def registry(self) -> CollectorRegistry:
        return self.gateway.metrics.registry

    async def start(self) -> None:
        await self.gateway.start()

    async def stop(self) -> None:
        await self.gateway.stop()


class GatewayPoolComponent:
    """Gateway worker processes on one port (`GatewayPool`), which restarts its own."""

    name = "gateway"

    def __init__(self, config: GatewayConfig, workers: int) -> None:
        self.pool = GatewayPool(config, workers)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def endpoint(self) -> str:
        return self.pool.endpoint

    def registry(self) -> CollectorRegistry:
        return self.pool.metrics_registry()

    async def start(self) -> None:
        await self.pool.start()
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self.pool.supervise(self._stop),
                                         name="gateway-pool")

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        await self.pool.stop()


AnyGateway = GatewayComponent | GatewayPoolComponent


class PostgresComponent:
    """Postgres from its wheel, its data kept in ``data_dir`` across restarts; every
    connection needs a password (kept 0600 in ``data_dir``)."""

    name = "postgres"

    def __init__(self, data_dir: Path, *, port: int | None = None) -> None:
        self.server = PostgresServer(base_dir=data_dir, port=port, password=True)

    @property
    def dsn(self) -> str:
        return self.server.dsn

    async def start(self) -> None:
        await asyncio.to_thread(self.server.start)

    async def stop(self) -> None:
        await asyncio.to_thread(self.server.stop)

    def exited(self) -> str | None:
        """How the postmaster ended, once it has (reaping it); None while it runs."""
        code = self.server.exited()
        return None if code is None else f"(pid {self.server.pid}) {describe_exit(code)}"


class ControllerComponent:
    """The capacity controller in this process, on the cluster's Postgres, with the
    ``native`` orchestrator pointed at the cluster's gateway and a ``fake`` one.

    Once the schema is migrated it makes the ``roost_worker`` role, whose DSN only
    enrolled workers receive, and an operator token for the task API, kept (0600) in
    ``<postgres dir>/api-token`` and reused across restarts while it is valid.
    """

    name = "controller"

    def __init__(self, config: ControllerConfig, *, postgres: PostgresComponent,
                 gateway: AnyGateway, region: str,
                 credentials: Mapping[str, str]) -> None:
        self.config = config
        self.postgres = postgres
        self.gateway = gateway
        self.region = region
        self.credentials = credentials
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.config.http_host}:{self.config.http_port}"

    @property
    def _secrets_dir(self) -> Path:
        return self.postgres.server.dir

    def _worker_password(self) -> str:
        path = self._secrets_dir / "worker.password"
        if not path.exists():
            self._secrets_dir.mkdir(parents=True, exist_ok=True)
            write_private(path, secrets.token_urlsafe(24))
        return path.read_text().strip()

    @property
    def worker_dsn(self) -> str:
        """The least-privilege role's DSN, as enrolled workers get it."""
        return self.postgres.server.dsn_for(WORKER_ROLE, self._worker_password())

    @property
    def token_file(self) -> Path:
        """The operator token of the task API (every pool)."""
        return self._secrets_dir / "api-token"

    async def _provision(self) -> None:
        conn = await asyncpg.connect(self.postgres.dsn, timeout=10)
        try:
            await ensure_worker_role(conn, self._worker_password())
            saved = self.token_file.read_text().strip() if self.token_file.exists() else ""
            if not saved or await apitokens.lookup(conn, saved) is None:
                await conn.execute("DELETE FROM api_tokens WHERE name = 'roost-up'")
                write_private(self.token_file, await apitokens.create(conn, "roost-up", None))
        finally:
            await conn.close()

    def orchestrators(self, clock: SystemClock) -> dict[str, Orchestrator]:
        key, secret = next(iter(self.credentials.items()), ("roost", "roost"))
        native = NativeOrchestrator(NativeSettings(
            endpoint=self.gateway.endpoint, region=self.region, access_key_id=key,
            secret_access_key=secret, dsn=self.worker_dsn, controller_url=self.url,
            # The controller bounds a whole adapter call (two or three EC2 calls) by
            # io_timeout; each call gets a share, so a slow one fails as itself.
            timeout=self.config.io_timeout / 2,
        ), now=clock.time)
        return {"native": native, "fake": FakeOrchestrator(now=clock.time)}

    async def start(self) -> None:
        clock = SystemClock()
        self._stop = asyncio.Event()
        started = asyncio.Event()
        self._task = asyncio.create_task(serve(
            self.config, orchestrators=self.orchestrators(clock), clock=clock, stop=self._stop,
            started=started), name="controller")
        waiter = asyncio.create_task(started.wait())
        await asyncio.wait({self._task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self._task.done():
            self._task.result()  # raises why it failed
            raise RuntimeError("the controller stopped while starting")
        await self._provision()

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            if self._task.done():  # it died: what it died of was reported already
                if not self._task.cancelled():
                    self._task.exception()
                return
            await asyncio.wait_for(self._task, 30)

    def exited(self) -> str | None:
        task = self._task
        if task is None or not task.done():
            return None
        exc = None if task.cancelled() else task.exception()
        return "stopped" if exc is None else f"failed: {type(exc).__name__}: {exc}"


class DashboardComponent:
    """The web dashboard, on the cluster's NATS and controller; made at start, when the
    gateway's endpoint (which its AWS CLI commands name) is known."""

    name = "dashboard"

    def __init__(self, *, nats: NatsComponent, gateway: AnyGateway,
                 controller_url: str, host: str, port: int,
                 credentials: Mapping[str, str], interval: float = 5.0) -> None:
        self.nats, self.gateway = nats, gateway
        self.interval = interval
        self.controller_url, self.host, self.port = controller_url, host, port
        self.credentials = credentials
        self.dashboard: Dashboard | None = None

    @property
    def url(self) -> str:
        assert self.dashboard is not None
        return self.dashboard.url

    async def start(self) -> None:
        gw = self.gateway
        self.dashboard = Dashboard(DashboardConfig(
            nats_urls=[self.nats.url], nats_auth=self.nats.client_auth("admin"),
            controller_url=self.controller_url, host=self.host,
            port=self.port, credentials=self.credentials, ec2_endpoint=gw.endpoint,
            interval=self.interval,
        ), launches=lambda: launch_counters(gw.registry()))
        await self.dashboard.start()

    async def stop(self) -> None:
        if self.dashboard is not None:
            await self.dashboard.stop()


class LocalCluster:
    def __init__(self, components: Sequence[Component]) -> None:
        self.components = list(components)
        self._started: list[Component] = []
        self._abandon = False

    async def start(self) -> bool:
        """Start every component in order; if one fails, stop those already started.

        False if `abandon_start` cut it short: the components started so far still run,
        for `stop` to stop in order."""
        try:
            for c in self.components:
                if self._abandon:
                    log.info("start abandoned before %s", c.name)
                    return False
                log.info("starting %s", c.name)
                await c.start()
                self._started.append(c)
        except BaseException:
            await self.stop()
            raise
        return True

    @property
    def started(self) -> list[Component]:
        """The components running now, in start order."""
        return list(self._started)

    def abandon_start(self) -> None:
        """Start no further component. The one starting now finishes (its start is
        bounded, and a process half-started in a thread could not be stopped safely)."""
        self._abandon = True

    async def stop(self) -> None:
        while self._started:
            c = self._started.pop()
            try:
                await c.stop()
            except Exception:
                log.exception("stopping %s failed", c.name)

    def get(self, kind: type[Component]) -> Component:
        for c in self.components:
            if isinstance(c, kind):
                return c
        raise LookupError(kind.__name__)

    @property
    def gateway(self) -> Gateway:
        """The gateway, when it runs in this process."""
        found = self.get(GatewayComponent)
        assert isinstance(found, GatewayComponent)
        return found.gateway

    @property
    def endpoint(self) -> str:
        """The gateway's endpoint, in this process or a pool of its own."""
        for c in self.components:
            if isinstance(c, GatewayComponent | GatewayPoolComponent):
                return c.endpoint
        raise LookupError("no gateway")

    @property
    def nodes(self) -> list[NodeAgent]:
        found = self.get(NodesComponent)
        assert isinstance(found, NodesComponent)
        return found.agents


@dataclass(frozen=True)
class ClusterSpec:
    """What `roost up` starts. ``credentials`` empty and ``auth`` on: a key pair is made."""

    data_dir: Path
    nodes: int = 3
    driver: str = "process"
    isolation: Level = "cgroup"
    node_capacity: str = "8vcpu,32GiB"
    node_reserve: str = "0vcpu,0MiB"
    availability_zone: str = "roost-1a"
    heartbeat_seconds: float = 2.0
    nats_port: int | None = None
    host: str = "127.0.0.1"
    port: int = 8773
    region: str = "roost-1"
    policy: str = DEFAULT_POLICY
    auth: bool = True
    credentials: Mapping[str, str] = field(default_factory=dict)
    operator_key: bytes | None = None
    """Seals the keys in the accounts bucket; with it, ``credentials`` are registered
    there as the default account's keys (`AccountsComponent`)."""
    nats_auth: bool = True
    """NATS users and permissions per component (`roost.bus.auth`); False leaves NATS
    open to any local process, for development only."""
    controller: bool = True
    """Also run Postgres and the capacity controller."""
    postgres_port: int | None = None
    controller_host: str = "127.0.0.1"
    controller_port: int = 9180
    dashboard_port: int | None = None
    """Serve the web dashboard on this port (0: any free one); None: no dashboard."""
    gateway_workers: int = 0
    """Gateway processes sharing the port; 0: the gateway runs in this process."""

    def node_host(self) -> HostCapacity:
        return HostCapacity(total=parse_quantity(self.node_capacity),
                            reserve=parse_quantity(self.node_reserve))


def new_credentials() -> tuple[str, str]:
    """An access key id and secret shaped like AWS's (so tools that check shapes pass),
    made as `roost keys create` makes them."""
    return new_key_id(), new_secret()


def build_components(spec: ClusterSpec) -> list[Component]:
    node_ids = [f"node-{i + 1}" for i in range(spec.nodes)]
    nats = NatsComponent(spec.data_dir / "nats", port=spec.nats_port,
                         auth=ClusterAuth.generate(node_ids) if spec.nats_auth else None)
    nodes = NodesComponent([
        NodeConfig(
            node_id=f"node-{i + 1}", nats_urls=[nats.url],
            nats_auth=nats.client_auth(f"node-{i + 1}"),
            data_dir=spec.data_dir / "nodes" / f"node-{i + 1}", host=spec.node_host(),
            driver=spec.driver, isolation=spec.isolation,
            availability_zone=spec.availability_zone,
            heartbeat_seconds=spec.heartbeat_seconds,
        )
        for i in range(spec.nodes)
    ])
    in_bucket = spec.operator_key is not None and bool(spec.credentials)
    gateway_config = GatewayConfig(
        nats_urls=[nats.url], host=spec.host, port=spec.port, region=spec.region,
        credentials={} if in_bucket else spec.credentials, auth=spec.auth,
        policy=spec.policy, operator_key=spec.operator_key,
        nats_auth=nats.client_auth("gateway"),
    )
    gateway: AnyGateway = (GatewayPoolComponent(gateway_config, spec.gateway_workers)
                           if spec.gateway_workers else GatewayComponent(gateway_config))
    # The gateway before the nodes, so it hears their first capacity snapshots.
    components: list[Component] = [nats, gateway, nodes]
    if spec.operator_key is not None and in_bucket:
        components.insert(1, AccountsComponent(nats, spec.credentials, spec.operator_key))
    if spec.controller:
        postgres = PostgresComponent(spec.data_dir / "postgres", port=spec.postgres_port)
        controller = ControllerComponent(
            ControllerConfig(dsn=postgres.dsn, http_host=spec.controller_host,
                             http_port=spec.controller_port).validate(),
            postgres=postgres, gateway=gateway, region=spec.region,
            credentials=spec.credentials,
        )
        # Postgres first of all, so it is the last to stop; the controller last.
        components = [postgres, *components, controller]
    if spec.dashboard_port is not None:
        components.append(DashboardComponent(
            nats=nats, gateway=gateway, host=spec.host, port=spec.dashboard_port,
            controller_url=(f"http://{spec.controller_host}:{spec.controller_port}"
                            if spec.controller else ""),
            credentials=spec.credentials))
    return components


def spec_resources(spec: ClusterSpec) -> Resources:
    """What the whole cluster offers to instances."""
    return spec.node_host().allocatable.scaled(spec.nodes)


async def cluster_clients(cluster: LocalCluster, spec: ClusterSpec, *, max_size: int
                          ) -> tuple[NativeOrchestrator, Any]:
    """For a started cluster: a ``native`` orchestrator on its gateway (with its first
    key pair) and a connection pool on its Postgres, migrated."""
    ctl = cluster.get(ControllerComponent)
    assert isinstance(ctl, ControllerComponent)
    key, secret = next(iter(spec.credentials.items()))
    orch = NativeOrchestrator(NativeSettings(
        endpoint=cluster.endpoint, region=spec.region, access_key_id=key,
        secret_access_key=secret, dsn=ctl.worker_dsn, controller_url=ctl.url, timeout=5.0),
        now=time.time)
    db = await asyncpg.create_pool(ctl.postgres.dsn, min_size=1, max_size=max_size)
    async with db.acquire() as conn:
        await migrate(conn)
    return orch, db
