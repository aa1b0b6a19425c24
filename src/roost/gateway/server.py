"""The gateway as a service: connect to NATS, follow capacity and instances, serve HTTP.

`Gateway` runs inside any asyncio program (`roost gateway`, `roost up`, the tests). It
binds its socket itself, so ``port=0`` works and `endpoint` names the real port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec
import uvicorn
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from roost.bus import subjects
from roost.bus.auth import NatsAuth
from roost.bus.connect import connect, key_value, until_synced
from roost.bus.schemas import CapacitySnapshot, InstanceRecord, decode
from roost.decide.placement import DEFAULT_POLICY, POLICIES
from roost.decide.workload import Workload
from roost.domain.catalog import BUILTIN, Catalog
from roost.domain.network import PUBLIC_IPV4_POOL
from roost.gateway.accounts import AccountStore, KeyBook
from roost.gateway.app import AppParts, build_app
from roost.gateway.capacity import FULL_AFTER, CapacityView
from roost.gateway.collector import Collector
from roost.gateway.images import ImageStore
from roost.gateway.index import InstanceIndex
from roost.gateway.launch import Launcher, LaunchPolicy
from roost.gateway.metrics import GatewayMetrics
from roost.gateway.netservice import NetworkService
from roost.gateway.network import NetworkStore
from roost.gateway.nodes import NodeClient
from roost.gateway.quotas import QuotaBook, weigher
from roost.gateway.reads import Ec2Reads
from roost.gateway.service import Ec2Service, Site
from roost.gateway.sigv4 import SigV4Verifier
from roost.gateway.templates import TemplateStore
from roost.gateway.tokens import TokenStore
from roost.gateway.types import TypeRegistry
from roost.gateway.volservice import VolumeService
from roost.gateway.volumes import VolumeStore

log = logging.getLogger(__name__)



def endpoint_url(host: str, port: int) -> str:
    """The URL a client on this host uses for a gateway bound to ``host``: a wildcard
    bind is reached through loopback."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"http://{shown}:{port}"


@dataclass(frozen=True)
class GatewayConfig:
    nats_urls: Sequence[str]
    host: str = "127.0.0.1"
    port: int = 8773
    region: str = "roost-1"
    credentials: Mapping[str, str] = field(default_factory=dict)
    """Static access key id -> secret access key, all of the default account."""
    operator_key: bytes | None = None
    """Opens the secrets of the keys in the accounts bucket (`roost keys create`)."""
    auth: bool = True
    policy: str = DEFAULT_POLICY
    workload: Workload | None = None
    """The declared launch mix the workload-aware policies measure against."""
    catalog: Catalog = field(default_factory=lambda: BUILTIN)
    owner_id: str = "000000000000"
    launch_timeout: float = 5.0
    max_attempts: int = 3
    client_token_ttl: float = 24 * 3600.0
    terminated_retention: float = 3600.0
    """Seconds a terminated instance of a forgotten node (`roost node forget`) stays
    describable before the gateways delete its record; a live node expires its own."""
    max_instances_per_request: int = 500
    public_ipv4_pool: str = PUBLIC_IPV4_POOL
    """The block public IPv4 addresses are drawn from (recorded, not routed)."""
    full_after: float = FULL_AFTER
    """Seconds after start before a full cluster is answered from the capacity view
    alone; until then the bus is asked. Raise it if nodes heartbeat slower than 2 s."""
    reuse_port: bool = False
    """Bind with SO_REUSEPORT, so that several gateway processes share the port
    (`roost.gateway.workers`)."""
    nats_auth: NatsAuth | None = None
    """The gateway's NATS user (`roost.bus.auth`); None connects anonymously."""
    address_stripe: tuple[int, int] = (0, 1)
    """Worker i of a pool of n: it looks for free private addresses from i/n into each
    subnet, gives back the addresses of its share of the instances that end, and places
    launches on its own share of the nodes first (the workers do not see each other's
    launches in flight, so they would otherwise all pick the same one)."""

    def check(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown placement policy {self.policy!r}; known: "
                             + ", ".join(POLICIES))
        if self.auth and not self.credentials and self.operator_key is None:
            raise ValueError("no access keys configured: give --credentials KEY:SECRET "
                             "(or ROOST_GATEWAY_CREDENTIALS), or the operator key that "
                             "opens the accounts bucket's keys (ROOST_OPERATOR_KEY or "
                             "ROOST_OPERATOR_KEY_FILE), or run with --no-auth")


