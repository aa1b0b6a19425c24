"""``roost node``: run a node agent, or drain one."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from pathlib import Path

import click
import nats.errors
from nats.aio.client import Client

from roost.bus import schemas as s
from roost.bus import subjects
from roost.bus.auth import NatsAuth
from roost.bus.connect import connect
from roost.bus.options import nats_creds_option
from roost.domain.catalog import BUILTIN, parse_types_toml
from roost.node.agent import NodeAgent, NodeConfig
from roost.node.forget import Forgotten, NodeAlive, forget_node
from roost.node.hostinfo import host_capacity
from roost.node.isolation import LEVELS, Level


def _default_node_id() -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname())[:64]


@click.group(invoke_without_command=True)
@click.option(
    "--nats",
    "nats_urls",
    envvar="ROOST_NODE_NATS",
    multiple=True,
    default=["nats://127.0.0.1:4222"],
    show_default=True,
    help="NATS server URL; repeat for a cluster. Env: ROOST_NODE_NATS (space-separated).",
)
@click.option(
    "--node-id",
    envvar="ROOST_NODE_ID",
    default=_default_node_id,
    show_default="hostname",
    help="This node's id: letters, digits, '-' and '_'. Env: ROOST_NODE_ID.",
)
@click.option(
    "--data-dir",
    envvar="ROOST_NODE_DATA_DIR",
    type=click.Path(path_type=Path),
    default=None,
    help="Local state (SQLite) and instance logs. Default: ~/.roost/nodes/<node-id>. "
    "Env: ROOST_NODE_DATA_DIR.",
)
@click.option(
    "--capacity",
    envvar="ROOST_NODE_CAPACITY",
    default=None,
    metavar="CPU,MEM",
    help="Total host capacity, e.g. '8vcpu,32GiB'; replaces detection from /proc "
    "(physical cores, MemTotal). Env: ROOST_NODE_CAPACITY.",
)
@click.option(
    "--reserve",
    envvar="ROOST_NODE_RESERVE",
    default="2vcpu,2GiB",
    show_default=True,
    metavar="CPU,MEM",
    help="Kept back for the host itself. Env: ROOST_NODE_RESERVE.",
)
@click.option(
    "--gpus",
    envvar="ROOST_NODE_GPUS",
    default="",
    metavar="SPEC",
    help="GPU devices, e.g. '2xA10G' or 'A10G,T4'. Env: ROOST_NODE_GPUS.",
)
@click.option(
    "--types-config",
    envvar="ROOST_NODE_TYPES_CONFIG",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="TOML file of operator-defined instance types "
    "(see docs/architecture.md). Env: ROOST_NODE_TYPES_CONFIG.",
)
@click.option(
    "--driver",
    envvar="ROOST_NODE_DRIVER",
    type=click.Choice(["process", "vm", "sim"]),
    default="process",
    show_default=True,
    help="process: user data runs as a child process; vm: every instance a QEMU "
    "micro-VM (KVM where it works, else TCG; images from `roost images build`); "
    "sim: nothing runs (benchmarks). Env: ROOST_NODE_DRIVER.",
)
@click.option(
    "--isolation",
    envvar="ROOST_NODE_ISOLATION",
    type=click.Choice(list(LEVELS)),
    default="cgroup",
    show_default=True,
    help="process driver: cgroup = one cgroup per instance (memory, CPU quota, pids) and "
    "whole-group stop; sandbox = cgroup plus bubblewrap (own pid namespace, private /tmp, "
    "read-only host); none = a plain child process. Where the host can't, the node runs "
    "at the level it can and says so in its log and `roost status`. "
    "Env: ROOST_NODE_ISOLATION.",
)
@click.option(
    "--imds-port",
    envvar="ROOST_NODE_IMDS_PORT",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="Loopback port of this node's instance metadata service; 0 picks one on first "
    "start and keeps it in the data dir, so re-adopted instances still reach it. "
    "Env: ROOST_NODE_IMDS_PORT.",
)
@click.option(
    "--metrics-port",
    envvar="ROOST_NODE_METRICS_PORT",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve Prometheus metrics (per-instance CPU seconds, memory, OOM kills) on "
    "127.0.0.1:PORT. Off by default. Env: ROOST_NODE_METRICS_PORT.",
)
@click.option(
    "--availability-zone",
    envvar="ROOST_NODE_AVAILABILITY_ZONE",
    default="roost-1a",
    show_default=True,
    help="Reported as the instances' Placement.AvailabilityZone. "
    "Env: ROOST_NODE_AVAILABILITY_ZONE.",
)
@click.option(
    "--heartbeat-seconds",
    envvar="ROOST_NODE_HEARTBEAT_SECONDS",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    help="Capacity snapshot interval when nothing changes. Env: ROOST_NODE_HEARTBEAT_SECONDS.",
)
@click.option(
    "--stop-grace-seconds",
    envvar="ROOST_NODE_STOP_GRACE_SECONDS",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    help="Between SIGTERM and SIGKILL on stop/terminate. Env: ROOST_NODE_STOP_GRACE_SECONDS.",
)
@click.option(
    "--terminated-retention-seconds",
    envvar="ROOST_NODE_TERMINATED_RETENTION_SECONDS",
    type=click.FloatRange(min=1),
    default=3600.0,
    show_default=True,
    help="How long a terminated instance stays describable (EC2: about an hour); then "
    "its record, user data and directory are removed. "
    "Env: ROOST_NODE_TERMINATED_RETENTION_SECONDS.",
)
@click.option(
    "--log-level",
    envvar="ROOST_NODE_LOG_LEVEL",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="Env: ROOST_NODE_LOG_LEVEL.",
)
@nats_creds_option
@click.pass_context
def node(
    ctx: click.Context,
    nats_urls: tuple[str, ...],
    nats_auth: NatsAuth | None,
    node_id: str,
    data_dir: Path | None,
    capacity: str | None,
    reserve: str,
    gpus: str,
    types_config: Path | None,
    driver: str,
    isolation: Level,
    imds_port: int,
    metrics_port: int | None,
    availability_zone: str,
    heartbeat_seconds: float,
    stop_grace_seconds: float,
    terminated_retention_seconds: float,
    log_level: str,
) -> None:
    """Run a node agent: the authority on this host's capacity.

    It subscribes to ec2.RunInstances.<type> only while one more of that type fits, and
    runs the instances NATS routes to it. SIGTERM (or `roost node drain`) drains it:
    it stops advertising, refuses launches in flight, and exits; instances keep running
    and are re-adopted when the agent starts again.
    """
    ctx.ensure_object(dict)
    ctx.obj["nats"] = _split(nats_urls)
    ctx.obj["nats_auth"] = nats_auth
    ctx.obj["node_id"] = node_id
    if ctx.invoked_subcommand is not None:
        return
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        subjects.check_node_id(node_id)
        host = host_capacity(capacity=capacity, reserve=reserve, gpus=gpus)
        catalog = BUILTIN
        if types_config is not None:
            catalog = BUILTIN.with_types(parse_types_toml(types_config.read_text()))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    config = NodeConfig(
        node_id=node_id,
        nats_urls=_split(nats_urls),
        data_dir=data_dir or Path.home() / ".roost" / "nodes" / node_id,
        host=host,
        catalog=catalog,
        driver=driver,
        isolation=isolation,
        imds_port=imds_port,
        metrics_port=metrics_port,
        availability_zone=availability_zone,
        heartbeat_seconds=heartbeat_seconds,
        stop_grace_seconds=stop_grace_seconds,
        terminated_retention_seconds=terminated_retention_seconds,
        nats_auth=nats_auth,
    )
    asyncio.run(_run(config))


def _split(urls: tuple[str, ...]) -> list[str]:
    return [u for raw in urls for u in raw.replace(",", " ").split()]


async def _run(config: NodeConfig) -> None:
    agent = NodeAgent(config)
    loop = asyncio.get_running_loop()
    await agent.start()
    stopping: set[asyncio.Task[None]] = set()  # held, so the stop is not collected midway

    def on_signal() -> None:
        task = asyncio.ensure_future(agent.stop())
        stopping.add(task)
        task.add_done_callback(stopping.discard)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    note = agent.driver.isolation_note
    click.echo(
        f"node {config.node_id} ready: {len(agent.ledger.fitting_types())} types fit, "
        f"{agent.ledger.count} instances held, isolation "
        f"{agent.driver.isolation}{f' ({note})' if note else ''}, "
        f"metadata service {agent.imds_endpoint or 'off'}",
        err=True,
    )
    await agent.stopped.wait()


@node.command("drain")
@click.option(
    "--keep-running",
    is_flag=True,
    help="Stop advertising but leave the agent running (default: it exits).",
)
@click.option("--timeout", type=float, default=5.0, show_default=True)
@click.pass_context
def drain_cmd(ctx: click.Context, keep_running: bool, timeout: float) -> None:
    """Drain the node given by the group's --node-id over NATS."""

    async def go() -> s.DrainReply:
        nc = await _reach_nats(ctx, "roost-node-drain")
        try:
            msg = await nc.request(
                subjects.node_drain(ctx.obj["node_id"]),
                s.encode(s.DrainRequest(shutdown=not keep_running)),
                timeout=timeout,
            )
            return s.decode(msg.data, s.DrainReply)
        finally:
            await nc.close()

    try:
        reply = asyncio.run(go())
    except Exception as exc:
        raise click.ClickException(
            f"could not drain node {ctx.obj['node_id']}: {type(exc).__name__} {exc}"
        ) from None
    click.echo(f"node {reply.node_id} draining; {reply.instances} instances keep running")


