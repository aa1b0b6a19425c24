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
from roost.node.cgroups import InstanceCgroup, detect
from tests.nodes import client, command, launch, wait_state
from tests.polling import until


def start_agent(nats_url: str, data_dir: Path, log: Path, *, grace: float = 2
                ) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "roost", "node", "--nats", nats_url, "--node-id", "r1",
           "--data-dir", str(data_dir), "--capacity", "4vcpu,16GiB", "--reserve", "0vcpu,0GiB",
           "--driver", "process", "--heartbeat-seconds", "0.2", "--stop-grace-seconds",
           f"{grace:g}"]
    with log.open("ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=out)


def reaped(pid: int) -> bool:
    """No such process, not even a zombie (what ``os.kill(pid, 0)`` would still find)."""
    return not Path(f"/proc/{pid}").exists()


@pytest.fixture
def agents() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def memory_limit(group: InstanceCgroup) -> int:
    if group.version == 1:
        return int((group.dirs["memory"] / "memory.limit_in_bytes").read_text())
    return int((group.dirs[""] / "memory.max").read_text())


def kill_group(pid_file: Path) -> None:
    with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError):
        os.killpg(int(pid_file.read_text().strip()), signal.SIGKILL)


async def snapshot(nc, *, after_boot: str | None = None) -> s.CapacitySnapshot:  # type: ignore[no-untyped-def]
    sub = await nc.subscribe(subjects.capacity("r1"))
    try:
        while True:
            # Generous: the agent is a new interpreter, and on 2 loaded cores its
            # start alone has taken past 10 s.
            msg = await sub.next_msg(timeout=30)
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
            await until("both instances write their pid",
                        lambda: pid_a.exists() and pid_b.exists(), timeout=5, interval=0.05)

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

            # Re-adopted by its cgroup, it is still limited to its type (m7i.large).
            group = detect("r1").open(ida)
            assert group is not None and int(pid_a.read_text()) in group.pids()
            assert memory_limit(group) == 8 * 1024**3

            # The re-adopted instance is still under control: terminate kills its group.
            await command(nc, "r1", "terminate", ida)
            await wait_state(nc, "r1", ida, "terminated")
            pid = int(pid_a.read_text())
            assert detect("r1").open(ida) is None  # its group went with it
            await until(f"a's process {pid} is gone", lambda: reaped(pid), timeout=2.5,
                        interval=0.05)
    finally:
        kill_group(pid_a)
        kill_group(pid_b)


@pytest.mark.parametrize(("op", "during", "after"),
                         [("terminate", "shutting-down", "terminated"),
                          ("stop", "stopping", "stopped")])
async def test_a_stop_or_terminate_cut_short_by_kill_9_is_finished_after_restart(
    nats_server: NatsServer, tmp_path: Path, agents: list[subprocess.Popen[bytes]],
    op: str, during: str, after: str,
) -> None:
    """The agent dies while an instance that ignores SIGTERM waits out its stop grace:
    the restarted agent finishes the move (before, the instance stayed shutting-down
    for good, and a repeated TerminateInstances changed nothing)."""
    data, pid_file = tmp_path / "r1", tmp_path / "i.pid"
    agents.append(start_agent(nats_server.url, data, tmp_path / "agent.log", grace=120))
    try:
        async with client(nats_server.url) as nc:
            first = await snapshot(nc)
            inst = await launch(nc, "t3.micro", node_id="r1",
                                user_data=f"echo $$ > {pid_file}\ntrap '' TERM\n"
                                          "while :; do sleep 1; done\n")
            assert inst and inst.ok and inst.instance
            iid = inst.instance.instance_id
            await wait_state(nc, "r1", iid, "running")
            await until("the instance writes its pid", pid_file.exists, timeout=5, interval=0.05)
            reply = await command(nc, "r1", op, iid)
            assert reply.instance and reply.instance.state == during
            await asyncio.sleep(0.5)  # well inside the 120 s grace
            assert (await command(nc, "r1", "describe", iid)).instance.state == during  # type: ignore[union-attr]
            agents[0].send_signal(signal.SIGKILL)
            agents[0].wait(10)
            agents.append(start_agent(nats_server.url, data, tmp_path / "agent.log"))
            await snapshot(nc, after_boot=first.boot_id)
            # the new agent's grace is 2 s: then SIGKILL, then the move
            done = await wait_state(nc, "r1", iid, after, timeout=30)
            assert done.state_reason == "Client.UserInitiatedShutdown"
            pid = int(pid_file.read_text())
            await until(f"the instance's process {pid} is gone", lambda: reaped(pid),
                        timeout=5, interval=0.05)
    finally:
        kill_group(pid_file)


async def test_drain_command_stops_advertising_and_leaves_instances_running(
    nats_server: NatsServer, tmp_path: Path, agents: list[subprocess.Popen[bytes]]
) -> None:
    pid_file = tmp_path / "i.pid"
    agents.append(start_agent(nats_server.url, tmp_path / "r1", tmp_path / "agent.log"))
    try:
        async with client(nats_server.url) as nc:
            await snapshot(nc)
            inst = await launch(nc, "t3.micro", node_id="r1",
                                user_data=f"echo $$ > {pid_file}\nexec sleep 300\n")
            assert inst and inst.ok and inst.instance
            await wait_state(nc, "r1", inst.instance.instance_id, "running")
            drain = subprocess.run(
                [sys.executable, "-m", "roost", "node", "--nats", nats_server.url,
                 "--node-id", "r1", "drain"], capture_output=True, text=True, timeout=30)
            assert drain.returncode == 0, drain.stderr
            assert "r1 draining; 1 instances keep running" in drain.stdout
            assert agents[0].wait(15) == 0
            assert await launch(nc, "t3.micro") is None
            pid = int(pid_file.read_text())
            os.kill(pid, 0)  # still running after its agent left
    finally:
        kill_group(pid_file)


async def test_sigterm_drains_and_exits(
    nats_server: NatsServer, tmp_path: Path, agents: list[subprocess.Popen[bytes]]
) -> None:
    agents.append(start_agent(nats_server.url, tmp_path / "r1", tmp_path / "agent.log"))
    async with client(nats_server.url) as nc:
        sub = await nc.subscribe(subjects.capacity("r1"))
        # 30 s, as snapshot() waits: the agent's start alone has taken past 10 s here
        first = s.decode((await sub.next_msg(timeout=30)).data, s.CapacitySnapshot)
        assert not first.draining and first.fit
        agents[0].send_signal(signal.SIGTERM)
        while True:
            snap = s.decode((await sub.next_msg(timeout=10)).data, s.CapacitySnapshot)
            if snap.draining:
                break
        assert snap.fit == {} and snap.seq > first.seq
        assert agents[0].wait(15) == 0


async def test_drain_of_unknown_node_is_a_clear_error(nats_server: NatsServer) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "roost", "node", "--nats", nats_server.url, "--node-id", "nope",
         "drain", "--timeout", "1"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 1
    assert "could not drain node nope" in res.stderr and "Traceback" not in res.stderr


def test_bad_capacity_flag_is_a_usage_error(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "roost", "node", "--capacity", "lots", "--data-dir",
         str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 2
    assert "cannot parse 'lots'" in res.stderr and "Traceback" not in res.stderr
