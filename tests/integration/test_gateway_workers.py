"""``roost gateway --workers 2``: two processes on one port, a ClientToken raced through
both yields one instance, /metrics sums both, a killed worker comes back, and SIGTERM to
the pool's pid stops every worker."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from roost.domain.images import DEFAULT_IMAGE_ID
from roost.embedded import NatsServer
from tests.nodes import running_nodes

RACERS = 24
RUN = (f"Action=RunInstances&Version=2016-11-15&ImageId={DEFAULT_IMAGE_ID}"
       "&InstanceType=t3.nano&MinCount=1&MaxCount=1&ClientToken=race-1")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1][:1] != "Z"


@pytest.fixture
def pool(nats_server: NatsServer, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    log = (tmp_path / "gateway.log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "roost", "gateway", "--workers", "2", "--port", "0",
         "--no-auth", "--nats", nats_server.url, "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL, stderr=log, text=True)
    try:
        deadline = time.monotonic() + 60
        endpoint = None
        while endpoint is None:
            assert proc.poll() is None and time.monotonic() < deadline, \
                Path(log.name).read_text()
            found = re.search(r"gateway ready on (\S+)", Path(log.name).read_text())
            endpoint = found.group(1) if found else None
            time.sleep(0.05)
        yield proc, endpoint
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        log.close()


async def _pids(endpoint: str, tries: int = 32) -> set[int]:
    """Worker pids seen on /healthz, each asked over a fresh connection."""
    seen = set()
    for _ in range(tries):
        async with httpx.AsyncClient(timeout=10) as http:
            seen.add((await http.get(endpoint + "/healthz")).json()["pid"])
    return seen


async def _race(endpoint: str) -> list[str]:
    async def one() -> str:
        async with httpx.AsyncClient(timeout=20) as http:  # a connection each
            resp = await http.post(endpoint + "/", content=RUN, headers={
                "Content-Type": "application/x-www-form-urlencoded"})
        assert resp.status_code == 200, resp.text
        return resp.text.split("<instanceId>", 1)[1].split("<", 1)[0]
    return await asyncio.gather(*(one() for _ in range(RACERS)))


def _run_requests(metrics: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("roost_gateway_requests_total{")
               and 'action="RunInstances"' in line)


async def test_two_workers_share_a_port_a_client_token_and_their_metrics(
    pool: tuple[subprocess.Popen[str], str], nats_server: NatsServer, tmp_path: Path,
) -> None:
    proc, endpoint = pool
    async with running_nodes([nats_server.url], ["64vcpu,256GiB"], tmp_path):
        pids = await _pids(endpoint)
        assert len(pids) == 2, pids  # both workers accept on the one port
        assert proc.pid not in pids

        ids = await _race(endpoint)
        assert set(ids) == {ids[0]}, set(ids)  # one instance, whichever worker answered
        async with httpx.AsyncClient(timeout=10) as http:
            described = (await http.post(endpoint + "/", content=(
                "Action=DescribeInstances&Version=2016-11-15"), headers={
                "Content-Type": "application/x-www-form-urlencoded"})).text
            metrics = (await http.get(endpoint + "/metrics")).text
        assert set(re.findall(r"<instanceId>([^<]+)<", described)) == {ids[0]}
        # Whichever worker answers the scrape, it counts both workers' requests.
        assert _run_requests(metrics) == RACERS

        victim = min(pids)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:
            now = await _pids(endpoint, tries=16)
            if victim not in now and len(now) == 2:
                break
            assert time.monotonic() < deadline, f"no worker replaced {victim}: {now}"
            await asyncio.sleep(0.2)
        async with httpx.AsyncClient(timeout=10) as http:
            metrics = (await http.get(endpoint + "/metrics")).text
        assert _run_requests(metrics) == RACERS  # the dead worker's counts stay in

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert not any(_alive(p) for p in now | pids), "a worker outlived its pool"
