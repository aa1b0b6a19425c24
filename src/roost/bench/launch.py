"""``roost bench launch``: RunInstances and TerminateInstances through the real gateway,
NATS and nodes, at several concurrencies, beside moto's server and a raw NATS floor.

By default it starts `roost up` in a child process (embedded NATS, the gateway and three
`sim` nodes, SigV4 on, no controller), so the client and the cluster do not share an
interpreter; the gateway and the nodes share that child's event loop, as they do under
`roost up`. Each client worker loops RunInstances (one t3.nano) then TerminateInstances,
signing every request with botocore's SigV4 signer, each over its own keep-alive
connection.

In the same run, level by level so that each ratio is measured side by side:

- moto's server (``moto[server]``, a child process on a free loopback port), driven by the
  same client code: the Python peer;
- raw nats-py request-reply against a trivial responder (another child process) on the
  same embedded NATS, two round trips per pair: the floor;
- InsufficientInstanceCapacity: RunInstances of a type no node fits (``--ice-type``),
  timed at the client and, from the gateway's ``/metrics`` histogram, at the server.

``--endpoint`` measures a gateway that is already running instead (keys from
AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), without the peers.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from roost.bus.auth import ENV as ENV_NATS_CREDS
from roost.bus.auth import NatsAuth
from roost.decide.placement import DEFAULT_POLICY, POLICIES
from roost.domain.images import DEFAULT_IMAGE_ID
from roost.gateway.workers import default_workers

RUN = ("Action=RunInstances&Version=2016-11-15&ImageId={image}&InstanceType={itype}"
       "&MinCount=1&MaxCount=1")
TERMINATE = "Action=TerminateInstances&Version=2016-11-15&InstanceId.1={iid}"
ICE_CODE = "InsufficientInstanceCapacity"
MOTO_REGION = "us-east-1"
FLOOR_SUBJECT = "roost.bench.floor"
# Targets from the benchmarks issue.
TARGET_MOTO_RATIO = 3.0
TARGET_ICE_P99_MS = 5.0
# Targets from the scale-out issue (launches/s at concurrency 64).
TARGET_ONE_PROCESS = 1500.0
TARGET_TWO_OVER_ONE = 1.4
TARGET_ROOST_UP = 1000.0


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
    error_samples: tuple[str, ...] = ()
    """The first few errors, as they were (an EC2 error's body, a connection error)."""


@dataclass(frozen=True, slots=True)
class IceLevel:
    """RunInstances answered InsufficientInstanceCapacity, at one concurrency."""

    concurrency: int
    requests: int
    ice: int
    errors: int
    client_p50_ms: float
    client_p99_ms: float
    # From the gateway's roost_gateway_request_seconds histogram: the upper bound of the
    # bucket holding the percentile (None when the gateway's /metrics was not read).
    server_p50_ms_le: float | None
    server_p99_ms_le: float | None
    # Exact, from the histogram's sum and count, and the bucket at the target.
    server_mean_ms: float | None
    server_share_le_5ms: float | None


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
    httpx pool of 64 spent more CPU than the cluster it was timing). A server that
    closes after each response (moto's werkzeug answers HTTP/1.0) gets a new one."""

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
        length: int | None = None
        close = status_line.startswith(b"HTTP/1.0")
        while (line := await self._reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            name = name.lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection":
                close = value.strip().lower() == "close"
        if length is None:
            data, close = await self._reader.read(), True
        else:
            data = await self._reader.readexactly(length)
        if close:
            await self.close()
        return int(status_line.split()[1]), data.decode()

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


async def _call(conn: Connection, signer: Signer, body: str) -> tuple[float, str]:
    data = body.encode()
    started = time.perf_counter()
    status, text = await conn.post(data, signer.headers(data))
    elapsed = time.perf_counter() - started
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {text[:300]}")
    return elapsed, text


def _level(concurrency: int, pairs: int, errors: int, runs: list[float], terms: list[float],
           wall: float, samples: Sequence[str] = ()) -> Level:
    ms = 1000.0
    return Level(
        concurrency, pairs, errors,
        round(percentile(runs, 50) * ms, 2), round(percentile(runs, 99) * ms, 2),
        round(percentile(terms, 50) * ms, 2), round(percentile(terms, 99) * ms, 2),
        round(len(terms) / wall, 1) if wall else 0.0, tuple(samples[:5]),
    )


async def run_level(signer: Signer, *, concurrency: int, pairs: int, itype: str,
                    token_prefix: str = "") -> Level:
    """``pairs`` RunInstances + TerminateInstances from ``concurrency`` connections; with
    ``token_prefix``, each launch carries a ClientToken (``<prefix>-<n>``), as boto3's do."""
    runs: list[float] = []
    terms: list[float] = []
    errors = 0
    samples: list[str] = []
    todo = iter(range(pairs))
    run = RUN + ("&ClientToken={token}" if token_prefix else "")

    async def worker() -> None:
        nonlocal errors
        conn = Connection(signer.url)
        try:
            for n in todo:
                try:
                    took, text = await _call(conn, signer, run.format(
                        image=DEFAULT_IMAGE_ID, itype=itype, token=f"{token_prefix}-{n}"))
                    runs.append(took)
                    iid = text.split("<instanceId>", 1)[1].split("<", 1)[0]
                    took, _ = await _call(conn, signer, TERMINATE.format(iid=iid))
                    terms.append(took)
                except (RuntimeError, IndexError, ValueError, OSError,
                        asyncio.IncompleteReadError) as exc:
                    errors += 1
                    if len(samples) < 5:
                        samples.append(f"{type(exc).__name__}: {str(exc)[:300]}")
                    await conn.close()
        finally:
            await conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return _level(concurrency, pairs, errors, runs, terms, time.perf_counter() - started,
                  samples)


async def ice_level(signer: Signer, *, concurrency: int, requests: int, itype: str,
                    metrics_url: str | None) -> IceLevel:
    """RunInstances of ``itype``, which no node fits: every answer should be ICE."""
    lat: list[float] = []
    errors = 0
    todo = iter(range(requests))
    before = scrape_run_histogram(metrics_url) if metrics_url else None

    async def worker() -> None:
        nonlocal errors
        conn = Connection(signer.url)
        body = RUN.format(image=DEFAULT_IMAGE_ID, itype=itype).encode()
        try:
            for _ in todo:
                try:
                    started = time.perf_counter()
                    status, text = await conn.post(body, signer.headers(body))
                    took = time.perf_counter() - started
                except (ValueError, OSError, asyncio.IncompleteReadError):
                    errors += 1
                    await conn.close()
                    continue
                if status != 200 and f"<Code>{ICE_CODE}</Code>" in text:
                    lat.append(took)
                else:
                    errors += 1
        finally:
            await conn.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    p50 = p99 = mean = share = None
    if metrics_url and before is not None:
        after = scrape_run_histogram(metrics_url)
        delta = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in after}
        count = delta.pop(COUNT, 0.0)
        total = delta.pop(SUM, 0.0)
        p50, p99 = bucket_percentile(delta, 50), bucket_percentile(delta, 99)
        if count > 0:
            mean = total / count
            share = delta.get(TARGET_ICE_P99_MS / 1000, 0.0) / count
    ms = 1000.0
    return IceLevel(concurrency, requests, len(lat), errors,
                    round(percentile(lat, 50) * ms, 2), round(percentile(lat, 99) * ms, 2),
                    None if p50 is None else round(p50 * ms, 2),
                    None if p99 is None else round(p99 * ms, 2),
                    None if mean is None else round(mean * ms, 2),
                    None if share is None else round(share, 4))


COUNT, SUM = -1.0, -2.0  # keys of scrape_run_histogram's count and sum


def scrape_run_histogram(metrics_url: str) -> dict[float, float]:
    """Cumulative bucket counts of the gateway's RunInstances latency histogram, keyed by
    bound, with its count and sum (seconds) under COUNT and SUM."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    out: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "roost_gateway_request_seconds":
            continue
        for sample in family.samples:
            if sample.labels.get("action") != "RunInstances":
                continue
            if sample.name.endswith("_bucket"):
                out[float(sample.labels["le"])] = sample.value
            elif sample.name.endswith("_count"):
                out[COUNT] = sample.value
            elif sample.name.endswith("_sum"):
                out[SUM] = sample.value
    return out


def bucket_percentile(cumulative: dict[float, float], q: float) -> float | None:
    """The upper bound of the bucket holding the ``q`` percentile; None when empty."""
    if not cumulative:
        return None
    total = cumulative.get(math.inf, max(cumulative.values()))
    if total <= 0:
        return None
    for le in sorted(cumulative):
        if cumulative[le] >= q / 100 * total:
            return le
    return math.inf


async def floor_level(nats_url: str, *, concurrency: int, pairs: int,
                      creds: str = "") -> Level:
    """Two nats-py request-replies per pair against the trivial responder; ``creds``:
    the NATS user's credentials file (roost up's admin user), if NATS has users."""
    import nats

    auth = NatsAuth.load(creds) if creds else None
    nc = await nats.connect(nats_url, **(auth.options() if auth else {}))
    firsts: list[float] = []
    seconds: list[float] = []
    errors = 0
    todo = iter(range(pairs))

    async def worker() -> None:
        nonlocal errors
        for _ in todo:
            try:
                started = time.perf_counter()
                await nc.request(FLOOR_SUBJECT, b"run", timeout=5)
                mid = time.perf_counter()
                await nc.request(FLOOR_SUBJECT, b"terminate", timeout=5)
                firsts.append(mid - started)
                seconds.append(time.perf_counter() - mid)
            except Exception:  # a failed round trip is counted, not raised
                errors += 1

    try:
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    finally:
        await nc.close()
    return _level(concurrency, pairs, errors, firsts, seconds, wall)


async def bench(signer: Signer, *, levels: Sequence[int], pairs: int, itype: str,
                warmup: int) -> list[Level]:
    """Roost alone: the Run+Terminate figures at each level."""
    await run_level(signer, concurrency=1, pairs=warmup, itype=itype)
    out = []
    for c in levels:
        level = await run_level(signer, concurrency=c, pairs=max(pairs, c * 4), itype=itype)
        click.echo(format_level("roost", level), err=True)
        out.append(level)
    return out


def roost_name(workers: int) -> str:
    """The report's key for roost with ``workers`` gateway processes."""
    return f"roost_w{workers}"