class NatsUnreachable(Exception):
    """An operator command found no NATS server to talk to."""


async def _reach_nats(ctx: click.Context, name: str, timeout: float = 10.0) -> Client:
    """A connection for a one-off operator command: bounded, unlike an agent's, which
    waits for NATS forever; the error names where it looked (--nats, ROOST_NODE_NATS)."""
    try:
        return await asyncio.wait_for(
            connect(ctx.obj["nats"], name=name, auth=ctx.obj["nats_auth"]), timeout)
    except (TimeoutError, OSError, nats.errors.Error) as exc:
        raise NatsUnreachable(
            f"cannot reach NATS at {', '.join(ctx.obj['nats'])} within {timeout:.0f} s "
            f"({type(exc).__name__}); give --nats URL or ROOST_NODE_NATS") from None


@node.command("forget")
@click.argument("node_to_forget", metavar="NODE", required=False)
@click.option("--listen", type=float, default=6.0, show_default=True,
              help="Seconds to listen for the node's heartbeat first (three of the default "
              "2 s heartbeats); a node heard from is refused.")
@click.pass_context
def forget_cmd(ctx: click.Context, node_to_forget: str | None, listen: float) -> None:
    """Declare NODE's host gone for good (default: the group's --node-id).

    Its instances that are not terminated yet are marked terminated (reason
    Server.InternalError, naming the lost host), gateways drop the node from their
    capacity view, and terminate orders are left in case the node comes back after all:
    its agent then terminates what survived before it advertises any room. The gateways
    delete the records after their --terminated-retention-seconds. Refused while the
    node still heartbeats (drain it instead).
    """
    node_id = node_to_forget or ctx.obj["node_id"]

    async def go() -> Forgotten:
        nc = await _reach_nats(ctx, "roost-node-forget")
        try:
            return await forget_node(nc, node_id, listen=listen)
        finally:
            await nc.close()

    try:
        done = asyncio.run(go())
    except (NodeAlive, NatsUnreachable) as exc:
        raise click.ClickException(str(exc)) from None
    except Exception as exc:
        raise click.ClickException(
            f"could not forget node {node_id}: {type(exc).__name__} {exc}") from None
    click.echo(f"node {done.node_id} forgotten: {len(done.terminated)} instances marked "
               f"terminated")
