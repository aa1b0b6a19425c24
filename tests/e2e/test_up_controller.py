"""`roost up` runs Postgres and the capacity controller too: /status shows a leader and
its plan, and Ctrl-C stops everything it started, Postgres included."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from roost.embedded.proc import free_port
from tests.e2e.test_up_awscli import read_until


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_roost_up_runs_a_leading_controller_on_its_postgres(
    tmp_path: Path, outside_tmp: Path
) -> None:
    log = tmp_path / "up.log"
    data = outside_tmp / "up"
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from roost.up.cli import up; up()", "--nodes", "2",
             "--driver", "sim", "--port", "0", "--nats-port", "0", "--postgres-port", "0",
             "--controller-port", str(port), "--data-dir", str(data)],
            stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        banner = read_until(proc, log, "Ctrl-C stops everything")
        found = re.search(r"controller\s+(http://\S+)", banner)
        assert found and found.group(1) == f"http://127.0.0.1:{port}", banner
        assert "Postgres       postgresql://" in banner
        assert "roost pools create demo" in banner and "--orchestrator native" in banner
        assert "export ROOST_DSN=postgresql://" in (data / "env").read_text()
        doc: dict[str, Any] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            doc = httpx.get(f"{found.group(1)}/status", timeout=5).json()
            if doc["leader"] and doc["plan"] is not None:
                break
            time.sleep(0.1)
        assert doc["leader"] is True and doc["epoch"] >= 1, doc
        assert doc["plan"] is not None, doc
        postmaster = int((data / "postgres" / "pgdata" / "postmaster.pid")
                         .read_text().split()[0])
        assert _alive(postmaster)

        os.kill(proc.pid, signal.SIGINT)  # Ctrl-C, to roost up's own pid only
        assert proc.wait(60) == 0, log.read_text()
        assert "roost stopped." in log.read_text()
        deadline = time.monotonic() + 10
        while _alive(postmaster) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(postmaster), "roost up left its Postgres running"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
