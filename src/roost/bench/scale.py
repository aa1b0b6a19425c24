"""``roost bench scale``: hundreds of sim nodes, a hundred thousand live instances, one
and several gateway processes, on a 3-server NATS cluster.

Per step (``--nodes 100 --nodes 300 --nodes 1000``):

1. A 3-server NATS cluster (`NatsCluster`), the nodes as asyncio tasks (`NodeAgent`, sim
   driver) spread over ``--node-procs`` processes; each agent has its own NATS connection
   and per-type subscriptions, the agents spread over the three servers. The nodes carry
   the trace's VM flavors as instance types (``azure.<letter>``), sized so that the
   cluster holds ``--live`` of the trace's mix with ``--headroom`` to spare.
2. A `GatewayPool` of the first ``--gateway-workers`` count, SigV4 on.
3. Probe at 0: once the cluster's CPU has stopped falling (quiet windows of 5 s, at most
   ``--settle-seconds``), ``--probes`` sequential RunInstances + TerminateInstances
   (latency with nothing else running), and the gateway processes' resident memory.
4. Fill: the trace's batches (consecutive VMs of one flavor from one 300 s bin, as one
   RunInstances with MaxCount) at 32 in flight until ``--live`` instances run; each gets
   the rest of a lifetime, as at steady state.
5. Probe at ``--live`` (the same probe, and DescribeInstances: one id, a page of 1,000,
   a filtered page), memory again, and the mirror lag: how long after RunInstances
   answers the instance is describable through a fresh connection (any worker). Then
   (``--twin``) an empty twin of the cluster beside it, and the probe on both in turns
   (`probe_in_turns`): the machine's drift between the probes at 0 and at live, minutes
   apart, falls on both alike.
6. Steady: open-loop arrivals at ``--rate`` VMs/s, in trace order and spacing, each
   leaving after its lifetime scaled so that rate x mean lifetime = ``--live``
   (Little's law); departures are TerminateInstances of up to 1,000 ids.
7. Burst: ``--burst`` more launches in ``--burst-seconds`` on top of the steady load,
   with the first gateway count, then again with each further count (the pool
   restarted with N processes; the instances stay).

Latency in the open-loop phases is measured from each request's scheduled time, so a
client or gateway falling behind shows as latency, not as a lower offered rate. Every
InsufficientInstanceCapacity is checked against an oracle: each node process answers
how many of its agents' own ledgers fit one more of that type, right after the answer.
Retries per launch are the gateway's placement attempts per launched instance, minus
one, from its /metrics (summed over its processes).

Data: the Azure VM trace v1 (``../shared/data/azure-v1/``, see docs/benchmarks.md);
``--quick`` runs a small smoke of every step and figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import itertools
import json
import math
import os
import pickle
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import click

from roost.bench.launch import Connection, Signer, cpu_between, cpu_seconds, percentile
from roost.bench.report import machine
from roost.bench.traces import TraceMissing, VmTrace, default_data_dir, load_azure
from roost.bench.vm_sim import flavor_types
from roost.domain.catalog import BUILTIN, Catalog, InstanceType
from roost.domain.host import HostCapacity
from roost.domain.images import DEFAULT_IMAGE_ID
from roost.domain.resources import Resources
from roost.embedded import NatsCluster
from roost.gateway.server import GatewayConfig
from roost.gateway.workers import GatewayPool

ICE = "InsufficientInstanceCapacity"
ORACLE = "roost.bench.oracle.{group}"
IDS = re.compile(r"<instanceId>(i-[0-9a-f]+)</instanceId>")
CODE = re.compile(r"<Code>([^<]+)</Code>")
MESSAGE = re.compile(r"<Message>([^<]*)</Message>")
VERSION = "Version=2016-11-15"
KEY, SECRET = "AKIASCALEBENCH000000", "scale-bench-secret"
MAX_BATCH = 50
SUBNET_ROOM = 65_000  # a /16 subnet, less EC2's five reserved addresses, rounded down


# -- the load, from the trace ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Batch:
    """Consecutive VMs of one flavor arriving in one 300 s bin: one RunInstances."""

    time: float  # trace seconds
    itype: str
    lifetimes: tuple[float, ...]  # trace seconds


def batches(trace: VmTrace, types: Sequence[InstanceType], *, bin_seconds: int = 300
            ) -> list[Batch]:
    """The trace as RunInstances calls, spread evenly over the 300 s bin that each line
    reports (its VMs arrived since the line before). A VM still running at the trace's
    end lives to the end (its lifetime's lower bound)."""
    runs: list[tuple[int, int, list[float]]] = []
    for a in trace.arrivals:
        life = max(float((a.departs if a.departs is not None else trace.end) - a.time), 1.0)
        if runs and runs[-1][:2] == (a.time, a.flavor) and len(runs[-1][2]) < MAX_BATCH:
            runs[-1][2].append(life)
        else:
            runs.append((a.time, a.flavor, [life]))
    per_bin: dict[int, int] = {}
    for t, _, _ in runs:
        per_bin[t] = per_bin.get(t, 0) + 1
    out: list[Batch] = []
    seen: dict[int, int] = {}
    for t, flavor, lives in runs:
        j = seen[t] = seen.get(t, -1) + 1
        at = t - bin_seconds + bin_seconds * (j + 0.5) / per_bin[t]
        out.append(Batch(at, types[flavor].name, tuple(lives)))
    return out


@dataclass(frozen=True, slots=True)
class Schedule:
    """Batches with their send times (s from the phase's start) and lifetimes (s), the
    trace's spacing compressed to ``rate`` VMs/s and lifetimes scaled to ``live``."""

    items: tuple[tuple[float, Batch], ...]
    life_scale: float


def schedule(source: Sequence[Batch], *, rate: float, live: int, seconds: float,
             start: int = 0) -> Schedule:
    vms = sum(len(b.lifetimes) for b in source)
    span = max(source[-1].time - source[0].time, 1.0)
    mean_life = sum(sum(b.lifetimes) for b in source) / vms
    time_scale = (vms / rate) / span  # trace seconds -> wall seconds
    life_scale = (live / rate) / mean_life  # Little's law: live = rate x mean lifetime
    items: list[tuple[float, Batch]] = []
    offset = 0.0
    i = start
    first = source[start % len(source)].time
    while True:
        b = source[i % len(source)]
        if i and i % len(source) == 0:  # wrapped around: carry on after the last bin
            offset += span + 300
        t = (b.time - first + offset) * time_scale
        if t >= seconds:
            break
        items.append((t, b))
        i += 1
    return Schedule(tuple(items), life_scale)


def node_shape(source: Sequence[Batch], types: Sequence[InstanceType], *, live: int,
               nodes: int, headroom: float) -> Resources:
    """Per node: room for ``live`` VMs of the trace's mix, times ``headroom``, over
    ``nodes`` nodes; at least the largest flavor. Whole vCPUs and GiB."""
    by_name = {t.name: t for t in types}
    vms = sum(len(b.lifetimes) for b in source)
    cpu = sum(by_name[b.itype].cpu_milli * len(b.lifetimes) for b in source) / vms
    mem = sum(by_name[b.itype].mem_mib * len(b.lifetimes) for b in source) / vms
    per_cpu = max(cpu * live * headroom / nodes, max(t.cpu_milli for t in types))
    per_mem = max(mem * live * headroom / nodes, max(t.mem_mib for t in types))
    return Resources(math.ceil(per_cpu / 1000) * 1000, math.ceil(per_mem / 1024) * 1024)


# -- the nodes, in processes of their own ---------------------------------------------


@dataclass(frozen=True)
class NodeGroup:
    group: int
    nats_urls: list[str]
    first: int
    count: int
    shape: Resources
    catalog: Catalog
    data_dir: Path
    retention: float


def _node_main() -> None:
    """A node process: start the group's agents, answer the oracle, stop on stdin EOF."""
    group: NodeGroup = pickle.load(sys.stdin.buffer)
    asyncio.run(_serve_nodes(group))


async def _serve_nodes(g: NodeGroup) -> None:
    import nats

    from roost.node.agent import NodeAgent, NodeConfig

    agents = []
    for i in range(g.first, g.first + g.count):
        agents.append(NodeAgent(NodeConfig(
            node_id=f"s{i:04d}", nats_urls=[g.nats_urls[i % len(g.nats_urls)]],
            data_dir=g.data_dir / f"s{i:04d}", catalog=g.catalog, driver="sim",
            host=HostCapacity(total=g.shape, reserve=Resources(0, 0)), imds_port=None,
            terminated_retention_seconds=g.retention, stop_grace_seconds=1.0)))
    for k in range(0, len(agents), 25):
        await asyncio.gather(*(a.start() for a in agents[k:k + 25]))
    nc = await nats.connect(servers=list(g.nats_urls))

    async def oracle(msg: Any) -> None:
        itype = msg.data.decode()
        room = sum(1 for a in agents if itype in a.ledger.fitting_types())
        await msg.respond(str(room).encode())

    await nc.subscribe(ORACLE.format(group=g.group), cb=oracle)
    await nc.flush()
    os.write(1, b"ready\n")
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.buffer.read)
    await nc.close()
    await asyncio.gather(*(a.stop() for a in agents), return_exceptions=True)


