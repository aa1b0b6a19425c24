"""`roost up` gets its Postgres back: ``kill -9`` of the postmaster under a running
`roost up` (a real process), and the dead postmaster is reaped (no zombie), its stale
lock files cleared, Postgres restarted, the output says so, and the controller leads and
plans again on it. The recovery time is printed (``pytest -s``) and recorded in
docs/reliability.md."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import boto3
import httpx
import pytest
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from roost.domain.images import DEFAULT_IMAGE_ID as IMAGE
from roost.embedded.postgres import PostgresServer
from roost.embedded.proc import EmbeddedError, free_port
from tests.e2e import test_up_awscli
from tests.e2e.test_up_awscli import read_until

roost_up = test_up_awscli.roost_up  # the fixture: `roost up` with 3 sim nodes


def _postmaster(data: Path) -> int:
    return int((data / "postgres" / "pgdata" / "postmaster.pid").read_text().split()[0])


def _state(pid: int) -> str | None:
    """The process state letter (Z for a zombie), or None once it is gone (reaped)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return raw[raw.rindex(")") + 2:].split()[0]


def _status(url: str) -> dict[str, Any]:
    try:
        return dict(httpx.get(f"{url}/status", timeout=5).json())
    except httpx.HTTPError:
        return {}


@pytest.mark.timeout(180)
def test_roost_up_restarts_its_postgres_after_kill_9(tmp_path: Path, outside_tmp: Path
                                                     ) -> None:
    log = tmp_path / "up.log"
    data = outside_tmp / "up"
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from roost.up.cli import up; up()", "--nodes", "1",
             "--driver", "sim", "--port", "0", "--nats-port", "0", "--postgres-port", "0",
             "--controller-port", str(port), "--data-dir", str(data)],
            stdout=out, stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        read_until(proc, log, "Ctrl-C stops everything")
        # The banner hides the password; the 0600 env file holds the whole DSN.
        dsn = re.search(r"ROOST_DSN=(postgresql://\S+)", (data / "env").read_text())
        assert dsn, (data / "env").read_text()
        deadline = time.monotonic() + 30
        while not _status(url).get("leader") and time.monotonic() < deadline:
            time.sleep(0.1)
        old = _postmaster(data)

        os.kill(old, signal.SIGKILL)  # the postmaster, by its own pid
        killed_at = time.monotonic()
        text = read_until(proc, log, "postgres is back", timeout=90)
        back_after = time.monotonic() - killed_at
        assert f"postgres (pid {old}) was killed by SIGKILL; restarting it in 1s" in text
        assert _state(old) is None, "the dead postmaster was left a zombie"
        new = _postmaster(data)
        assert new != old and _state(new) not in (None, "Z")

        async def add_pool() -> None:
            conn = await asyncpg.connect(dsn.group(1))
            try:
                await conn.execute(
                    "INSERT INTO worker_pools (id, max_replicas, target_per_replica, "
                    "worker_cpu_milli, worker_mem_mib, worker_db_pool_size, orchestrator) "
                    "VALUES ('after-restart', 2, 5, 500, 512, 1, 'fake')")
            finally:
                await conn.close()

        asyncio.run(add_pool())
        doc: dict[str, Any] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            doc = _status(url)
            plan = doc.get("plan") or {}
            if (doc.get("leader") and doc.get("ready") and not doc.get("lastError")
                    and "after-restart" in plan.get("pools", {})):
                break
            time.sleep(0.2)
        working_after = time.monotonic() - killed_at
        print(f"\npostgres back {back_after:.1f}s after kill -9; the controller leads and "
              f"plans on it again after {working_after:.1f}s")
        assert doc.get("leader") and doc.get("ready") and not doc.get("lastError"), doc
        assert "after-restart" in doc["plan"]["pools"], doc
        assert httpx.get(f"{url}/readyz", timeout=5).status_code == 200

        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)


def _child(parent: int, comm: str) -> int:
    """The pid of ``parent``'s child process named ``comm``."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            raw = stat.read_text()
        except OSError:
            continue
        name = raw[raw.index("(") + 1:raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2:].split()
        if name == comm and int(fields[1]) == parent and fields[0] != "Z":
            return int(stat.parent.name)
    raise LookupError(f"no {comm} under pid {parent}")


@pytest.mark.timeout(150)
def test_roost_up_restarts_its_nats_after_kill_9(roost_up: tuple[subprocess.Popen[bytes],
                                                                 Path, str]) -> None:
    proc, log, banner = roost_up
    export = re.search(r"export (.+)", banner)
    endpoint = re.search(r"EC2 endpoint\s+(\S+)", banner)
    assert export and endpoint, banner
    env = dict(kv.split("=", 1) for kv in export.group(1).split())
    ec2 = boto3.client(
        "ec2", endpoint_url=endpoint.group(1), region_name=env["AWS_DEFAULT_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        config=Config(retries={"max_attempts": 1}),
    )
    nats = _child(proc.pid, "nats-server")
    os.kill(nats, signal.SIGKILL)
    killed_at = time.monotonic()
    text = read_until(proc, log, "nats is back", timeout=60)
    assert f"nats (pid {nats}) was killed by SIGKILL; restarting it in 1s" in text
    assert _state(nats) is None, "the dead nats-server was left a zombie"
    deadline = time.monotonic() + 60
    while True:
        try:
            ec2.run_instances(ImageId=IMAGE, InstanceType="t3.micro", MinCount=1, MaxCount=1)
            break
        except (ClientError, BotoCoreError):
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
    print(f"\nnats back and a launch through it succeeds {time.monotonic() - killed_at:.1f}s "
          "after kill -9")


def test_stale_lock_files_are_cleared_only_when_their_postmaster_is_gone(
    outside_tmp: Path,
) -> None:
    server = PostgresServer(base_dir=outside_tmp / "pg", durable=False).start()
    zombie = subprocess.Popen(["true"])  # never waited for until the end: a zombie
    other = subprocess.Popen(["sleep", "60"])  # alive, but not a postgres
    try:
        pidfile = server.data / "postmaster.pid"
        with pytest.raises(EmbeddedError, match="still runs"):
            server.clear_stale_locks()  # a live postmaster: nothing touched
        assert pidfile.exists()
        lines = pidfile.read_text().splitlines()
        server.stop()
        while _state(zombie.pid) != "Z":
            time.sleep(0.01)
        for pid in (zombie.pid, other.pid):
            pidfile.write_text("\n".join([str(pid), *lines[1:]]) + "\n")
            lock = Path(lines[4]) / f".s.PGSQL.{lines[3]}.lock"
            lock.write_text(f"{pid}\n")
            assert set(server.clear_stale_locks()) >= {pidfile, lock}
            assert not pidfile.exists() and not lock.exists()
        pidfile.write_text("\n".join([str(zombie.pid), *lines[1:]]) + "\n")
        server.start()  # over a stale postmaster.pid naming a zombie
        assert _state(server.pid or 0) not in (None, "Z")
    finally:
        server.stop()
        other.kill()
        other.wait()
        zombie.wait()