@dataclass(frozen=True, slots=True)
class Peers:
    moto: Signer | None
    moto_url: str | None
    nats_url: str | None
    metrics_url: str | None
    ice_type: str
    ice_requests: int
    nats_creds: str = ""


async def bench_all(roosts: Mapping[str, Signer], peers: Peers, *, levels: Sequence[int],
                    pairs: int, itype: str, warmup: int) -> dict[str, Any]:
    """Each roost cluster (by name), moto, the NATS floor and ICE, level by level (side
    by side). The first cluster is also reported as "roost", and takes the ICE load."""
    for signer in roosts.values():
        await run_level(signer, concurrency=1, pairs=warmup, itype=itype)
    if peers.moto is not None:
        await run_level(peers.moto, concurrency=1, pairs=warmup, itype=itype)
    if peers.nats_url:
        await floor_level(peers.nats_url, concurrency=1, pairs=warmup,
                          creds=peers.nats_creds)
    out: dict[str, list[dict[str, Any]]] = {"roost": [], "moto": [], "nats_floor": [],
                                            "ice": [], **{name: [] for name in roosts}}
    first = next(iter(roosts))
    for c in levels:
        n = max(pairs, c * 4)
        for name, signer in roosts.items():
            root = CLUSTER_PIDS.get(signer.url.rstrip("/"))
            before = cpu_seconds(root) if root else {}
            client = time.process_time()
            lv = await run_level(signer, concurrency=c, pairs=n, itype=itype)
            click.echo(format_level(name, lv), err=True)
            row = asdict(lv)
            if root and lv.pairs:
                after = cpu_seconds(root)
                after["client"], before["client"] = time.process_time(), client
                row["cpu_ms_per_pair"] = cpu_between(before, after, lv.pairs / 1000)
                click.echo(f"  {name:<5} c={c:>3}: CPU ms per pair {row['cpu_ms_per_pair']}",
                           err=True)
            out[name].append(row)
            if name == first:
                out["roost"].append(row)
        signer = roosts[first]
        if peers.moto is not None:
            if peers.moto_url:
                reset_moto(peers.moto_url)
            lv = await run_level(peers.moto, concurrency=c, pairs=n, itype=itype)
            click.echo(format_level("moto", lv), err=True)
            out["moto"].append(asdict(lv))
        if peers.nats_url:
            lv = await floor_level(peers.nats_url, concurrency=c, pairs=n,
                                   creds=peers.nats_creds)
            click.echo(format_level("nats", lv), err=True)
            out["nats_floor"].append(asdict(lv))
        if peers.ice_requests:
            ice = await ice_level(signer, concurrency=c,
                                  requests=max(peers.ice_requests, c * 4),
                                  itype=peers.ice_type, metrics_url=peers.metrics_url)
            click.echo(format_ice(ice), err=True)
            out["ice"].append(asdict(ice))
    return {**out, **verdict(out)}


