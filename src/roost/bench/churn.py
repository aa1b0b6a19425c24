"""`roost bench churn`: launch/terminate pairs by the thousand, and what they leave.

How to run: ``roost bench churn`` (20,000 pairs, concurrency 16, against a `roost up`
of three sim nodes it starts itself; ``--pairs`` and ``--concurrency`` to change it;
``--json OUT`` for the figures). Data: none read; the pairs are the load. Each launch
carries a ClientToken, as boto3's do, so the token bucket is exercised too.

After every chunk of pairs it records the pairs per second, the errors, the resident
memory of the `roost up` process (its gateway and node agents) and the bytes held by
the instances and ClientToken buckets. At the end every node must hold nothing and have
all its room back (the admin API's figures), and one unfiltered DescribeInstances is
timed. Terminated instances stay describable for an hour (EC2's behaviour), so the
instance bucket and the gateway's index grow with the churn within that hour by
design; the ClientToken bucket keeps tokens for the idempotency window (24 h).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import httpx
import nats
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from roost.bench.launch import Connection, Signer, machine, run_level, up_process
from roost.bus import subjects
from roost.bus.auth import NatsAuth

DESCRIBE = "Action=DescribeInstances&Version=2016-11-15"


@dataclass(frozen=True, slots=True)
class Chunk:
    done: int
    pairs_per_second: float
    errors: int
    run_p50_ms: float
    run_p99_ms: float
    rss_mib: float | None
    instances_bucket_kib: float | None
    tokens_bucket_kib: float | None
    error_samples: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Capacity:
    nodes: int
    instances_held: int
    room_missing_cpu_milli: int
    room_missing_mem_mib: int

    @property
    def restored(self) -> bool:
        return self.nodes > 0 and not (self.instances_held or self.room_missing_cpu_milli
                                       or self.room_missing_mem_mib)


Probe = Callable[[], Awaitable[dict[str, float | None]]]


async def churn(signer: Signer, *, pairs: int, concurrency: int, chunk: int,
                itype: str = "t3.nano", probe: Probe | None = None,
                on_chunk: Callable[[Chunk], None] | None = None) -> list[Chunk]:
    """``pairs`` launch/terminate pairs in chunks of ``chunk``; figures per chunk."""
    out: list[Chunk] = []
    done = 0
    while done < pairs:
        n = min(chunk, pairs - done)
        level = await run_level(signer, concurrency=min(concurrency, n), pairs=n,
                                itype=itype, token_prefix=f"churn-{done}")
        done += n
        sizes = await probe() if probe is not None else {}
        row = Chunk(done, level.launches_per_second, level.errors, level.run_p50_ms,
                    level.run_p99_ms, sizes.get("rss_mib"), sizes.get("instances_kib"),
                    sizes.get("tokens_kib"), level.error_samples)
        out.append(row)
        if on_chunk is not None:
            on_chunk(row)
    return out


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


async def bucket_kib(nats_url: str, creds: str = "") -> dict[str, float | None]:
    auth = NatsAuth.load(creds) if creds else None  # roost up's admin user
    nc = await nats.connect(nats_url, connect_timeout=5, **(auth.options() if auth else {}))
    try:
        js = nc.jetstream()
        out: dict[str, float | None] = {}
        for name, bucket in (("instances_kib", subjects.INSTANCES_BUCKET),
                             ("tokens_kib", subjects.CLIENT_TOKENS_BUCKET)):
            info = await js.stream_info(f"KV_{bucket}")
            out[name] = round(info.state.bytes / 1024, 1)
        return out
    finally:
        await nc.close()


async def capacity(endpoint: str, key: str, secret: str, region: str) -> Capacity:
    """What the nodes' last snapshots say, from the gateway's admin API."""
    url = endpoint.rstrip("/") + "/api/v1/nodes"
    req = AWSRequest(method="GET", url=url, data=b"")
    SigV4Auth(Credentials(key, secret), "ec2", region).add_auth(req)
    async with httpx.AsyncClient(timeout=10) as client:
        resp = await client.get(url, headers=dict(req.headers.items()))
    resp.raise_for_status()
    nodes = [n for n in resp.json()["nodes"] if n["live"]]
    return Capacity(
        len(nodes), sum(n.get("instances", 0) for n in nodes),
        sum(n["allocatable"]["cpu_milli"] - n["free"]["cpu_milli"] for n in nodes),
        sum(n["allocatable"]["mem_mib"] - n["free"]["mem_mib"] for n in nodes))


async def settled_capacity(endpoint: str, key: str, secret: str, region: str,
                           timeout: float = 10.0) -> Capacity:
    """`capacity` once it is restored, or as it is after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        cap = await capacity(endpoint, key, secret, region)
        if cap.restored or time.monotonic() > deadline:
            return cap
        await asyncio.sleep(0.25)


