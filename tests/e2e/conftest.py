"""End-to-end fixtures: a real local cluster (nats-server, gateway, node agents) on an
event loop of its own in a background thread, so that synchronous clients (boto3, the
AWS CLI, Terraform) can drive it from plain test functions."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import boto3
import pytest
from botocore.config import Config

from roost.bus.schemas import InstanceRecord
from roost.domain.catalog import BUILTIN, Catalog
from roost.gateway.server import GatewayConfig
from roost.node.agent import NodeConfig
from roost.node.isolation import Level
from roost.up.cluster import (
    ClusterSpec,
    GatewayComponent,
    LocalCluster,
    NatsComponent,
    NodesComponent,
    new_credentials,
)

T = TypeVar("T")
IMAGE = "ami-00000000000000001"


async def _cancel_the_rest() -> None:
    """What asyncio.run does on exit: end tasks still pending (say, a NATS client's
    reconnect loop after its server went away), so nothing runs on a closed loop."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()


class ThreadedCluster:
    def __init__(self, spec: ClusterSpec, node_capacities: Sequence[str] = (), *,
                 catalog: Catalog = BUILTIN, isolation: Level = "cgroup",
                 nats_urls: Sequence[str] = (), operator_key: bytes | None = None,
                 zones: Sequence[str] = (), owner_id: str = "000000000000") -> None:
        """``nats_urls``: a NATS (cluster) started elsewhere, instead of a server of its
        own; each node starts on a different one of them. ``zones``: node i's
        availability zone is ``zones[i % len(zones)]`` (default: the spec's one zone);
        ``owner_id``: the account the gateway reports."""
        self.key, self.secret = next(iter(spec.credentials.items()))
        self.spec = spec
        nats = NatsComponent(spec.data_dir / "nats")
        urls = list(nats_urls) or [nats.url]
        capacities = list(node_capacities) or [spec.node_capacity] * spec.nodes
        nodes = NodesComponent([
            NodeConfig(
                node_id=f"n{i + 1}", nats_urls=urls[i % len(urls):] + urls[:i % len(urls)],
                data_dir=spec.data_dir / f"n{i + 1}",
                host=replace(spec, node_capacity=cap).node_host(), driver=spec.driver,
                heartbeat_seconds=spec.heartbeat_seconds, stop_grace_seconds=2.0,
                catalog=catalog, isolation=isolation,
                availability_zone=zones[i % len(zones)] if zones else spec.availability_zone,
            )
            for i, cap in enumerate(capacities)
        ])
        gateway = GatewayComponent(GatewayConfig(
            nats_urls=urls, port=0, region=spec.region, credentials=spec.credentials,
            auth=spec.auth, policy=spec.policy, launch_timeout=5.0, operator_key=operator_key,
            owner_id=owner_id,
        ))
        self.nats = nats
        self.cluster = LocalCluster([gateway, nodes] if nats_urls else [nats, gateway, nodes])
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def read(self, fn: Callable[[], T], timeout: float = 60.0) -> T:
        """``fn()`` called on the cluster's loop: state the loop changes (an index, a
        ledger) is read whole there, never mid-change from the test's thread."""
        async def call() -> T:
            return fn()
        return self.run(call(), timeout)

    def start(self) -> ThreadedCluster:
        self._thread.start()
        self.run(self.cluster.start())
        return self

    def stop(self) -> None:
        try:
            self.run(self.cluster.stop())
            self.run(_cancel_the_rest())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()

    @property
    def endpoint(self) -> str:
        return self.cluster.gateway.endpoint

    def client(self, *, attempts: int = 1, pool: int = 10, secret: str | None = None) -> Any:
        """A boto3 EC2 client for this cluster; one attempt, so errors show as they are."""
        return boto3.client(
            "ec2", endpoint_url=self.endpoint, region_name=self.spec.region,
            aws_access_key_id=self.key, aws_secret_access_key=secret or self.secret,
            config=Config(retries={"total_max_attempts": attempts, "mode": "standard"},
                          max_pool_connections=pool),
        )

    def wait_nodes(self, count: int, timeout: float = 10.0) -> None:
        """Until the gateway's capacity view has ``count`` live nodes."""
        async def wait() -> None:
            service = self.cluster.gateway.service
            assert service is not None
            while service.view.live_count() < count:  # noqa: ASYNC110 - no event to wait on
                await asyncio.sleep(0.02)
        self.run(asyncio.wait_for(wait(), timeout))

    def allocations(self) -> dict[str, int]:
        return {a.node_id: len(a.ledger.allocations) for a in self.cluster.nodes}

    def record(self, instance_id: str) -> InstanceRecord | None:
        service = self.cluster.gateway.service
        assert service is not None
        return service.index.find(instance_id)


def make_cluster(tmp: Path, *, nodes: int = 3, capacity: str = "8vcpu,32GiB",
                 capacities: Sequence[str] = (), driver: str = "sim",
                 catalog: Catalog = BUILTIN, isolation: Level = "cgroup",
                 nats_urls: Sequence[str] = (), operator_key: bytes | None = None,
                 zones: Sequence[str] = (), owner_id: str = "000000000000",
                 **kw: Any) -> ThreadedCluster:
    key, secret = new_credentials()
    spec = ClusterSpec(data_dir=tmp, nodes=nodes, driver=driver, node_capacity=capacity,
                       heartbeat_seconds=0.5, port=0, credentials={key: secret}, **kw)
    cluster = ThreadedCluster(spec, capacities, catalog=catalog, isolation=isolation,
                              nats_urls=nats_urls, operator_key=operator_key,
                              zones=zones, owner_id=owner_id).start()
    cluster.wait_nodes(len(capacities) or nodes)
    return cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedCluster]:
    """Three sim nodes of 8 vCPU / 32 GiB behind a SigV4 gateway, shared by a module."""
    c = make_cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def ec2(cluster: ThreadedCluster) -> Any:
    return cluster.client()
