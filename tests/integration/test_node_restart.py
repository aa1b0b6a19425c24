"""A node agent killed with SIGKILL comes back holding its instances, before it
subscribes, and marks the instances whose process died meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from roost.bus import schemas as s
from roost.bus import subjects
from roost.embedded import NatsServer
from tests.nodes import client, command, launch, wait_state


def start_agent(nats_url: str, data_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "roost", "node", "--nats", nats_url, "--node-id", "r1",
           "--data-dir", str(data_dir), "--capacity", "4vcpu,16GiB", "--reserve", "0vcpu,0GiB",
           "--driver", "process", "--heartbeat-seconds", "0.2", "--stop-grace-seconds", "2"]
    with log.open("ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=out)


@pytest.fixture
def agents() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def kill_group(pid_file: Path) -> None:
    with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError):
        os.killpg(int(pid_file.read_text().strip()), signal.SIGKILL)


async def snapshot(nc, *, after_boot: str | None = None) -> s.CapacitySnapshot:  # type: ignore[no-untyped-def]
    sub = await nc.subscribe(subjects.capacity("r1"))
    try:
        while True:
            msg = await sub.next_msg(timeout=10)
            snap = s.decode(msg.data, s.CapacitySnapshot)
            if after_boot is None or snap.boot_id != after_boot:
                return snap
    finally:
        await sub.unsubscribe()


async def test_kill_9_restart_readopts_instances(
    nats_server: NatsServer, tmp_path: Path, agents: list[subprocess.Popen[bytes]]
) -> None:
    data = tmp_path / "r1"
    pid_a, pid_b = tmp_path / "a.pid", tmp_path / "b.pid"
    agents.append(start_agent(nats_server.url, data, tmp_path / "agent.log"))
    try:
        async with client(nats_server.url) as nc:
            first = await snapshot(nc)
            script = "echo $$ > {}\nexec sleep 300\n"
            a = await launch(nc, "m7i.large", node_id="r1", user_data=script.format(pid_a))
            b = await launch(nc, "t3.small", node_id="r1", user_data=script.format(pid_b))
            assert a and a.ok and a.instance and b and b.ok and b.instance
            ida, idb = a.instance.instance_id, b.instance.instance_id
            await wait_state(nc, "r1", ida, "running")
            await wait_state(nc, "r1", idb, "running")
            for _ in range(100):
                if pid_a.exists() and pid_b.exists():
                    break
                await asyncio.sleep(0.05)

            agents[0].send_signal(signal.SIGKILL)
            agents[0].wait(10)
            kill_group(pid_b)  # b's process dies while its agent is down
            await asyncio.sleep(0.2)
            agents.append(start_agent(nats_server.url, data, tmp_path / "agent.log"))

            snap = await snapshot(nc, after_boot=first.boot_id)
            # m7i.large (2 vCPU, 8 GiB) is still held; t3.small's resources came back.
            assert (snap.free_cpu_milli, snap.free_mem_mib) == (2000, 8192)
            assert snap.fit["m7i.large"] == 1 and snap.fit.get("m7i.xlarge", 0) == 0
            # Subscriptions follow: m7i.xlarge no longer fits, so nobody is listening.
            assert await launch(nc, "m7i.xlarge") is None

            ra = await command(nc, "r1", "describe", ida)
            rb = await command(nc, "r1", "describe", idb)
            assert ra.instance and ra.instance.state == "running"
            assert rb.instance and rb.instance.state == "stopped"
            assert rb.instance.state_reason == "Server.InstanceProcessGone"

            # The re-adopted instance is still under control: terminate kills its group.
            await command(nc, "r1", "terminate", ida)
            await wait_state(nc, "r1", ida, "terminated")
            pid = int(pid_a.read_text())
            with pytest.raises(ProcessLookupError):
                for _ in range(50):
                    os.kill(pid, 0)
                    await asyncio.sleep(0.05)
    finally:
        kill_group(pid_a)
        kill_group(pid_b)