@contextlib.contextmanager
def node_processes(groups: Sequence[NodeGroup], log: Path) -> Iterator[None]:
    procs: list[subprocess.Popen[bytes]] = []
    out = log.open("ab")
    try:
        for g in groups:
            p = subprocess.Popen([sys.executable, "-m", "roost.bench.scale", "nodes"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=out)
            assert p.stdin is not None
            p.stdin.write(pickle.dumps(g))
            p.stdin.flush()
            procs.append(p)
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline() != b"ready\n":
                raise click.ClickException(f"a node process failed; see {log}")
        yield
    finally:
        for p in procs:  # closing stdin stops it; then wait, by pid
            if p.stdin is not None:
                with contextlib.suppress(OSError):
                    p.stdin.close()
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
            if p.stdout is not None:
                p.stdout.close()
        out.close()


# -- the client -----------------------------------------------------------------------


@dataclass
class Phase:
    """What one phase measured."""

    name: str
    latencies: list[float] = field(default_factory=list)
    launched: int = 0
    requests: int = 0
    ice: int = 0
    false_ice: int = 0
    ice_beside_departures: int = 0
    """ICE with room at the oracle, but a TerminateInstances ran between the request and
    the oracle's look: the room may have been freed after the answer."""
    errors: dict[str, int] = field(default_factory=dict)
    first_messages: dict[str, str] = field(default_factory=dict)
    """Error code -> the first message seen with it."""
    wall: float = 0.0
    retries_per_launch: float | None = None
    attempts: dict[str, int] = field(default_factory=dict)
    """Placement attempts over the phase by route and outcome (`attempts_between`):
    what the retries were."""
    terminations: list[tuple[int, float]] = field(default_factory=list)
    """(ids, seconds) of each departures' TerminateInstances call."""
    gateway_gc: dict[str, float] = field(default_factory=dict)
    """The gateway's garbage collector over the phase (`gc_between`)."""
    cpu_percent: dict[str, float] = field(default_factory=dict)
    """Each role's CPU over the phase, percent of a core (`_role_cpu` roles)."""
    cpu_ms_per_launch: dict[str, float] = field(default_factory=dict)
    """Each role's CPU milliseconds per instance launched in the phase (the phase's
    departures and background included)."""

    def note_cpu(self, before: dict[str, float], after: dict[str, float]) -> None:
        """File each role's CPU from ``before`` to ``after`` (`_role_cpu` readings)."""
        if self.wall:
            self.cpu_percent = cpu_between(before, after, self.wall / 100)
        if self.launched:
            self.cpu_ms_per_launch = cpu_between(before, after, self.launched / 1000)

    def count_error(self, code: str, text: str = "") -> None:
        self.errors[code] = self.errors.get(code, 0) + 1
        if code not in self.first_messages:
            found = MESSAGE.search(text)
            self.first_messages[code] = found.group(1)[:300] if found else ""

    def summary(self) -> dict[str, Any]:
        ms = 1000.0
        return {
            "phase": self.name, "requests": self.requests, "launched": self.launched,
            "launches_per_second": round(self.launched / self.wall, 1) if self.wall else 0,
            "p50_ms": round(percentile(self.latencies, 50) * ms, 2),
            "p99_ms": round(percentile(self.latencies, 99) * ms, 2),
            "ice": self.ice, "false_ice": self.false_ice,
            "ice_beside_departures": self.ice_beside_departures, "errors": self.errors,
            "first_messages": self.first_messages,
            "retries_per_launch": self.retries_per_launch, "attempts": self.attempts,
            "seconds": round(self.wall, 2),
            "gateway_gc": self.gateway_gc,
            "cpu_percent": self.cpu_percent, "cpu_ms_per_launch": self.cpu_ms_per_launch,
            "terminate_calls": len(self.terminations),
            "terminated": sum(n for n, _ in self.terminations),
            "terminate_call_p50_ms": round(percentile([t for _, t in self.terminations], 50) * ms,
                                           2),
            "terminate_call_max_ms": round(max((t for _, t in self.terminations), default=0.0)
                                           * ms, 2),
        }


class Client:
    """Signed EC2 calls over a pool of keep-alive connections, and the live instances
    with their departure times."""

    def __init__(self, signer: Signer, *, groups: int, nats_urls: Sequence[str],
                 max_connections: int = 256) -> None:
        self.signer = signer
        self.groups = groups
        self.nats_urls = list(nats_urls)
        self._idle: list[Connection] = []
        self._open = 0
        self._slots = asyncio.Semaphore(max_connections)
        self.live: dict[str, float] = {}  # instance id -> when it leaves (loop time)
        self.departures: list[tuple[float, str]] = []
        self.subnets: list[str] = []
        self._nc: Any = None
        self._turn = 0
        self.terminating = 0
        self.last_terminated = 0.0

    async def start(self) -> None:
        import nats

        self._nc = await nats.connect(servers=self.nats_urls)

    async def retarget(self, signer: Signer) -> None:
        """Send from now on to ``signer``'s endpoint (a restarted gateway)."""
        self.signer = signer
        idle, self._idle = self._idle, []
        for c in idle:
            await c.close()

    async def close(self) -> None:
        await self.retarget(self.signer)
        if self._nc is not None:
            await self._nc.close()

    async def call(self, body: str) -> tuple[int, str]:
        """One signed call. A pooled connection the server closed while idle (uvicorn
        keeps one 5 s) is replaced and the call sent again, once."""
        async with self._slots:
            data = body.encode()
            for fresh in (False, True):
                conn = (self._idle.pop() if self._idle and not fresh
                        else Connection(self.signer.url))
                try:
                    status, text = await conn.post(data, self.signer.headers(data))
                except (OSError, ValueError, IndexError, asyncio.IncompleteReadError) as exc:
                    await conn.close()
                    if fresh:
                        return 0, f"<Code>Client.{type(exc).__name__}</Code>"
                    continue
                self._idle.append(conn)
                return status, text
            raise AssertionError("unreachable")

    def run_body(self, itype: str, count: int, token: str = "") -> str:
        subnet = ""
        if self.subnets:
            self._turn += 1
            subnet = f"&SubnetId={self.subnets[self._turn % len(self.subnets)]}"
        extra = f"&ClientToken={token}" if token else ""
        return (f"Action=RunInstances&{VERSION}&ImageId={DEFAULT_IMAGE_ID}"
                f"&InstanceType={itype}&MinCount=1&MaxCount={count}{subnet}{extra}")

    async def launch(self, phase: Phase, batch: Batch, *, life_scale: float,
                     scheduled: float, residual: bool = False) -> None:
        loop = asyncio.get_running_loop()
        phase.requests += 1
        sent = loop.time()
        status, text = await self.call(self.run_body(batch.itype, len(batch.lifetimes)))
        now = loop.time()
        phase.latencies.append(now - scheduled)
        ids = IDS.findall(text) if status == 200 else []
        if status != 200:
            code = (CODE.findall(text) or ["unknown"])[0]
            if code == ICE:
                phase.ice += 1
                room = await self.oracle_room(batch.itype)
                if room and (self.terminating or self.last_terminated >= sent):
                    phase.ice_beside_departures += 1
                elif room:
                    phase.false_ice += 1
            else:
                phase.count_error(code, text)
            return
        phase.launched += len(ids)
        for iid, life in zip(ids, batch.lifetimes, strict=False):
            stay = life * life_scale * (random.random() if residual else 1.0)
            self.live[iid] = now + stay
            heapq.heappush(self.departures, (now + stay, iid))

    async def oracle_room(self, itype: str) -> int:
        """How many nodes' own ledgers fit one more ``itype`` now."""
        replies = await asyncio.gather(*(
            self._nc.request(ORACLE.format(group=g), itype.encode(), timeout=10)
            for g in range(self.groups)), return_exceptions=True)
        return sum(int(r.data) for r in replies if not isinstance(r, BaseException))

    async def depart_due(self, phase: Phase | None = None) -> int:
        """TerminateInstances of every instance whose time has come (1,000 per call)."""
        now = asyncio.get_running_loop().time()
        due: list[str] = []
        while self.departures and self.departures[0][0] <= now:
            _, iid = heapq.heappop(self.departures)
            if self.live.pop(iid, None) is not None:
                due.append(iid)
        calls = [due[k:k + 1000] for k in range(0, len(due), 1000)]
        for chunk in calls:
            ids = "&".join(f"InstanceId.{n + 1}={iid}" for n, iid in enumerate(chunk))
            self.terminating += 1
            sent = time.perf_counter()
            try:
                status, text = await self.call(f"Action=TerminateInstances&{VERSION}&{ids}")
            finally:
                self.terminating -= 1
                self.last_terminated = asyncio.get_running_loop().time()
            if phase is not None:
                phase.terminations.append((len(chunk), time.perf_counter() - sent))
            if status != 200 and phase is not None:
                phase.count_error("Terminate." + (CODE.findall(text) or ["unknown"])[0], text)
        return len(due)


async def open_loop(client: Client, phase: Phase, sched: Schedule) -> None:
    """Send each batch at its time (never waiting on earlier answers), and the due
    departures every 100 ms."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    pending: set[asyncio.Task[Any]] = set()

    def spawn(work: Coroutine[Any, Any, Any]) -> None:
        async def counted() -> None:
            try:
                await work
            except Exception as exc:  # a client-side bug is a figure, not a lost task
                phase.count_error(f"Client.{type(exc).__name__}", f"<Message>{exc}</Message>")

        task = asyncio.create_task(counted())
        pending.add(task)
        task.add_done_callback(pending.discard)
    items = list(sched.items)
    k = 0
    last_departure = start
    while k < len(items):
        now = loop.time()
        while k < len(items) and start + items[k][0] <= now:
            t, b = items[k]
            spawn(client.launch(phase, b, life_scale=sched.life_scale, scheduled=start + t))
            k += 1
        if now - last_departure >= 0.1:
            last_departure = now
            spawn(client.depart_due(phase))
        nxt = start + items[k][0] if k < len(items) else now
        await asyncio.sleep(max(0.0, min(nxt - loop.time(), 0.05)))
    await asyncio.gather(*pending)
    phase.wall = loop.time() - start


async def fill(client: Client, source: Sequence[Batch], *, live: int, life_scale: float,
               concurrency: int = 32, say: Any = None) -> Phase:
    """Launch the trace's batches, ``concurrency`` at a time, until ``live`` run."""
    phase = Phase("fill")
    loop = asyncio.get_running_loop()
    started = loop.time()
    told = 0
    turn = iter(range(10**9))
    asked = 0  # instances asked for and not yet answered

    async def worker() -> None:
        nonlocal asked, told
        while phase.requests < live * 4:
            b = source[next(turn) % len(source)]
            want = min(len(b.lifetimes), live - len(client.live) - asked)
            if want <= 0:
                return
            asked += want
            try:
                await client.launch(phase, replace(b, lifetimes=b.lifetimes[:want]),
                                    life_scale=life_scale, scheduled=loop.time(),
                                    residual=True)
            finally:
                asked -= want
            if say is not None and len(client.live) >= told + live // 10:
                told = len(client.live)
                say(f"  fill: {told} live after {loop.time() - started:.0f} s")

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    phase.wall = loop.time() - started
    return phase


def _role_cpu() -> dict[str, float]:
    """CPU seconds so far of this process ("client") and its children by role (gateway
    processes, NATS servers, node processes)."""
    out = cpu_seconds(os.getpid())
    out["client"] = out.pop("up")
    return out


SETTLE_FALL = 0.1
"""A quiet window whose cluster CPU fell by more than this share of the window before it
(and one point of a core besides, the readings' grain) shows a cluster still calming
down: after 1,000 agents start, or after a fill, their catch-up work takes a while."""
RESTING_STEPS = 2
"""Steps from one quiet window to the next in a row that must not fall (`still_falling`)
before a cluster counts as at rest. One is not enough: after a fill of 100,000, one
step fell from 46.4 % to 41.6 %, a hair short of falling, and the probes began while
the catch-up still had 20-30 s to run (the cluster rested near 20 %)."""


def still_falling(before: float, now: float) -> bool:
    """Whether the cluster's CPU (percent of a core) fell from one quiet window to the
    next by more than `SETTLE_FALL` of it and a point: not yet at rest."""
    return now < before * (1 - SETTLE_FALL) - 1.0


def at_rest(windows: Sequence[float]) -> bool:
    """Whether the last `RESTING_STEPS` steps between quiet windows' CPU readings (oldest
    first) all held level or rose."""
    last = windows[-RESTING_STEPS - 1:]
    return len(last) > RESTING_STEPS and not any(
        still_falling(a, b) for a, b in itertools.pairwise(last))


def _cluster_percent(c0: dict[str, float], c1: dict[str, float], idle: float) -> float:
    """Every role's CPU but the client's, as percent of a core, between two readings."""
    return sum(v for k, v in cpu_between(c0, c1, idle / 100).items() if k != "client")


async def settle(idle: float, most: float) -> tuple[dict[str, float], dict[str, float],
                                                    list[float]]:
    """Quiet windows of ``idle`` seconds, one after another, until the cluster is at rest
    (`at_rest`: its CPU has stopped falling) or ``most`` seconds have gone: the probes
    then measure a cluster at rest, not one still catching up. Returns the last window's
    two readings and every window's cluster CPU (percent of a core)."""
    c0 = c1 = _role_cpu()
    windows: list[float] = []
    while not windows or (len(windows) * idle < most and not at_rest(windows)):
        c0 = c1
        await asyncio.sleep(idle)
        c1 = _role_cpu()
        windows.append(_cluster_percent(c0, c1, idle))
    return c0, c1, [round(w, 1) for w in windows]


async def probe(client: Client, n: int, itype: str, idle: float,
                settle_most: float) -> dict[str, Any]:
    """``n`` sequential RunInstances + TerminateInstances of one ``itype``, and how long
    after each answer the instance is describable through a fresh connection. Before
    them, quiet windows of ``idle`` seconds until the cluster's CPU stops falling (at
    most ``settle_most`` seconds, `settle`); the last one gives each role's CPU at rest
    (percent of a core: what the cluster spends with nothing asked of it). Over the
    probes, each role's CPU milliseconds per probe (which includes that background)."""
    c0, c1, windows = await settle(idle, settle_most)
    runs: list[float] = []
    lags: list[float] = []
    errors = 0
    for _ in range(n):
        got = await _probe_once(client, itype)
        if got is None:
            errors += 1
            continue
        runs.append(got[0])
        lags.append(got[1])
    c2 = _role_cpu()
    ms = 1000.0
    return {"probes": n, "errors": errors,
            "idle_cpu_percent": cpu_between(c0, c1, idle / 100), "idle_seconds": idle,
            "settle_windows_cpu_percent": windows,
            "cpu_ms_per_probe": cpu_between(c1, c2, n / ms),
            **_run_ms(runs),
            "mirror_lag_p50_ms": round(percentile(lags, 50) * ms, 2),
            "mirror_lag_max_ms": round(max(lags, default=0.0) * ms, 2)}


def _run_ms(runs: Sequence[float]) -> dict[str, float]:
    """p50 and p99 of probe answer times (seconds), in ms."""
    return {"run_p50_ms": round(percentile(runs, 50) * 1000.0, 2),
            "run_p99_ms": round(percentile(runs, 99) * 1000.0, 2)}


async def _probe_once(client: Client, itype: str) -> tuple[float, float] | None:
    """One RunInstances of one ``itype``, then its TerminateInstances: (seconds to the
    answer, seconds from the answer until it is describable), or None on an error."""
    started = time.perf_counter()
    status, text = await client.call(client.run_body(itype, 1))
    answered = time.perf_counter()
    ids = IDS.findall(text)
    if status != 200 or not ids:
        return None
    lag = await _describable(client, ids[0], answered)
    await client.call(f"Action=TerminateInstances&{VERSION}&InstanceId.1={ids[0]}")
    return answered - started, lag


async def probe_in_turns(live: Client, empty: Client, n: int, itype: str, idle: float,
                         settle_most: float) -> dict[str, Any]:
    """The probe on two clusters at once, in turns: ``live``'s, full, and ``empty``'s, a
    twin with nothing running. Whatever else the machine does then (2 shared cores
    whose speed drifts by half between runs minutes apart) falls on both alike, which
    the probes at 0 and at live, minutes apart, cannot promise. Which cluster goes
    first alternates from pair to pair."""
    _, _, windows = await settle(idle, settle_most)
    runs: dict[str, list[float]] = {"live": [], "empty": []}
    errors = dict.fromkeys(runs, 0)
    for k in range(n):
        pair = [("empty", empty), ("live", live)]
        for name, client in pair if k % 2 == 0 else pair[::-1]:
            got = await _probe_once(client, itype)
            if got is None:
                errors[name] += 1
            else:
                runs[name].append(got[0])
    out: dict[str, Any] = {"probes": n, "settle_windows_cpu_percent": windows}
    for name, xs in runs.items():
        out[name] = {**_run_ms(xs), "errors": errors[name]}
    p0, p1 = out["empty"]["run_p50_ms"], out["live"]["run_p50_ms"]
    out["ratio"] = round(p1 / p0, 2) if p0 else None
    return out


async def _describable(client: Client, iid: str, since: float) -> float:
    body = f"Action=DescribeInstances&{VERSION}&InstanceId.1={iid}".encode()
    while time.perf_counter() - since < 10:
        conn = Connection(client.signer.url)  # a fresh one: any worker may take it
        try:
            status, _ = await conn.post(body, client.signer.headers(body))
        finally:
            await conn.close()
        if status == 200:
            return time.perf_counter() - since
        await asyncio.sleep(0.005)
    return float("inf")


async def describe_latency(client: Client, n: int, itype: str) -> dict[str, Any]:
    iid = next(iter(client.live), "i-00000000000000000")
    calls = {
        "one_id": f"Action=DescribeInstances&{VERSION}&InstanceId.1={iid}",
        "page_1000": f"Action=DescribeInstances&{VERSION}&MaxResults=1000",
        "filtered_page_1000": (f"Action=DescribeInstances&{VERSION}&MaxResults=1000"
                               f"&Filter.1.Name=instance-type&Filter.1.Value.1={itype}"),
    }
    out: dict[str, Any] = {}
    for name, body in calls.items():
        lat = []
        for _ in range(n):
            started = time.perf_counter()
            status, _ = await client.call(body)
            if status == 200:
                lat.append(time.perf_counter() - started)
        out[name] = {"p50_ms": round(percentile(lat, 50) * 1000, 2),
                     "p99_ms": round(percentile(lat, 99) * 1000, 2), "ok": len(lat)}
    return out


# -- the gateway ----------------------------------------------------------------------


def _scrape(endpoint: str) -> str:
    with urllib.request.urlopen(endpoint.rstrip("/") + "/metrics", timeout=30) as resp:
        return str(resp.read().decode())


LABEL = re.compile(r'(\w+)="([^"]*)"')


def _counters(endpoint: str) -> dict[str, float]:
    """The gateway's counters the bench reads: placement attempts (in all, and as
    "attempts <route> <outcome>"), instances launched, and its garbage collector's
    pauses (full collections, and seconds of all)."""
    out = {"attempts": 0.0, "launched": 0.0, "full_collections": 0.0, "gc_seconds": 0.0}
    for line in _scrape(endpoint).splitlines():
        value = line.rsplit(" ", 1)[-1]
        if line.startswith("roost_placement_attempts_total{"):
            out["attempts"] += float(value)
            labels = dict(LABEL.findall(line))
            key = f"attempts {labels.get('route', '')} {labels.get('outcome', '')}"
            out[key] = out.get(key, 0.0) + float(value)
        elif line.startswith('roost_launches_total{outcome="launched"}'):
            out["launched"] += float(value)
        elif line.startswith('roost_gateway_gc_seconds_count{generation="2"}'):
            out["full_collections"] += float(value)
        elif line.startswith("roost_gateway_gc_seconds_sum{"):
            out["gc_seconds"] += float(value)
    return out


def attempts_between(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    """Placement attempts from ``before`` to ``after`` (`_counters`), by route and
    outcome ("anycast no_capacity": 120), the ones that happened only."""
    return {k.removeprefix("attempts "): int(after[k] - before.get(k, 0.0)) for k in
            sorted(after) if k.startswith("attempts ") and after[k] > before.get(k, 0.0)}


def gc_between(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The gateway's collector over a phase: full collections, and seconds paused."""
    return {"full_collections": after["full_collections"] - before["full_collections"],
            "seconds": round(after["gc_seconds"] - before["gc_seconds"], 3)}


def rss_mib(pids: Sequence[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total / 1024


async def wait_nodes(endpoint: str, nodes: int, timeout: float = 300.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    seen = 0
    async with httpx.AsyncClient(timeout=10) as http:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                body = (await http.get(endpoint + "/healthz")).json()
                seen = int(body.get("live_nodes", 0))
                if body.get("status") == "ok" and seen >= nodes:
                    return
            await asyncio.sleep(0.5)
    raise click.ClickException(f"the gateway saw {seen} of {nodes} nodes after {timeout:g} s")


async def make_subnets(client: Client, count: int) -> list[str]:
    """``count`` VPCs of a /16 subnet each in the nodes' zone (a default subnet is a /20:
    4,091 addresses)."""
    subnets = []
    for k in range(count):
        _, text = await client.call(f"Action=CreateVpc&{VERSION}&CidrBlock=10.{k}.0.0/16")
        vpc = re.search(r"<vpcId>([^<]+)</vpcId>", text)
        if vpc is None:
            raise click.ClickException(f"CreateVpc failed: {text[:300]}")
        _, text = await client.call(
            f"Action=CreateSubnet&{VERSION}&VpcId={vpc.group(1)}&CidrBlock=10.{k}.0.0/16"
            "&AvailabilityZone=roost-1a")
        subnet = re.search(r"<subnetId>([^<]+)</subnetId>", text)
        if subnet is None:
            raise click.ClickException(f"CreateSubnet failed: {text[:300]}")
        subnets.append(subnet.group(1))
    return subnets


# -- one step -------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    live: int
    rate: float
    steady_seconds: float
    burst: int
    burst_seconds: float
    gateway_workers: tuple[int, ...]
    node_procs: int
    headroom: float
    probes: int
    retention: float
    idle_seconds: float = 5.0
    """The quiet window before each probe in which each role's background CPU is read."""
    settle_seconds: float = 60.0
    """The longest wait, in quiet windows, for the cluster's CPU to stop falling before
    each probe (`settle`)."""
    twin: bool = True
    """Also probe in turns with an empty twin of the cluster (`probe_in_turns`)."""


def burst_schedule(source: Sequence[Batch], *, count: int, seconds: float,
                   life_scale: float, start: int) -> Schedule:
    """``count`` VMs in batches from the trace, evenly over ``seconds``."""
    chosen: list[Batch] = []
    vms = 0
    i = start
    while vms < count:
        b = source[i % len(source)]
        b = replace(b, lifetimes=b.lifetimes[:count - vms])
        chosen.append(b)
        vms += len(b.lifetimes)
        i += 1
    gap = seconds / len(chosen)
    return Schedule(tuple((k * gap, b) for k, b in enumerate(chosen)), life_scale)


def merge(a: Schedule, b: Schedule) -> Schedule:
    """Both schedules' items, in time order (each batch keeps its own life scale)."""
    items = [(t, replace(x, lifetimes=tuple(v * a.life_scale for v in x.lifetimes)))
             for t, x in a.items]
    items += [(t, replace(x, lifetimes=tuple(v * b.life_scale for v in x.lifetimes)))
              for t, x in b.items]
    return Schedule(tuple(sorted(items, key=lambda it: it[0])), 1.0)


async def run_step(nodes: int, source: Sequence[Batch], types: Sequence[InstanceType],
                   s: Settings, work: Path, say: Any) -> dict[str, Any]:
    shape = node_shape(source, types, live=s.live, nodes=nodes, headroom=s.headroom)
    say(f"step {nodes} nodes of {shape.cpu_milli // 1000} vCPU / "
        f"{shape.mem_mib // 1024} GiB, {s.live} live instances")
    result: dict[str, Any] = {"nodes": nodes, "node_vcpu": shape.cpu_milli // 1000,
                              "node_gib": shape.mem_mib // 1024, "live_target": s.live}
    started = time.perf_counter()
    with cluster(nodes, shape, types, s, work / "live") as (urls, groups):
        result["nodes_start_seconds"] = round(time.perf_counter() - started, 1)
        twin = functools.partial(cluster, nodes, shape, types, s, work / "empty")
        result.update(await _measure(urls, nodes, groups, source, types, s, say,
                                     twin if s.twin else None))
    return result


@contextlib.contextmanager
def cluster(nodes: int, shape: Resources, types: Sequence[InstanceType], s: Settings,
            work: Path) -> Iterator[tuple[list[str], int]]:
    """A 3-server NATS cluster and ``nodes`` sim agents of ``shape`` over
    ``s.node_procs`` processes, all under ``work``: yields the NATS URLs and how many
    node processes there are; stops them all on the way out."""
    nats_cluster = NatsCluster(3, base_dir=work / "nats").start()
    try:
        per = math.ceil(nodes / s.node_procs)
        groups = [NodeGroup(g, nats_cluster.urls, g * per, min(per, nodes - g * per), shape,
                            Catalog(types), work / "nodes", s.retention)
                  for g in range(s.node_procs) if g * per < nodes]
        with node_processes(groups, work / "nodes.log"):
            yield nats_cluster.urls, len(groups)
    finally:
        nats_cluster.stop()


async def _pool(urls: Sequence[str], workers: int, types: Sequence[InstanceType],
                nodes: int) -> GatewayPool:
    pool = GatewayPool(GatewayConfig(nats_urls=list(urls), port=0, credentials={KEY: SECRET},
                                     catalog=BUILTIN.with_types(types),
                                     max_instances_per_request=MAX_BATCH), workers)
    await pool.start()
    try:
        await wait_nodes(pool.endpoint, nodes)
    except BaseException:  # not every node seen: the pool is not handed out, so stop it
        await pool.stop()
        raise
    return pool


Twin = Callable[[], contextlib.AbstractContextManager[tuple[list[str], int]]]
"""Starts a cluster like the step's, empty (`cluster`), for the probe in turns."""


async def _measure(urls: Sequence[str], nodes: int, groups: int, source: Sequence[Batch],
                   types: Sequence[InstanceType], s: Settings, say: Any,
                   twin: Twin | None) -> dict[str, Any]:
    first, *others = s.gateway_workers
    out: dict[str, Any] = {}
    pool = await _pool(urls, first, types, nodes)
    client = Client(Signer(pool.endpoint, KEY, SECRET, "roost-1"), groups=groups,
                    nats_urls=urls)
    await client.start()
    try:
        client.subnets = await make_subnets(client, math.ceil(s.live * 1.2 / SUBNET_ROOM))
        probe_type = types[0].name
        rss0 = rss_mib(pool.pids)
        c0 = _counters(pool.endpoint)
        out["probe_at_0"] = await probe(client, s.probes, probe_type, s.idle_seconds,
                                          s.settle_seconds)
        c1 = _counters(pool.endpoint)
        out["probe_at_0"]["gateway_gc"] = gc_between(c0, c1)
        say(f"  probe at 0: {out['probe_at_0']}")
        steady = schedule(source, rate=s.rate, live=s.live, seconds=s.steady_seconds)
        r0 = _role_cpu()
        ph = await fill(client, source, live=s.live, life_scale=steady.life_scale, say=say)
        ph.note_cpu(r0, _role_cpu())
        c2 = _counters(pool.endpoint)
        ph.gateway_gc = gc_between(c1, c2)
        out["fill"] = ph.summary()
        say(f"  fill: {out['fill']}")
        out["live_after_fill"] = len(client.live)
        rss1 = rss_mib(pool.pids)
        out["probe_at_live"] = await probe(client, s.probes, probe_type, s.idle_seconds,
                                          s.settle_seconds)
        out["probe_at_live"]["gateway_gc"] = gc_between(c2, _counters(pool.endpoint))
        say(f"  probe at {len(client.live)} live: {out['probe_at_live']}")
        out["describe_at_live"] = await describe_latency(client, max(5, s.probes // 4),
                                                         probe_type)
        say(f"  describe at {len(client.live)} live: {out['describe_at_live']}")
        if twin is not None:
            try:
                out["probe_in_turns"] = await _in_turns(client, twin, nodes, types, s,
                                                        probe_type)
            except (RuntimeError, TimeoutError, OSError, click.ClickException) as exc:
                # Keep the step going: a twin that cannot start is a result too.
                out["probe_in_turns"] = {"failed": f"the empty twin did not start: {exc}"}
            say(f"  probe in turns with an empty twin: {out['probe_in_turns']}")
        grown = max(rss1 - rss0, 0.0) / first
        out["gateway_rss_mib"] = {"before": round(rss0, 1), "after_fill": round(rss1, 1),
                                  "processes": first,
                                  "per_100k_instances_per_process": round(
                                      grown / max(len(client.live), 1) * 100_000, 1)}
        ph = Phase("steady")
        await _timed(client, pool.endpoint, ph, steady)
        out["steady"] = ph.summary()
        say(f"  steady: {out['steady']}")
        out["bursts"] = []
        for n, workers in enumerate((first, *others)):
            if n:
                await pool.stop()
                try:
                    pool = await _pool(urls, workers, types, nodes)
                except (RuntimeError, TimeoutError, OSError, click.ClickException) as exc:
                    # Keep what was measured: a pool that cannot start is a result too.
                    out["bursts"].append({"gateway_processes": workers,
                                          "failed": f"the gateway pool did not start: {exc}"})
                    say(f"  burst with {workers} gateway processes: not run ({exc})")
                    break
                await client.retarget(Signer(pool.endpoint, KEY, SECRET, "roost-1"))
            burst = burst_schedule(source, count=s.burst, seconds=s.burst_seconds,
                                   life_scale=steady.life_scale, start=len(steady.items))
            background = schedule(source, rate=s.rate, live=s.live,
                                  seconds=s.burst_seconds, start=len(steady.items))
            ph = Phase(f"burst_{workers}_gateways")
            await _timed(client, pool.endpoint, ph, merge(burst, background))
            out["bursts"].append({"gateway_processes": workers, **ph.summary()})
            say(f"  burst with {workers} gateway processes: {out['bursts'][-1]}")
        out["live_at_end"] = len(client.live)
    finally:
        await client.close()
        await pool.stop()
    return out


async def _in_turns(live: Client, twin: Twin, nodes: int, types: Sequence[InstanceType],
                    s: Settings, probe_type: str) -> dict[str, Any]:
    """Start an empty twin of the step's cluster (its own NATS servers, nodes and one
    gateway process, the same subnets), probe both in turns (`probe_in_turns`), and
    stop the twin again before the load phases."""
    with twin() as (urls, groups):
        pool = await _pool(urls, 1, types, nodes)
        empty = Client(Signer(pool.endpoint, KEY, SECRET, "roost-1"), groups=groups,
                       nats_urls=urls)
        try:
            await empty.start()
            empty.subnets = await make_subnets(empty, len(live.subnets))
            _, page = await empty.call(f"Action=DescribeInstances&{VERSION}&MaxResults=5")
            out = await probe_in_turns(live, empty, s.probes, probe_type, s.idle_seconds,
                                       s.settle_seconds)
            out["empty_instances_before"] = len(IDS.findall(page))  # the twin's, 0
            return out
        finally:
            await empty.close()
            await pool.stop()


async def _timed(client: Client, endpoint: str, phase: Phase, sched: Schedule) -> None:
    c0, r0 = _counters(endpoint), _role_cpu()
    await open_loop(client, phase, sched)
    c1 = _counters(endpoint)
    phase.note_cpu(r0, _role_cpu())
    if c1["launched"] > c0["launched"]:
        phase.retries_per_launch = round(
            (c1["attempts"] - c0["attempts"]) / (c1["launched"] - c0["launched"]) - 1, 4)
    phase.attempts = attempts_between(c0, c1)
    phase.gateway_gc = gc_between(c0, c1)


# -- report ---------------------------------------------------------------------------


def format_markdown(report: dict[str, Any]) -> str:
    lines = [f"# roost bench scale ({'quick' if report['quick'] else 'full'})", "",
             f"Trace: {report['trace']}. Machine: {report['machine']['cores']} cores, "
             f"Python {report['machine']['python']}; shared with other work, so figures "
             "are as measured under that load.", "",
             "| nodes | live | phase | gateways | launches/s | p50 ms | p99 ms | "
             "retries/launch | ICE | false ICE | ICE beside departures | errors |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for st in report["steps"]:
        rows = [(st["fill"], st["gateway_workers"][0]), (st["steady"], st["gateway_workers"][0])]
        rows += [(b, b["gateway_processes"]) for b in st["bursts"] if "failed" not in b]
        for ph, gw in rows:
            lines.append(
                f"| {st['nodes']} | {st['live_after_fill']} | {ph['phase']} | {gw} | "
                f"{ph['launches_per_second']} | {ph['p50_ms']} | {ph['p99_ms']} | "
                f"{ph['retries_per_launch']} | {ph['ice']} | {ph['false_ice']} | "
                f"{ph['ice_beside_departures']} | {sum(ph['errors'].values())} |")
        lines += [f"| {st['nodes']} | {st['live_after_fill']} | burst | "
                  f"{b['gateway_processes']} | {b['failed']} |" + " |" * 7
                  for b in st["bursts"] if "failed" in b]
    lines += ["", "| nodes | probe p50 at 0 / at live ms | ratio | mirror lag p50 / max ms "
              "| gateway MiB per 100k instances (per process) | DescribeInstances p50 ms: "
              "one id / page of 1,000 / filtered page |", "|---|---|---|---|---|---|"]
    for st in report["steps"]:
        p0, p1 = st["probe_at_0"], st["probe_at_live"]
        d = st["describe_at_live"]
        lines.append(
            f"| {st['nodes']} | {p0['run_p50_ms']} / {p1['run_p50_ms']} | "
            f"{st['latency_ratio']} | {p1['mirror_lag_p50_ms']} / {p1['mirror_lag_max_ms']}"
            f" | {st['gateway_rss_mib']['per_100k_instances_per_process']} | "
            f"{d['one_id']['p50_ms']} / {d['page_1000']['p50_ms']} / "
            f"{d['filtered_page_1000']['p50_ms']} |")
    turns = [st for st in report["steps"] if "ratio" in st.get("probe_in_turns", {})]
    if turns:
        lines += ["", "The probe in turns with an empty twin of the cluster (its own NATS "
                  "servers, nodes and gateway, started after the fill), so that the "
                  "machine's drift falls on both:", "",
                  "| nodes | probes each | p50 ms: empty / live | ratio | p99 ms: empty / live "
                  "| errors: empty / live |", "|---|---|---|---|---|---|"]
        for st in turns:
            t = st["probe_in_turns"]
            e, v = t["empty"], t["live"]
            lines.append(f"| {st['nodes']} | {t['probes']} | {e['run_p50_ms']} / "
                         f"{v['run_p50_ms']} | {t['ratio']} | {e['run_p99_ms']} / "
                         f"{v['run_p99_ms']} | {e['errors']} / {v['errors']} |")
    lines += ["", "Where the probes' time went, by role: CPU in the quiet "
              f"{report['settings']['idle_seconds']:g} s before the probes (percent of a core), "
              "and CPU per probe "
              "(ms, the background included).", "",
              "| nodes | probe | role | idle CPU % | CPU ms per probe |", "|---|---|---|---|---|"]
    for st in report["steps"]:
        for at in ("probe_at_0", "probe_at_live"):
            pr = st[at]
            lines += [f"| {st['nodes']} | {at.removeprefix('probe_')} | {role} | "
                      f"{pr['idle_cpu_percent'].get(role, '')} | {ms} |"
                      for role, ms in pr.get("cpu_ms_per_probe", {}).items()]
    lines += ["", "Where each phase's CPU went, by role: percent of a core over the phase, and "
              "ms per instance launched (the phase's departures and background included).", "",
              "| nodes | phase | role | CPU % | CPU ms per launch |", "|---|---|---|---|---|"]
    for st in report["steps"]:
        for ph in (st["fill"], st["steady"], *(b for b in st["bursts"] if "failed" not in b)):
            lines += [f"| {st['nodes']} | {ph['phase']} | {role} | {pct} | "
                      f"{ph.get('cpu_ms_per_launch', {}).get(role, '')} |"
                      for role, pct in ph.get("cpu_percent", {}).items()]
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = report["steps"]
    fig, (lat, rate) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = ["fill", "steady"]
    xs = [st["nodes"] for st in steps]
    for name in names:
        lat.plot(xs, [st[name]["p50_ms"] for st in steps], marker="o", label=f"{name} p50")
        rate.plot(xs, [st[name]["launches_per_second"] for st in steps], marker="o",
                  label=name)
    for k in range(len(steps[0]["bursts"]) if steps else 0):
        if any(len(st["bursts"]) <= k or "failed" in st["bursts"][k] for st in steps):
            continue  # that pool did not start: nothing to draw
        gw = steps[0]["bursts"][k]["gateway_processes"]
        lat.plot(xs, [st["bursts"][k]["p50_ms"] for st in steps], marker="s",
                 label=f"burst p50, {gw} gw")
        rate.plot(xs, [st["bursts"][k]["launches_per_second"] for st in steps], marker="s",
                  label=f"burst, {gw} gw")
    lat.plot(xs, [st["probe_at_0"]["run_p50_ms"] for st in steps], "kx--", label="probe at 0")
    lat.plot(xs, [st["probe_at_live"]["run_p50_ms"] for st in steps], "k+:",
             label="probe at live")
    turns = [st for st in steps if "ratio" in st.get("probe_in_turns", {})]
    if turns:
        for side, style, label in (("empty", "bx--", "in turns: empty twin"),
                                   ("live", "b+:", "in turns: live")):
            lat.plot([st["nodes"] for st in turns],
                     [st["probe_in_turns"][side]["run_p50_ms"] for st in turns], style,
                     label=label)
    lat.set(xlabel="sim nodes", ylabel="RunInstances ms", title="latency", yscale="log")
    rate.set(xlabel="sim nodes", ylabel="instances launched / s", title="throughput")
    for ax in (lat, rate):
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)




@click.command("scale")
@click.option("--nodes", "steps", multiple=True, type=click.IntRange(min=1),
              default=[100, 300, 1000], show_default=True, help="Repeat: one step each.")
@click.option("--live", type=click.IntRange(min=1), default=100_000, show_default=True,
              help="Instances live at steady state.")
@click.option("--rate", type=click.FloatRange(min=0.1), default=100.0, show_default=True,
              help="Steady arrivals, VMs per second (lifetimes are scaled to --live).")
@click.option("--steady-seconds", type=click.FloatRange(min=1), default=60.0,
              show_default=True)
@click.option("--burst", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="Extra launches in --burst-seconds, on top of the steady load.")
@click.option("--burst-seconds", type=click.FloatRange(min=1), default=60.0,
              show_default=True)
@click.option("--gateway-workers", multiple=True, type=click.IntRange(min=1),
              default=[1, 4], show_default=True,
              help="Gateway processes; the burst runs once with each.")
@click.option("--node-procs", type=click.IntRange(min=1), default=4, show_default=True,
              help="Processes the nodes' asyncio tasks are spread over.")
@click.option("--headroom", type=click.FloatRange(min=1.0), default=1.3, show_default=True,
              help="Cluster capacity over the steady state's demand.")
@click.option("--probes", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--settle-seconds", type=click.FloatRange(min=0), default=60.0,
              show_default=True,
              help="Before each probe, wait up to this long, in 5 s quiet windows, for the "
                   "cluster's CPU to stop falling.")
@click.option("--twin/--no-twin", default=True, show_default=True,
              help="After the probe at live, start an empty twin of the cluster and "
                   "probe both in turns, so that the machine's drift falls on both.")
@click.option("--terminated-retention", type=click.FloatRange(min=1), default=300.0,
              show_default=True, help="Seconds the nodes keep terminated instances.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Holds azure-v1/ [default: ../shared/data].")
@click.option("--quick", is_flag=True,
              help="Smoke: 8 nodes in 1 process, 200 live, a 60-launch burst, 1 and 2 gateways.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="Write scale.json, scale.md and scale.png here.")
def scale(steps: tuple[int, ...], live: int, rate: float, steady_seconds: float, burst: int,
          burst_seconds: float, gateway_workers: tuple[int, ...], node_procs: int,
          headroom: float, probes: int, settle_seconds: float, twin: bool,
          terminated_retention: float, data_dir: Path | None, quick: bool,
          out_dir: Path | None) -> None:
    """Hundreds of sim nodes and ~100,000 live instances from the Azure VM trace: launch
    rate and latency, retries, false capacity errors, gateway memory, mirror lag and
    DescribeInstances, with 1 and 4 gateway processes, on a 3-server NATS cluster."""
    if quick:
        steps, live, rate, steady_seconds, burst, burst_seconds = (8,), 200, 40.0, 2.0, \
            60, 1.5
        gateway_workers, node_procs, probes = (1, 2), 1, 4
    data = data_dir or default_data_dir()
    try:
        trace = load_azure(data)
    except TraceMissing as exc:
        raise click.ClickException(str(exc)) from None
    types = flavor_types(trace)
    source = batches(trace, types)
    settings = Settings(live, rate, steady_seconds, burst, burst_seconds,
                        tuple(dict.fromkeys(gateway_workers)), node_procs, headroom, probes,
                        terminated_retention, idle_seconds=1.0 if quick else 5.0,
                        settle_seconds=min(settle_seconds, 3.0) if quick else settle_seconds,
                        twin=twin)
    report: dict[str, Any] = {
        "quick": quick, "machine": machine(), "trace": "azure-v1 test split",
        "settings": {**settings.__dict__, "gateway_workers": list(settings.gateway_workers)},
        "steps": []}

    def say(text: str) -> None:
        click.echo(text, err=True)

    # SIGTERM unwinds like Ctrl-C, so the servers and processes started are stopped (a
    # background job may have SIGINT ignored).
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        for nodes in steps:
            _step(nodes, source, types, settings, report, out_dir, say)
    finally:
        signal.signal(signal.SIGTERM, previous)
    click.echo(format_markdown(report))


def _step(nodes: int, source: Sequence[Batch], types: Sequence[InstanceType],
          settings: Settings, report: dict[str, Any], out_dir: Path | None,
          say: Any) -> None:
    """Run one step and add it to ``report`` (written to ``out_dir`` at once)."""
    with tempfile.TemporaryDirectory(prefix="roost-scale-") as tmp:
        step = asyncio.run(run_step(nodes, source, types, settings, Path(tmp), say))
    p0, p1 = step["probe_at_0"]["run_p50_ms"], step["probe_at_live"]["run_p50_ms"]
    step["latency_ratio"] = round(p1 / p0, 2) if p0 else None
    step["gateway_workers"] = list(settings.gateway_workers)
    report["steps"].append(step)
    if out_dir is not None:  # after every step: a long run keeps what it measured
        write(report, out_dir)


def write(report: dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "scale.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "scale.md").write_text(format_markdown(report))
    plot(report, out_dir / "scale.png")


if __name__ == "__main__" and sys.argv[1:2] == ["nodes"]:
    _node_main()
