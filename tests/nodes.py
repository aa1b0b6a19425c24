"""Starting real node agents in-process for tests, and talking to them over NATS."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import nats
from nats.aio.client import Client
from nats.errors import NoRespondersError

from roost.bus import schemas as s
from roost.bus import subjects
from roost.domain.host import HostCapacity
from roost.domain.images import DEFAULT_IMAGE_ID
from roost.domain.resources import Resources, parse_quantity
from roost.node.agent import NodeAgent, NodeConfig


def host(spec: str, gpus: tuple[()] = ()) -> HostCapacity:
    """A host of exactly ``spec`` (e.g. '4vcpu,16GiB'), no reserve."""
    return HostCapacity(total=parse_quantity(spec), gpus=gpus, reserve=Resources(0, 0))


@contextlib.asynccontextmanager
async def running_nodes(
    urls: Sequence[str] | Sequence[Sequence[str]],
    specs: Sequence[str],
    tmp_path: Path,
    *,
    driver: str = "sim",
    heartbeat_seconds: float = 1.0,
) -> AsyncIterator[list[NodeAgent]]:
    """Agents ``n1..nN`` with the given capacities. ``urls`` is one server list for all,
    or one list per node (to put nodes on different servers of a cluster)."""
    agents = []
    try:
        for i, spec in enumerate(specs):
            node_urls = urls[i] if urls and not isinstance(urls[0], str) else urls
            cfg = NodeConfig(
                node_id=f"n{i + 1}", nats_urls=list(node_urls),  # type: ignore[arg-type]
                data_dir=tmp_path / f"n{i + 1}", host=host(spec), driver=driver,
                heartbeat_seconds=heartbeat_seconds, stop_grace_seconds=2.0,
            )
            agent = NodeAgent(cfg)
            await agent.start()
            agents.append(agent)
        yield agents
    finally:
        for agent in agents:
            await agent.stop()


def launch_request(instance_type: str, **kw: object) -> s.LaunchRequest:
    return s.LaunchRequest(
        launch_id=str(kw.pop("launch_id", uuid.uuid4().hex)), instance_type=instance_type,
        image_id=str(kw.pop("image_id", DEFAULT_IMAGE_ID)), reservation_id="r-test",
        **kw,  # type: ignore[arg-type]
    )


async def launch(
    nc: Client, instance_type: str, *, node_id: str | None = None, timeout: float = 5.0,
    **kw: object,
) -> s.LaunchReply | None:
    """Send one launch; None means NATS answered "no responders" (no node subscribed)."""
    subject = subjects.node_launch(node_id) if node_id else subjects.run_instances(instance_type)
    try:
        msg = await nc.request(subject, s.encode(launch_request(instance_type, **kw)),
                               timeout=timeout)
    except NoRespondersError:
        return None
    return s.decode(msg.data, s.LaunchReply)


async def command(nc: Client, node_id: str, op: str, instance_id: str) -> s.CommandReply:
    msg = await nc.request(
        subjects.node_command(node_id),
        s.encode(s.InstanceCommand(op=op, instance_id=instance_id)),  # type: ignore[arg-type]
        timeout=5,
    )
    return s.decode(msg.data, s.CommandReply)


async def wait_state(nc: Client, node_id: str, instance_id: str, state: str,
                     timeout: float = 10.0) -> s.InstanceRecord:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        reply = await command(nc, node_id, "describe", instance_id)
        assert reply.instance is not None
        if reply.instance.state == state:
            return reply.instance
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{instance_id} is {reply.instance.state}, wanted {state}")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def client(url: str | Sequence[str]) -> AsyncIterator[Client]:
    nc = await nats.connect(servers=[url] if isinstance(url, str) else list(url))
    try:
        yield nc
    finally:
        await nc.close()
