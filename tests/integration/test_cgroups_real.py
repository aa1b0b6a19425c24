"""The cgroup library on this machine's real cgroups: limits are enforced by the kernel,
and a kill leaves nothing behind, not even a detached daemon.

v1 runs on the hybrid host's v1 hierarchies. v2 runs on its empty-controller cgroup2
mount, so only what needs no controller is checked there: membership, freeze, kill.
Every test removes what it made (groups and node roots) in a finally.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from roost.node.cgroups import (
    CgroupError,
    Cgroups,
    CgroupUnavailable,
    InstanceCgroup,
    Limits,
    root_name,
)
from roost.node.cgroups import detect as detect_cgroups
from tests.polling import wait_until

UNIFIED = Path("/sys/fs/cgroup/unified")


def node_id() -> str:
    return f"test-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie waiting for a reaper we do not control."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def emptied(group: InstanceCgroup) -> None:
    wait_until(f"{group} emptied", lambda: not group.populated(), 5.0, 0.02,
               detail=lambda: f"pids {group.pids()}")


def teardown(cg: Cgroups) -> None:
    """Kill and remove every group of this test node, then the node root itself."""
    for instance_id in cg.instance_ids():
        group = cg.open(instance_id)
        assert group is not None
        group.kill_all(signal.SIGKILL)
        emptied(group)
        group.remove()
    cg.remove_root()


def run_in(group: InstanceCgroup, argv: list[str]) -> subprocess.Popen[bytes]:
    child = subprocess.Popen(group.join_command(argv))
    wait_until("the child in the group (or exited)",
               lambda: child.pid in group.pids() or child.poll() is not None, 5.0, 0.02)
    return child


@pytest.fixture
def v1() -> Iterator[Cgroups]:
    if os.geteuid() != 0:
        pytest.skip("real cgroup tests need root to create groups")
    try:
        cg = detect_cgroups(node_id())
    except CgroupUnavailable as e:
        pytest.skip(f"cgroups unavailable here: {e}")
    if cg.version != 1:
        pytest.skip(f"this host uses cgroup v{cg.version}, not v1")
    try:
        yield cg
    finally:
        teardown(cg)


@pytest.fixture
def v2() -> Iterator[Cgroups]:
    if os.geteuid() != 0:
        pytest.skip("real cgroup tests need root to create groups")
    if not (UNIFIED / "cgroup.controllers").exists():
        pytest.skip(f"no cgroup2 mount at {UNIFIED}")
    try:
        cg = Cgroups.v2_at(UNIFIED, None, node_id(), require_controllers=False)
    except CgroupUnavailable as e:
        pytest.skip(f"cgroup2 at {UNIFIED} unusable: {e}")
    try:
        yield cg
    finally:
        teardown(cg)


def test_v1_child_joins_before_running_and_is_listed(v1: Cgroups) -> None:
    group = v1.create("i-join", Limits(1000, 64, 32))
    assert group.version == 1 and v1.instance_ids() == ["i-join"]
    child = run_in(group, ["sleep", "30"])
    try:
        assert group.pids() == {child.pid}
        assert group.populated()
        assert v1.group_of(child.pid) == "i-join"
        assert v1.group_of(os.getpid()) is None
        reopened = v1.open("i-join")
        assert reopened is not None and reopened.pids() == {child.pid}
        with pytest.raises(CgroupError, match="still populated"):
            group.remove()
        assert group.can_freeze
        assert group.kill_all(signal.SIGTERM) == 1  # through freeze, signal, thaw
        assert child.wait(5) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()
    emptied(group)
    group.remove()
    assert v1.instance_ids() == [] and v1.open("i-join") is None
    assert not any(d.exists() for d in group.dirs.values())


def test_v1_join_failure_refuses_to_run(v1: Cgroups) -> None:
    group = v1.create("i-gone", Limits(1000, 64, 32))
    group.remove()
    done = subprocess.run(
        group.join_command(["echo", "ran"]), capture_output=True, text=True, timeout=10
    )
    assert done.returncode == 125
    assert done.stdout == ""
    assert "roost: cannot join cgroup" in done.stderr


def test_v1_memory_limit_oom_kills(v1: Cgroups) -> None:
    group = v1.create("i-oom", Limits(1000, 64, 32))
    hog = "b = b'x' * (200 * 1024 * 1024); print('survived')"
    done = subprocess.run(
        group.join_command([sys.executable, "-c", hog]), capture_output=True, timeout=60
    )
    assert done.returncode == -signal.SIGKILL, done
    assert b"survived" not in done.stdout
    usage = group.usage()
    assert usage.oom_kills >= 1
    assert 0 < usage.memory_peak_bytes <= 64 * 1024 * 1024


def test_v1_cpu_quota_holds_a_busy_loop_to_half_a_cpu(v1: Cgroups) -> None:
    group = v1.create("i-cpu", Limits(500, 64, 32))
    child = run_in(group, [sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # past interpreter start-up
        cpu0, wall0 = group.usage().cpu_seconds, time.monotonic()
        time.sleep(2.0)
        rate = (group.usage().cpu_seconds - cpu0) / (time.monotonic() - wall0)
    finally:
        child.kill()
        child.wait()
    assert 0.05 < rate <= 0.6, f"{rate:.3f} CPU-seconds per second"


def test_v1_fork_bomb_is_capped_and_killed(v1: Cgroups) -> None:
    """bash, unlike dash, survives a refused fork and keeps looping: the bomb is still
    forking when the kill comes, which is what the freeze is for."""
    shell = shutil.which("bash")
    if shell is None:
        pytest.skip("needs bash, whose loop survives a refused fork")
    limits = Limits(1000, 64, 16)
    group = v1.create("i-bomb", limits)
    bomb = run_in(group, [shell, "-c", "while :; do sleep 100 & done 2>/dev/null"])
    pids_dir = group.dirs["pids"]
    try:
        wait_until("the bomb at the pids limit",
                   lambda: len(group.pids()) >= limits.pids_max - 1, 5.0, 0.02,
                   detail=lambda: f"{len(group.pids())} pids")
        time.sleep(0.5)
        assert int((pids_dir / "pids.current").read_text()) <= limits.pids_max
        assert len(group.pids()) <= limits.pids_max
        assert "max 0" not in (pids_dir / "pids.events").read_text()  # forks were refused
        assert bomb.poll() is None  # still trying
        assert group.kill_all(signal.SIGKILL) >= limits.pids_max - 1
        emptied(group)
        assert bomb.wait(5) == -signal.SIGKILL
    finally:
        bomb.kill()
        bomb.wait()
    group.remove()


def test_v1_detached_daemon_dies_with_the_group(v1: Cgroups, tmp_path: Path) -> None:
    group = v1.create("i-daemon", Limits(1000, 64, 32))
    pidfile = tmp_path / "daemon.pid"
    launcher = f"setsid nohup sleep 300 >/dev/null 2>&1 </dev/null & echo $! > {pidfile}"
    assert (
        subprocess.run(group.join_command(["/bin/sh", "-c", launcher]), timeout=10).returncode == 0
    )
    daemon = int(pidfile.read_text())
    assert not gone(daemon)
    # Its own session (a process-group kill misses it), once setsid(1) has run in the
    # child: `$!` is known as soon as the shell forks, a moment before that.
    wait_until("the daemon in its own session",
               lambda: os.getsid(daemon) != os.getsid(0), 5.0, 0.02)
    assert group.pids() == {daemon} and v1.group_of(daemon) == "i-daemon"
    assert group.kill_all(signal.SIGKILL) == 1
    wait_until("the daemon gone", lambda: gone(daemon), 5.0, 0.02)
    emptied(group)
    group.remove()


def test_v2_membership_freeze_and_kill(v2: Cgroups) -> None:
    group = v2.create("i-v2", Limits(1000, 64, 32))
    assert group.version == 2 and v2.instance_ids() == ["i-v2"]
    assert group.procs_files() == [UNIFIED / root_name() / v2.node_id / "i-v2" / "cgroup.procs"]
    first = run_in(group, ["sleep", "30"])
    second = run_in(group, ["sleep", "30"])
    try:
        assert group.pids() == {first.pid, second.pid} and group.populated()
        assert v2.group_of(first.pid) == "i-v2"
        assert group.can_freeze
        assert group.set_frozen(True)
        assert "frozen 1" in (group.dirs[""] / "cgroup.events").read_text()
        assert group.set_frozen(False)
        assert group.kill_all(signal.SIGTERM) == 2  # freeze, signal, thaw
        assert first.wait(5) == -signal.SIGTERM and second.wait(5) == -signal.SIGTERM
        third = run_in(group, ["sleep", "30"])
        assert group.kill_all(signal.SIGKILL) == 1  # cgroup.kill
        assert third.wait(5) == -signal.SIGKILL
    finally:
        for child in (first, second):
            child.kill()
            child.wait()
    emptied(group)
    group.remove()
    assert v2.open("i-v2") is None