def verdict(out: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Ratios per level and the issue's targets, judged at the top level (and, where
    the run had them, at 16 and 64 for one and two gateway processes)."""
    ratios = []
    for i, r in enumerate(out["roost"]):
        row: dict[str, Any] = {"concurrency": r["concurrency"]}
        if i < len(out["moto"]) and out["moto"][i]["launches_per_second"]:
            row["roost_over_moto"] = round(
                r["launches_per_second"] / out["moto"][i]["launches_per_second"], 2)
        if i < len(out["nats_floor"]) and out["nats_floor"][i]["launches_per_second"]:
            row["roost_over_nats_floor"] = round(
                r["launches_per_second"] / out["nats_floor"][i]["launches_per_second"], 3)
        ratios.append(row)
    targets: dict[str, Any] = {}
    if ratios and "roost_over_moto" in ratios[-1]:
        got = ratios[-1]["roost_over_moto"]
        targets["throughput_vs_moto"] = {
            "concurrency": ratios[-1]["concurrency"], "target": f">= {TARGET_MOTO_RATIO}x",
            "measured": got, "met": got >= TARGET_MOTO_RATIO}
    if out["ice"] and out["ice"][0]["server_share_le_5ms"] is not None:
        # p99 <= 5 ms exactly when at least 99% of the requests fell in the 5 ms bucket.
        for ice in (out["ice"][0], out["ice"][-1]):
            share = ice["server_share_le_5ms"]
            targets[f"ice_server_p99_c{ice['concurrency']}"] = {
                "concurrency": ice["concurrency"], "target": f"<= {TARGET_ICE_P99_MS} ms",
                "measured_le_ms": ice["server_p99_ms_le"], "share_le_5ms": share,
                "met": share >= 0.99}
    targets.update(scale_targets(out))
    return {"ratios": ratios, "targets": targets}


def _at(levels: list[dict[str, Any]], concurrency: int) -> float | None:
    return next((lv["launches_per_second"] for lv in levels
                 if lv["concurrency"] == concurrency), None)


def scale_targets(out: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The scale-out issue's targets, for the gateway-process counts the run had."""
    targets: dict[str, Any] = {}
    one, two = out.get(roost_name(1), []), out.get(roost_name(2), [])
    top = max((lv["concurrency"] for lv in one or two), default=0)
    got = _at(one, top)
    if got is not None:
        targets[f"one_gateway_process_c{top}"] = {
            "concurrency": top, "target": f">= {TARGET_ONE_PROCESS}/s", "measured": got,
            "met": got >= TARGET_ONE_PROCESS}
    for name, levels in ((roost_name(1), one), (roost_name(2), two)):
        low, high = _at(levels, 16), _at(levels, 64)
        if low is not None and high is not None:
            targets[f"{name}_no_fall_16_to_64"] = {
                "concurrency": 64, "target": ">= the figure at 16", "measured": high,
                "at_16": low, "met": high >= low}
    got2 = _at(two, top)
    if got and got2 is not None:
        ratio = round(got2 / got, 2)
        targets[f"two_over_one_process_c{top}"] = {
            "concurrency": top, "target": f">= {TARGET_TWO_OVER_ONE}x", "measured": ratio,
            "met": ratio >= TARGET_TWO_OVER_ONE}
    up_workers = default_workers()
    got_up = _at(out.get(roost_name(up_workers), []), top)
    if got_up is not None:
        targets[f"roost_up_c{top}"] = {
            "concurrency": top, "target": f">= {TARGET_ROOST_UP}/s (roost up's default: "
            f"{up_workers} gateway process{'es' if up_workers > 1 else ''} here)",
            "measured": got_up, "met": got_up >= TARGET_ROOST_UP}
    return targets