def _each(*calls: Callable[[InstanceRecord], None]) -> Callable[[InstanceRecord], None]:
    def call(rec: InstanceRecord) -> None:
        for c in calls:
            c(rec)
    return call


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the program that embeds the gateway owns
    SIGINT/SIGTERM and stops the gateway itself."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Gateway:
    def __init__(self, config: GatewayConfig) -> None:
        config.check()
        self.config = config
        self.metrics = GatewayMetrics()
        self._nc: NATS | None = None
        self._index: InstanceIndex | None = None
        self._network: NetworkStore | None = None
        self._templates: TemplateStore | None = None
        self.keys = KeyBook(config.credentials, operator_key=config.operator_key,
                            default_account=config.owner_id)
        self._images: ImageStore | None = None
        self._volumes: VolumeStore | None = None
        self._server: _Server | None = None
        self._serving: asyncio.Task[None] | None = None
        self._collector: asyncio.Task[None] | None = None
        self._sock: socket.socket | None = None
        self.service: Ec2Service | None = None

    @property
    def port(self) -> int:
        if self._sock is None:
            raise RuntimeError("the gateway is not started")
        return int(self._sock.getsockname()[1])

    @property
    def endpoint(self) -> str:
        return endpoint_url(self.config.host, self.port)

    async def start(self, *, sync_timeout: float = 15.0) -> None:
        """Connect, follow the buckets and serve once every mirror has caught up; fail
        if ``sync_timeout`` seconds pass with no bucket entry coming in meanwhile."""
        cfg = self.config
        self.metrics.watch_gc()
        self._nc = nc = await connect(cfg.nats_urls, name="roost-gateway", auth=cfg.nats_auth)
        records = await key_value(nc, subjects.INSTANCES_BUCKET)
        tags = await key_value(nc, subjects.TAGS_BUCKET)
        user_data = await key_value(nc, subjects.USER_DATA_BUCKET)
        tokens = await key_value(nc, subjects.CLIENT_TOKENS_BUCKET, ttl=cfg.client_token_ttl)
        network_kv = await key_value(nc, subjects.NETWORK_BUCKET)
        addresses_kv = await key_value(nc, subjects.ADDRESSES_BUCKET)
        key_pairs_kv = await key_value(nc, subjects.KEY_PAIRS_BUCKET)
        accounts_kv = await key_value(nc, subjects.ACCOUNTS_BUCKET)
        templates = TemplateStore(await key_value(nc, subjects.LAUNCH_TEMPLATES_BUCKET),
                                  owner_id=cfg.owner_id)
        self._templates = templates
        self._images = images = ImageStore(await key_value(nc, subjects.IMAGES_BUCKET),
                                           owner_id=cfg.owner_id)
        loop = asyncio.get_running_loop()
        view = CapacityView(loop.time, full_after=cfg.full_after)
        await nc.subscribe(subjects.CAPACITY_ALL, cb=self._on_capacity(view))
        nodes = NodeClient(nc, timeout=cfg.launch_timeout)
        orders = await key_value(nc, subjects.NODE_ORDERS_BUCKET, direct=True)
        self._index = index = InstanceIndex(records, tags, user_data, orders)
        index.on_forgotten = view.forget

        def zones() -> list[str]:
            return sorted(view.zones()) or [f"{cfg.region}a"]

        self._network = network = NetworkStore(network_kv, addresses_kv, key_pairs_kv,
                                               region=cfg.region, owner_id=cfg.owner_id,
                                               zones=zones, stripe=cfg.address_stripe,
                                               public_pool=cfg.public_ipv4_pool)
        types = TypeRegistry(cfg.catalog, nodes, view)
        index.weigh = weigher(types.get)
        quotas = QuotaBook(AccountStore(accounts_kv), self.keys, index.state_of,
                           index.tally, index.launched)
        volumes = VolumeStore(await key_value(nc, subjects.VOLUMES_BUCKET), index.all)
        self._volumes = volumes
        index.on_gone = _each(network.instance_gone, volumes.instance_gone)
        index.on_public_dropped = network.public_dropped
        index.group_overrides = network.instance_groups
        network.start(index.all)
        volumes.start()
        templates.start()
        images.start()
        index.start(retention=cfg.terminated_retention,
                    mine=lambda rec: network.gives_back(rec.launch_id))
        self.keys.start(accounts_kv)
        await until_synced(asyncio.gather(index.wait_synced(None), self.keys.synced.wait(),
                                          network.wait_synced(None), volumes.wait_synced(None),
                                          templates.wait_synced(None),
                                          images.wait_synced(None)),
                           stall=sync_timeout, what="gateway start")
        launcher = Launcher(nodes, view, self.metrics,
                            policy=LaunchPolicy(cfg.policy, max_attempts=cfg.max_attempts,
                                                workload=cfg.workload,
                                                share=cfg.address_stripe))
        site = Site(cfg.region, cfg.owner_id, cfg.max_instances_per_request)
        self.service = service = Ec2Service(
            site=site, view=view, types=types,
            launcher=launcher, nodes=nodes, index=index, tokens=TokenStore(tokens),
            metrics=self.metrics, net=NetworkService(network), templates=templates,
            quotas=quotas,
            images=images,
            volumes=VolumeService(volumes, index, zones),
        )
        verifier = SigV4Verifier(self.keys) if cfg.auth else None
        reads = Ec2Reads(service)
        app = build_app(AppParts(service, reads, verifier, self.keys.caller),
                        health=self._health)
        # IPPROTO_TCP spelled out: asyncio turns Nagle off (TCP_NODELAY) only on
        # sockets whose proto says TCP. With proto 0 every keep-alive reply waited out
        # the client's delayed ACK, ~40 ms a request.
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if cfg.reuse_port:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.bind((cfg.host, cfg.port))
        reads.endpoint = self.endpoint
        # httptools (uvicorn's C parser) where installed, as it is with roost; no proxy
        # headers: the gateway trusts no X-Forwarded-For.
        self._server = _Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                              lifespan="off", proxy_headers=False))
        self._serving = asyncio.create_task(self._server.serve(sockets=[self._sock]))
        self._collector = asyncio.create_task(
            Collector(each_look=self.metrics.file_gc).run(), name="collector")
        while not self._server.started:
            if self._serving.done():
                self._serving.result()  # raises what stopped it
                raise RuntimeError("the gateway's HTTP server exited while starting")
            await asyncio.sleep(0.01)
        log.info("gateway serving EC2 on %s (policy %s, region %s)", self.endpoint,
                 cfg.policy, cfg.region)
        if not cfg.auth:
            log.warning("*** SigV4 authentication is OFF (--no-auth): anyone who can reach "
                        "%s can launch and terminate instances ***", self.endpoint)

    def _on_capacity(self, view: CapacityView) -> Callable[[Msg], Awaitable[None]]:
        async def cb(msg: Msg) -> None:
            try:
                view.apply(decode(msg.data, CapacitySnapshot))
            except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
                log.warning("ignoring bad capacity snapshot on %s: %s", msg.subject, exc)
        return cb

    def _health(self) -> tuple[bool, dict[str, object]]:
        connected = bool(self._nc is not None and self._nc.is_connected)
        synced = bool(self._index is not None and self._index.synced)
        nodes = self.service.view.live_count() if self.service else 0
        return connected and synced, {"nats": connected, "index_synced": synced,
                                      "live_nodes": nodes, "pid": os.getpid()}

    async def stop(self) -> None:
        self.metrics.unwatch_gc()
        if self._collector is not None:
            self._collector.cancel()
            await asyncio.gather(self._collector, return_exceptions=True)
        if self._server is not None and self._serving is not None:
            self._server.should_exit = True
            await asyncio.gather(self._serving, return_exceptions=True)
        if self.service is not None:
            await self.service.tokens.close()  # its claims go quiet: taken over after a lease
        if self._index is not None:
            await self._index.stop()
        if self._network is not None:
            await self._network.stop()
        if self._templates is not None:
            await self._templates.stop()
        await self.keys.stop()
        if self._images is not None:
            await self._images.stop()
        if self._volumes is not None:
            await self._volumes.stop()
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.close()
        if self._sock is not None:
            self._sock.close()

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
