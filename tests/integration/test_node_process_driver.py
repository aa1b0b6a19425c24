"""The process driver runs user data as a real process group, and the lifecycle follows it."""

from __future__ import annotations

import os
from pathlib import Path

from roost.embedded import NatsServer
from roost.node.drivers import start_ticks
from tests.nodes import client, command, launch, running_nodes, wait_state
from tests.polling import until


async def wait_file(path: Path, timeout: float = 10.0) -> str:
    await until(f"{path} written", lambda: path.exists() and path.read_text().strip(),
                timeout=timeout, interval=0.05)
    return path.read_text()


async def wait_gone(pid: int) -> None:
    """Wait until the process has exited (a zombie awaiting its reaper counts as gone)."""
    await until(f"process {pid} exits", lambda: start_ticks(pid) is None, timeout=2.0,
                interval=0.05)


async def test_user_data_runs_with_instance_env_and_exit_stops_it(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    out = tmp_path / "env.txt"
    script = f'echo "$ROOST_INSTANCE_ID $ROOST_INSTANCE_TYPE" > {out}\nexit 3\n'
    async with running_nodes([nats_server.url], ["4vcpu,16GiB"], tmp_path,
                             driver="process") as [node], client(nats_server.url) as nc:
        reply = await launch(nc, "t3.micro", user_data=script)
        assert reply and reply.ok and reply.instance
        iid = reply.instance.instance_id
        rec = await wait_state(nc, "n1", iid, "stopped")
        assert (await wait_file(out)).split() == [iid, "t3.micro"]
        assert rec.exit_code == 3 and rec.state_reason == "Client.InstanceInitiatedShutdown"
        assert node.ledger.allocations == {}  # a stopped instance gives its room back


async def test_stop_start_terminate_kill_the_whole_group(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    child_pid = tmp_path / "child.pid"
    # The script starts a grandchild, which must die with the group.
    script = f"sleep 300 &\necho $! > {child_pid}\nwait\n"
    async with running_nodes([nats_server.url], ["2vcpu,8GiB"], tmp_path,
                             driver="process") as [node], client(nats_server.url) as nc:
        reply = await launch(nc, "m7i.large", user_data=script)
        assert reply and reply.ok and reply.instance
        iid = reply.instance.instance_id
        await wait_state(nc, "n1", iid, "running")
        grandchild = int(await wait_file(child_pid))

        stop = await command(nc, "n1", "stop", iid)
        assert stop.ok and stop.previous_state == "running"
        assert stop.instance and stop.instance.state == "stopping"
        await wait_state(nc, "n1", iid, "stopped")
        await wait_gone(grandchild)
        assert node.ledger.allocations == {}

        # The room went to another instance meanwhile: start can't fit, EC2's answer.
        other = await launch(nc, "m7i.large", node_id="n1")
        assert other and other.ok and other.instance
        refused = await command(nc, "n1", "start", iid)
        assert not refused.ok and refused.error == "InsufficientInstanceCapacity"
        await command(nc, "n1", "terminate", other.instance.instance_id)
        await wait_state(nc, "n1", other.instance.instance_id, "terminated")

        child_pid.unlink()
        start = await command(nc, "n1", "start", iid)
        assert start.ok and start.previous_state == "stopped"
        await wait_state(nc, "n1", iid, "running")
        grandchild = int(await wait_file(child_pid))

        term = await command(nc, "n1", "terminate", iid)
        assert term.ok and term.instance and term.instance.state == "shutting-down"
        await wait_state(nc, "n1", iid, "terminated")
        await wait_gone(grandchild)
        again = await command(nc, "n1", "terminate", iid)  # idempotent, as on EC2
        assert again.ok and again.instance and again.instance.state == "terminated"
        bad = await command(nc, "n1", "start", iid)
        assert not bad.ok and bad.error == "IncorrectInstanceState"
        missing = await command(nc, "n1", "describe", "i-00000000000000000")
        assert not missing.ok and missing.error == "InvalidInstanceID.NotFound"
        assert os.getpgid(0) != grandchild  # the test itself was never in that group