def format_level(name: str, level: Level) -> str:
    return (f"  {name:<5} c={level.concurrency:>3}: first p50 {level.run_p50_ms:7.2f} ms"
            f"  p99 {level.run_p99_ms:7.2f} ms | second p50 "
            f"{level.terminate_p50_ms:7.2f} ms  p99 {level.terminate_p99_ms:7.2f} ms | "
            f"{level.launches_per_second:7.1f} pairs/s  ({level.errors} errors)")


def format_ice(ice: IceLevel) -> str:
    server = ("" if ice.server_p99_ms_le is None else
              f" | server p50 <= {ice.server_p50_ms_le} ms  p99 <= {ice.server_p99_ms_le} ms"
              f"  mean {ice.server_mean_ms} ms")
    return (f"  ICE   c={ice.concurrency:>3}: client p50 {ice.client_p50_ms:7.2f} ms  "
            f"p99 {ice.client_p99_ms:7.2f} ms{server}  ({ice.ice}/{ice.requests} ICE, "
            f"{ice.errors} errors)")


def format_report(report: dict[str, Any]) -> str:
    lines = ["| concurrency | target | Run p50 / p99 ms | Terminate p50 / p99 ms | pairs/s |",
             "|---|---|---|---|---|"]
    names = [k for k in report if k.startswith("roost_w")] or ["roost"]
    for name in (*names, "moto", "nats_floor"):
        for lv in report.get(name, []):
            lines.append(f"| {lv['concurrency']} | {name} | {lv['run_p50_ms']} / "
                         f"{lv['run_p99_ms']} | {lv['terminate_p50_ms']} / "
                         f"{lv['terminate_p99_ms']} | {lv['launches_per_second']} |")
    if report.get("ice"):
        lines += ["", "| concurrency | ICE client p50 / p99 ms | ICE server p50 / p99 ms (<=) "
                      "| server mean ms | server share <= 5 ms |", "|---|---|---|---|---|"]
        for ice in report["ice"]:
            lines.append(f"| {ice['concurrency']} | {ice['client_p50_ms']} / "
                         f"{ice['client_p99_ms']} | {ice['server_p50_ms_le']} / "
                         f"{ice['server_p99_ms_le']} | {ice['server_mean_ms']} | "
                         f"{ice['server_share_le_5ms']} |")
    for row in report.get("ratios", []):
        bits = [f"{k} {v}" for k, v in row.items() if k != "concurrency"]
        if bits:
            lines.append(f"ratios at c={row['concurrency']}: " + ", ".join(bits))
    for name, t in report.get("targets", {}).items():
        got = t.get("measured", t.get("measured_le_ms"))
        if "at_16" in t:
            got = f"{got} (at 16: {t['at_16']})"
        if "share_le_5ms" in t:
            got = f"p99 <= {got} ms, {t['share_le_5ms']:.1%} within 5 ms"
        lines.append(f"target {name}: {t['target']}, measured {got} -> "
                     f"{'MET' if t['met'] else 'MISSED'}")
    return "\n".join(lines)


