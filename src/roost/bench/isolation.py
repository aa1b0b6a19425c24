"""``roost bench isolation``: what isolation costs a launch and a terminate.

One real nats-server and one real node agent per isolation level (``none``, ``cgroup``,
and ``sandbox`` where bubblewrap works), all on this host, driven over NATS as the
gateway drives them. Rounds alternate between the levels, so each level sees the same
machine load and the ratios compare like with like.

Measured per instance (an idle ``t3.nano``):
- launch: from the launch request to the record the node reports as ``running`` (the
  process has joined its cgroup, or its sandbox, by then);
- terminate: from the terminate command to ``terminated`` (the whole group is gone).
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import click
import msgspec
import nats
from nats.aio.client import Client

from roost.bus import schemas as s
from roost.bus import subjects
from roost.domain.host import HostCapacity
from roost.domain.images import DEFAULT_IMAGE_ID
from roost.domain.resources import Resources, parse_quantity
from roost.embedded import NatsServer
from roost.node.agent import NodeAgent, NodeConfig
from roost.node.isolation import LEVELS, Level


@dataclass
class Samples:
    launch: list[float] = field(default_factory=list)
    terminate: list[float] = field(default_factory=list)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def _until(agent: NodeAgent, iid: str, state: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while agent._records[iid].state != state:  # in-process: read the node's own record
        if time.monotonic() > deadline:
            raise click.ClickException(f"{iid} on {agent.node_id} never reached {state}")
        await asyncio.sleep(0.001)


async def _one(nc: Client, agent: NodeAgent, out: Samples) -> None:
    req = s.LaunchRequest(launch_id=uuid.uuid4().hex, instance_type="t3.nano",
                          image_id=DEFAULT_IMAGE_ID, reservation_id="r-bench")
    started = time.monotonic()
    msg = await nc.request(subjects.node_launch(agent.node_id), s.encode(req), timeout=10)
    reply = s.decode(msg.data, s.LaunchReply)
    if not reply.ok or reply.instance is None:
        raise click.ClickException(f"launch refused on {agent.node_id}: {reply.message}")
    iid = reply.instance.instance_id
    await _until(agent, iid, "running")
    out.launch.append(time.monotonic() - started)
    started = time.monotonic()
    cmd = s.InstanceCommand(op="terminate", instance_id=iid)
    await nc.request(subjects.node_command(agent.node_id), s.encode(cmd), timeout=10)
    await _until(agent, iid, "terminated")
    out.terminate.append(time.monotonic() - started)


async def _run(levels: list[Level], rounds: int, base: Path) -> dict[str, Samples]:
    server = NatsServer(base_dir=base / "nats").start()
    agents: dict[str, NodeAgent] = {}
    try:
        for level in levels:
            cfg = NodeConfig(node_id=f"bench-{level}", nats_urls=[server.url],
                             data_dir=base / level, driver="process", isolation=level,
                             host=HostCapacity(total=parse_quantity("4vcpu,4GiB"),
                                               reserve=Resources(0, 0)),
                             stop_grace_seconds=2.0)
            agent = NodeAgent(cfg)
            await agent.start()
            if agent.driver.isolation != level:
                raise click.ClickException(
                    f"isolation {level} is not available here: {agent.driver.isolation_note}")
            agents[level] = agent
        nc = await nats.connect(servers=[server.url])
        results: dict[str, Samples] = {level: Samples() for level in levels}
        try:
            for i in range(rounds):
                for level in levels:
                    await _one(nc, agents[level], results[level])
                if (i + 1) % max(1, rounds // 10) == 0:
                    click.echo(f"  round {i + 1}/{rounds}", err=True)
        finally:
            await nc.close()
        return results
    finally:
        for agent in agents.values():
            await agent.stop()
        server.stop()


@click.command("isolation")
@click.option("--rounds", type=click.IntRange(min=1), default=50, show_default=True,
              help="Launch + terminate pairs per isolation level.")
@click.option("--levels", default="none,cgroup,sandbox", show_default=True,
              help="Comma-separated isolation levels to compare (none first: the ratios "
                   "are against it).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("bench/results"),
              show_default=True, help="Where isolation.json goes.")
def isolation(rounds: int, levels: str, out_dir: Path) -> None:
    """Launch and terminate latency per isolation level (none, cgroup, sandbox), side by
    side in one run on this host."""
    chosen: list[Level] = []
    for name in levels.split(","):
        level = next((known for known in LEVELS if known == name), None)
        if level is None:
            raise click.BadParameter(f"unknown level {name!r}; known: {', '.join(LEVELS)}")
        if name == "sandbox" and shutil.which("bwrap") is None:
            click.echo("skipping sandbox: bubblewrap is not installed "
                       "(apt-get install bubblewrap)", err=True)
            continue
        chosen.append(level)
    base = Path(tempfile.mkdtemp(prefix="roost-bench-isolation-"))
    try:
        results = asyncio.run(_run(chosen, rounds, base))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    baseline = results[chosen[0]]
    rows = {}
    click.echo(f"{'level':8} {'launch p50':>11} {'p95':>8} {'x base':>7} "
               f"{'terminate p50':>14} {'p95':>8} {'x base':>7}")
    for name, got in results.items():
        row = {
            "launch_p50_ms": round(_pct(got.launch, 0.5), 2),
            "launch_p95_ms": round(_pct(got.launch, 0.95), 2),
            "launch_ratio": round(statistics.median(got.launch)
                                  / statistics.median(baseline.launch), 2),
            "terminate_p50_ms": round(_pct(got.terminate, 0.5), 2),
            "terminate_p95_ms": round(_pct(got.terminate, 0.95), 2),
            "terminate_ratio": round(statistics.median(got.terminate)
                                     / statistics.median(baseline.terminate), 2),
        }
        rows[name] = row
        click.echo(f"{name:8} {row['launch_p50_ms']:>9.1f}ms {row['launch_p95_ms']:>6.1f}ms "
                   f"{row['launch_ratio']:>6.2f}x {row['terminate_p50_ms']:>12.1f}ms "
                   f"{row['terminate_p95_ms']:>6.1f}ms {row['terminate_ratio']:>6.2f}x")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "isolation.json").write_bytes(msgspec.json.format(msgspec.json.encode(
        {"rounds": rounds, "instance_type": "t3.nano", "levels": rows}), indent=2))
    click.echo(f"wrote {out_dir / 'isolation.json'}", err=True)
