"""``roost bench launch``: RunInstances and TerminateInstances through the real gateway,
NATS and nodes, at several concurrencies.

By default it starts `roost up` in a child process (embedded NATS, the gateway and three
`sim` nodes, SigV4 on), so the client and the cluster do not share an interpreter; the
gateway and the nodes share that child's event loop, as they do under `roost up`. Each
client worker loops RunInstances (one t3.nano) then TerminateInstances, signing every
request with botocore's SigV4 signer, each over its own keep-alive connection. ``--endpoint``
measures a gateway that is already running instead (keys from AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

import click
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from roost.domain.images import DEFAULT_IMAGE_ID

RUN = ("Action=RunInstances&Version=2016-11-15&ImageId={image}&InstanceType={itype}"
       "&MinCount=1&MaxCount=1")
TERMINATE = "Action=TerminateInstances&Version=2016-11-15&InstanceId.1={iid}"


@dataclass(frozen=True, slots=True)
class Level:
    """The figures for one concurrency."""

    concurrency: int
    pairs: int
    errors: int
    run_p50_ms: float
    run_p99_ms: float
    terminate_p50_ms: float
    terminate_p99_ms: float
    launches_per_second: float


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of ``samples``; 0 when empty."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


class Signer:
    def __init__(self, endpoint: str, key: str, secret: str, region: str) -> None:
        self.url = endpoint.rstrip("/") + "/"
        self._auth = SigV4Auth(Credentials(key, secret), "ec2", region)

    def headers(self, body: bytes) -> dict[str, str]:
        req = AWSRequest(method="POST", url=self.url, data=body,
                         headers={"Content-Type": "application/x-www-form-urlencoded"})
        self._auth.add_auth(req)
        return dict(req.headers.items())


class Connection:
    """One keep-alive HTTP/1.1 connection. A worker owns one, so concurrency is the
    number of connections, and the client costs little next to what it measures (an
    httpx pool of 64 spent more CPU than the cluster it was timing)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
        if self._writer is None or self._writer.is_closing():
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._writer.write(f"POST / HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{head}"
                           f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        status_line = await self._reader.readline()
        length = 0
        while (line := await self._reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
        text = (await self._reader.readexactly(length)).decode()
        return int(status_line.split()[1]), text

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


async def _call(conn: Connection, signer: Signer, body: str) -> tuple[float, str]:
    data = body.encode()
    started = time.perf_counter()
    status, text = await conn.post(data, signer.headers(data))
    elapsed = time.perf_counter() - started
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {text[:300]}")
    return elapsed, text


async def run_level(signer: Signer, *, concurrency: int, pairs: int, itype: str) -> Level:
    runs: list[float] = []
    terms: list[float] = []
    errors = 0
    todo = iter(range(pairs))

    async def worker() -> None:
        nonlocal errors
        conn = Connection(signer.url)
        try:
            for _ in todo:
                try:
                    took, text = await _call(conn, signer,
                                             RUN.format(image=DEFAULT_IMAGE_ID, itype=itype))
                    runs.append(took)
                    iid = text.split("<instanceId>", 1)[1].split("<", 1)[0]
                    took, _ = await _call(conn, signer, TERMINATE.format(iid=iid))
                    terms.append(took)
                except (RuntimeError, IndexError, OSError, asyncio.IncompleteReadError):
                    errors += 1
                    await conn.close()
        finally:
            await conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    ms = 1000.0
    return Level(
        concurrency, pairs, errors,
        round(percentile(runs, 50) * ms, 2), round(percentile(runs, 99) * ms, 2),
        round(percentile(terms, 50) * ms, 2), round(percentile(terms, 99) * ms, 2),
        round(len(runs) / wall, 1) if wall else 0.0,
    )


async def bench(signer: Signer, *, levels: Sequence[int], pairs: int, itype: str,
                warmup: int) -> list[Level]:
    await run_level(signer, concurrency=1, pairs=warmup, itype=itype)
    out = []
    for c in levels:
        level = await run_level(signer, concurrency=c, pairs=max(pairs, c * 4), itype=itype)
        click.echo(format_level(level), err=True)
        out.append(level)
    return out


def format_level(level: Level) -> str:
    return (f"  concurrency {level.concurrency:>3}: RunInstances p50 {level.run_p50_ms:7.2f} ms"
            f"  p99 {level.run_p99_ms:7.2f} ms | TerminateInstances p50 "
            f"{level.terminate_p50_ms:7.2f} ms  p99 {level.terminate_p99_ms:7.2f} ms | "
            f"{level.launches_per_second:7.1f} launches/s  ({level.errors} errors)")


@contextmanager
def local_cluster(*, nodes: int, node_capacity: str) -> Iterator[tuple[str, str, str]]:
    """`roost up` (sim driver) in a child process; yields (endpoint, key, secret)."""
    with tempfile.TemporaryDirectory(prefix="roost-bench-") as tmp:
        data = Path(tmp) / "up"
        log = Path(tmp) / "up.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", "from roost.up.cli import up; up()",
                 "--nodes", str(nodes), "--driver", "sim", "--node-capacity", node_capacity,
                 "--port", "0", "--nats-port", "0", "--data-dir", str(data)],
                stdout=out, stderr=subprocess.STDOUT,
            )
        try:
            env = _wait_for_env(proc, data / "env", log)
            yield env["AWS_ENDPOINT_URL_EC2"], env["AWS_ACCESS_KEY_ID"], env[
                "AWS_SECRET_ACCESS_KEY"]
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGINT)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(10)