def reset_moto(url: str) -> None:
    """Empty moto's in-memory state: it keeps terminated instances and looks them up
    by a scan, so without a reset each level would pay for the ones before it."""
    req = urllib.request.Request(url.rstrip("/") + "/moto-api/reset", method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGINT) -> None:
    """Stop one child by its own pid."""
    if proc.poll() is None:
        os.kill(proc.pid, sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


NATS_CREDS: dict[str, str] = {}
"""Endpoint -> its `roost up`'s NATS credentials file (each cluster has its own)."""
CLUSTER_PIDS: dict[str, int] = {}
"""Endpoint -> the pid of the `roost up` serving it, while it runs (for `cpu_seconds`)."""

_TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int) -> tuple[float, int, str]:
    """(user+system seconds, parent pid, role) of one process."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()
    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    role = ("gateway" if b"roost.gateway.workers" in cmd else
            "nats" if b"nats-server" in cmd else
            "nodes" if b"roost.bench.scale" in cmd else "other")
    return (int(fields[11]) + int(fields[12])) / _TICK, int(fields[1]), role


def cpu_between(before: dict[str, float], after: dict[str, float],
                per: float) -> dict[str, float]:
    """Each role's CPU seconds from ``before`` to ``after`` (`cpu_seconds` readings),
    divided by ``per``; a role first seen in ``after`` counts from zero."""
    return {k: round((after[k] - before.get(k, 0.0)) / per, 3) for k in sorted(after)}


def cpu_seconds(root: int) -> dict[str, float]:
    """CPU seconds used so far by a `roost up` and its children, by role: "gateway"
    (its gateway worker processes), "nats", "nodes" (`roost bench scale`'s node
    processes) and "up" (the root itself: `roost up`'s nodes, and the gateway too when
    it runs on up's loop). A worker that was restarted loses its count."""
    out = {"gateway": 0.0, "nats": 0.0, "up": 0.0}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cpu, ppid, role = _proc_cpu(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
        if int(entry.name) == root:
            out["up"] += cpu
        elif ppid == root and role != "other":
            out[role] = out.get(role, 0.0) + cpu
    return out


@dataclass(frozen=True, slots=True)
class UpProcess:
    """A `roost up` running as a child process."""

    pid: int
    endpoint: str
    key: str
    secret: str
    nats_url: str
    nats_creds: str = ""
    """Its NATS admin user's credentials file ("" when NATS has no users)."""


@contextmanager
def local_cluster(*, nodes: int, node_capacity: str, policy: str = DEFAULT_POLICY,
                  gateway_workers: int = 1) -> Iterator[tuple[str, str, str, str]]:
    """`roost up` (sim driver, no controller) in a child process, its gateway in
    ``gateway_workers`` processes of their own (0: on up's loop, beside the nodes);
    yields (endpoint, key, secret, nats_url)."""
    with up_process(nodes=nodes, node_capacity=node_capacity, policy=policy,
                    gateway_workers=gateway_workers) as up:
        yield up.endpoint, up.key, up.secret, up.nats_url


@contextmanager
def up_process(*, nodes: int, node_capacity: str, policy: str = DEFAULT_POLICY,
               gateway_workers: int = 1) -> Iterator[UpProcess]:
    """`roost up` (sim driver, no controller) in a child process, its gateway in
    ``gateway_workers`` processes of their own (0: on up's loop)."""
    with tempfile.TemporaryDirectory(prefix="roost-bench-") as tmp:
        data = Path(tmp) / "up"
        log = Path(tmp) / "up.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", "from roost.up.cli import up; up()",
                 "--nodes", str(nodes), "--driver", "sim", "--node-capacity", node_capacity,
                 "--port", "0", "--nats-port", "0", "--no-controller",
                 "--policy", policy, "--data-dir", str(data), "--no-dashboard",
                 "--gateway-workers", str(gateway_workers)],
                stdout=out, stderr=subprocess.STDOUT,
            )
        env: dict[str, str] = {}
        try:
            env = _wait_for_env(proc, data / "env", log)
            CLUSTER_PIDS[env["AWS_ENDPOINT_URL_EC2"]] = proc.pid
            # The floor's raw clients authenticate as roost's own components do.
            creds = NATS_CREDS[env["AWS_ENDPOINT_URL_EC2"]] = env.get(ENV_NATS_CREDS, "")
            yield UpProcess(proc.pid, env["AWS_ENDPOINT_URL_EC2"], env["AWS_ACCESS_KEY_ID"],
                            env["AWS_SECRET_ACCESS_KEY"], _nats_url(log), creds)
        finally:
            CLUSTER_PIDS.pop(env.get("AWS_ENDPOINT_URL_EC2", ""), None)
            NATS_CREDS.pop(env.get("AWS_ENDPOINT_URL_EC2", ""), None)
            _stop(proc)