async def timed_describe(signer: Signer) -> dict[str, float]:
    conn = Connection(signer.url)
    try:
        body = DESCRIBE.encode()
        started = time.perf_counter()
        status, text = await conn.post(body, signer.headers(body))
        took = time.perf_counter() - started
    finally:
        await conn.close()
    return {"status": status, "seconds": round(took, 3),
            "mib": round(len(text.encode()) / 2**20, 2)}


@click.command("churn")
@click.option("--pairs", type=click.IntRange(min=1), default=20_000, show_default=True)
@click.option("--concurrency", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--chunk", type=click.IntRange(min=1), default=1_000, show_default=True,
              help="Pairs between two samples of memory and bucket sizes.")
@click.option("--nodes", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--node-capacity", default="256vcpu,1024GiB", show_default=True)
@click.option("--instance-type", default="t3.nano", show_default=True)
@click.option("--region", default="roost-1", show_default=True)
@click.option("--json", "json_out", default=None, metavar="OUT",
              help="Write every figure as JSON to OUT ('-' for stdout).")
def churn_command(pairs: int, concurrency: int, chunk: int, nodes: int, node_capacity: str,
                  instance_type: str, region: str, json_out: str | None) -> None:
    """Launch/terminate pairs by the thousand against `roost up`: throughput, memory and
    bucket sizes per chunk, and capacity restored exactly at the end."""
    with up_process(nodes=nodes, node_capacity=node_capacity, gateway_workers=0) as up:
        signer = Signer(up.endpoint, up.key, up.secret, region)

        async def probe() -> dict[str, float | None]:
            return {"rss_mib": rss_mib(up.pid), **await bucket_kib(up.nats_url, up.nats_creds)}

        def show(row: Chunk) -> None:
            click.echo(f"{row.done:>7} pairs  {row.pairs_per_second:7.1f} pairs/s  "
                       f"errors {row.errors}  run p50/p99 {row.run_p50_ms}/{row.run_p99_ms} ms"
                       f"  rss {row.rss_mib} MiB  buckets: instances "
                       f"{row.instances_bucket_kib} KiB, tokens {row.tokens_bucket_kib} KiB"
                       + "".join(f"\n    {e}" for e in row.error_samples), err=True)

        async def go() -> dict[str, Any]:
            before = await probe()
            rows = await churn(signer, pairs=pairs, concurrency=concurrency, chunk=chunk,
                               itype=instance_type, probe=probe, on_chunk=show)
            cap = await settled_capacity(up.endpoint, up.key, up.secret, region)
            return {"machine": machine(), "pairs": pairs, "concurrency": concurrency,
                    "before": before, "chunks": [asdict(r) for r in rows],
                    "errors": sum(r.errors for r in rows),
                    "capacity": {**asdict(cap), "restored": cap.restored},
                    "describe_all": await timed_describe(signer)}

        click.echo(f"churn: {pairs} pairs at concurrency {concurrency} against {nodes} sim "
                   f"nodes of {node_capacity}", err=True)
        report = asyncio.run(go())
    text = json.dumps(report, indent=2)
    if json_out == "-":
        click.echo(text)
    elif json_out:
        Path(json_out).write_text(text + "\n")
    cap = report["capacity"]
    click.echo(f"{pairs} pairs, {report['errors']} errors; capacity "
               f"{'restored exactly' if cap['restored'] else 'NOT restored: ' + str(cap)}; "
               f"memory {report['before'].get('rss_mib')} -> "
               f"{report['chunks'][-1]['rss_mib']} MiB; unfiltered DescribeInstances "
               f"{report['describe_all']['seconds']} s, {report['describe_all']['mib']} MiB")
    if report["errors"] or not cap["restored"]:
        raise SystemExit(1)