def _wait_for_env(proc: subprocess.Popen[bytes], env_file: Path, log: Path) -> dict[str, str]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise click.ClickException(f"roost up exited:\n{log.read_text()}")
        if env_file.exists() and "AWS_ENDPOINT_URL_EC2" in env_file.read_text():
            pairs = (line.removeprefix("export ").split("=", 1)
                     for line in env_file.read_text().splitlines() if "=" in line)
            return {k: v for k, v in pairs}
        time.sleep(0.05)
    raise click.ClickException(f"roost up did not start in 60 s:\n{log.read_text()}")


@click.command("launch")
@click.option("--concurrency", "levels", multiple=True, type=click.IntRange(min=1),
              default=[1, 16, 64], show_default=True, help="Repeat for several levels.")
@click.option("--pairs", type=click.IntRange(min=1), default=300, show_default=True,
              help="Run+Terminate pairs per level (at least 4 per worker).")
@click.option("--warmup", type=click.IntRange(min=0), default=20, show_default=True)
@click.option("--instance-type", default="t3.nano", show_default=True)
@click.option("--nodes", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--node-capacity", default="256vcpu,1024GiB", show_default=True,
              help="Per sim node: room for every in-flight launch at the top concurrency.")
@click.option("--endpoint", default=None,
              help="Measure this running gateway instead of starting `roost up`.")
@click.option("--region", default="roost-1", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def launch(levels: tuple[int, ...], pairs: int, warmup: int, instance_type: str, nodes: int,
           node_capacity: str, endpoint: str | None, region: str, as_json: bool) -> None:
    """RunInstances + TerminateInstances latency (p50/p99) and throughput."""

    def measure(ep: str, key: str, secret: str) -> list[Level]:
        click.echo(f"benchmarking {ep} ({instance_type}, {pairs} pairs per level)", err=True)
        signer = Signer(ep, key, secret, region)
        return asyncio.run(bench(signer, levels=levels, pairs=pairs, itype=instance_type,
                                 warmup=warmup))

    if endpoint:
        key = os.environ.get("AWS_ACCESS_KEY_ID", "x")
        secret = os.environ.get("AWS_SECRET_ACCESS_KEY", "x")
        results = measure(endpoint, key, secret)
    else:
        click.echo(f"starting roost up: {nodes} sim nodes of {node_capacity}", err=True)
        with local_cluster(nodes=nodes, node_capacity=node_capacity) as (ep, key, secret):
            results = measure(ep, key, secret)
    if as_json:
        click.echo(json.dumps([asdict(r) for r in results], indent=2))
    else:
        click.echo("\n".join(format_level(r) for r in results))