def _nats_url(log: Path) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if line.strip().startswith("NATS ") and "nats://" in line:
                return line.split()[1]  # "NATS  nats://...  (what guards it)"
        time.sleep(0.05)
    return ""


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


def _wait_for_port(proc: subprocess.Popen[bytes], port: int, what: str, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise click.ClickException(f"{what} exited:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise click.ClickException(f"{what} did not start in 60 s:\n{log.read_text()}")


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's server (``python -m moto.server``) on a free loopback port; yields its URL."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="roost-bench-moto-") as tmp:
        log = Path(tmp) / "moto.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=out, stderr=subprocess.STDOUT,
            )
        try:
            _wait_for_port(proc, port, "moto_server", log)
            yield f"http://127.0.0.1:{port}"
        finally:
            _stop(proc, signal.SIGTERM)


RESPONDER = """
import asyncio, sys
import nats
from roost.bus.auth import NatsAuth

async def main(url, subject, creds):
    auth = NatsAuth.load(creds) if creds else None
    nc = await nats.connect(url, **(auth.options() if auth else {}))
    async def reply(msg):
        await msg.respond(msg.data)
    await nc.subscribe(subject, cb=reply)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
"""


@contextmanager
def nats_responder(nats_url: str, creds: str = "") -> Iterator[None]:
    """A trivial nats-py responder (echo) in a child process, for the floor."""
    proc = subprocess.Popen([sys.executable, "-c", RESPONDER, nats_url, FLOOR_SUBJECT, creds],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if b"ready" not in line:
            raise click.ClickException(f"NATS responder did not start: {line!r}")
        yield
    finally:
        _stop(proc, signal.SIGTERM)
        if proc.stdout is not None:
            proc.stdout.close()


def machine() -> dict[str, Any]:
    return {"python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()}


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
@click.option("--ice-type", default="g5.xlarge", show_default=True,
              help="A type no sim node fits (they have no GPU): every RunInstances of it "
                   "is InsufficientInstanceCapacity.")
@click.option("--ice-requests", type=click.IntRange(min=0), default=300, show_default=True,
              help="ICE requests per level (at least 4 per worker); 0 skips ICE.")
@click.option("--policy", type=click.Choice(POLICIES), default=DEFAULT_POLICY,
              show_default=True, help="The gateway's placement policy.")
@click.option("--gateway-workers", "gateway_workers", multiple=True,
              type=click.IntRange(min=0), default=[1, 2], show_default=True,
              help="Gateway processes of each cluster; repeat to measure several clusters "
                   "side by side, level by level (0: the gateway on up's own loop).")
@click.option("--no-moto", is_flag=True, help="Skip moto's server.")
@click.option("--no-floor", is_flag=True, help="Skip the raw NATS request-reply floor.")
@click.option("--quick", is_flag=True,
              help="CI smoke: concurrency 1 and 8, 16 pairs, 16 ICE requests, 2 warm-up.")
@click.option("--endpoint", default=None,
              help="Measure this running gateway instead of starting `roost up` "
                   "(roost only: no moto, floor or ICE).")
@click.option("--region", default="roost-1", show_default=True)
@click.option("--json", "json_out", default=None, metavar="OUT",
              help="Write every figure as JSON to OUT ('-' for stdout).")
def launch(levels: tuple[int, ...], pairs: int, warmup: int, instance_type: str, nodes: int,
           node_capacity: str, ice_type: str, ice_requests: int, policy: str,
           gateway_workers: tuple[int, ...], no_moto: bool, no_floor: bool, quick: bool,
           endpoint: str | None, region: str, json_out: str | None) -> None:
    """RunInstances + TerminateInstances latency (p50/p99) and throughput, beside moto's
    server and a raw NATS floor, plus InsufficientInstanceCapacity latency."""
    if quick:
        levels, pairs, warmup, ice_requests = (1, 8), 16, 2, 16
    workers = list(dict.fromkeys(gateway_workers))
    # SIGTERM unwinds like Ctrl-C, so the clusters and servers started are stopped (a
    # background job may have SIGINT ignored).
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        report = _launch(levels, pairs, warmup, instance_type, nodes, node_capacity,
                         ice_type, ice_requests, policy, workers, no_moto, no_floor,
                         endpoint, region)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if json_out == "-":
        click.echo(json.dumps(report, indent=2))
        return
    if json_out:
        Path(json_out).write_text(json.dumps(report, indent=2) + "\n")
    click.echo(format_report(report))


def _launch(levels: Sequence[int], pairs: int, warmup: int, instance_type: str, nodes: int,
            node_capacity: str, ice_type: str, ice_requests: int, policy: str,
            workers: list[int], no_moto: bool, no_floor: bool, endpoint: str | None,
            region: str) -> dict[str, Any]:
    report: dict[str, Any] = {"machine": machine(), "instance_type": instance_type,
                              "pairs": pairs, "levels": list(levels)}
    if endpoint:
        key = os.environ.get("AWS_ACCESS_KEY_ID", "x")
        secret = os.environ.get("AWS_SECRET_ACCESS_KEY", "x")
        click.echo(f"benchmarking {endpoint} ({instance_type}, {pairs} pairs per level)",
                   err=True)
        signer = Signer(endpoint, key, secret, region)
        results = asyncio.run(bench(signer, levels=levels, pairs=pairs, itype=instance_type,
                                    warmup=warmup))
        report["roost"] = [asdict(r) for r in results]
    else:
        report["policy"] = policy
        report["gateway_workers"] = workers
        click.echo(f"starting {len(workers)} x roost up: {nodes} sim nodes of "
                   f"{node_capacity}, policy {policy}, gateway processes "
                   f"{', '.join(map(str, workers))}", err=True)
        with ExitStack() as stack:
            clusters = {roost_name(w): stack.enter_context(local_cluster(
                nodes=nodes, node_capacity=node_capacity, policy=policy, gateway_workers=w))
                for w in workers}
            ep, _, _, nats_url = next(iter(clusters.values()))
            creds = NATS_CREDS.get(ep, "")  # the floor runs on the first cluster's NATS
            moto_url = stack.enter_context(_maybe(moto_server, not no_moto))
            stack.enter_context(_maybe(lambda: nats_responder(nats_url, creds),
                                       not no_floor and bool(nats_url)))
            peers = Peers(
                moto=Signer(moto_url, "testing", "testing", MOTO_REGION) if moto_url else None,
                moto_url=moto_url,
                nats_url=None if no_floor else nats_url or None,
                metrics_url=ep.rstrip("/") + "/metrics",
                ice_type=ice_type, ice_requests=ice_requests, nats_creds=creds,
            )
            click.echo(f"benchmarking {', '.join(c[0] for c in clusters.values())} "
                       f"({instance_type}, {pairs} pairs per level)"
                       f"{'' if peers.moto is None else ', moto at ' + str(moto_url)}"
                       f"{'' if not peers.nats_url else ', NATS floor'}", err=True)
            roosts = {name: Signer(c[0], c[1], c[2], region) for name, c in clusters.items()}
            report.update(asyncio.run(bench_all(roosts, peers, levels=levels, pairs=pairs,
                                                itype=instance_type, warmup=warmup)))
    return report


@contextmanager
def _maybe(factory: Any, enabled: bool) -> Iterator[Any]:
    if not enabled:
        yield None
        return
    with factory() as value:
        yield value
