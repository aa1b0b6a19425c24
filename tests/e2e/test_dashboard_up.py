"""`roost up` serves the dashboard: the banner prints its URL, its pages show the
cluster's nodes, and Ctrl-C stops it with the rest."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from roost.embedded.proc import free_port
from tests.e2e.test_up_awscli import read_until


def test_roost_up_prints_and_serves_the_dashboard(tmp_path: Path, outside_tmp: Path) -> None:
    log = tmp_path / "up.log"
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from roost.up.cli import up; up()", "--nodes", "2",
             "--driver", "sim", "--port", "0", "--nats-port", "0", "--no-controller",
             "--dashboard-port", str(port), "--data-dir", str(outside_tmp / "up")],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        banner = read_until(proc, log, "Ctrl-C stops everything")
        found = re.search(r"dashboard\s+(http://\S+)", banner)
        assert found and found.group(1) == f"http://127.0.0.1:{port}", banner
        url = found.group(1)
        assert "Overview \u00b7 roost" in httpx.get(url, timeout=10).text
        deadline = time.monotonic() + 20
        html = ""
        while time.monotonic() < deadline:
            html = httpx.get(f"{url}/fragment/nodes", timeout=10).text
            if 'id="node-node-1"' in html and 'id="node-node-2"' in html:
                break
            time.sleep(0.2)
        assert 'id="node-node-2"' in html, html
        # The gateway's endpoint is what its AWS CLI commands name.
        endpoint = re.search(r"EC2 endpoint\s+(http://\S+)", banner)
        assert endpoint and endpoint.group(1) in httpx.get(f"{url}/instances", timeout=10).text
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
