"""The vm driver through boto3: every instance a QEMU micro-VM booting roost-microvm.

The gateway and NATS run in-process; the vm node is a real ``roost node --driver vm``
process, so that it can be killed with SIGKILL and restarted. One VM carries most of the
checks, because a boot is the cost: under KVM about a second, under TCG (no usable KVM)
tens of seconds. The tests never skip: missing tools fail with how to install them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from roost.domain.catalog import BUILTIN
from roost.domain.images import MICROVM_IMAGE_ID
from roost.node.cgroups import detect
from roost.node.vm.build import default_images_dir, is_current
from roost.node.vm.driver import DEFAULT_OVERHEAD_MIB
from tests.e2e.conftest import ThreadedCluster, make_cluster
from tests.e2e.test_boto3 import code, wait_state
from tests.e2e.test_instance_actions import console

TOOLS = {"qemu-system-x86_64": "qemu-system-x86", "busybox": "busybox-static",
         "cpio": "cpio", "dpkg-deb": "dpkg", "apt-get": "apt"}
BOOT_SECONDS = 240.0  # TCG on a loaded host; KVM boots in about a second
NODE = "vm1"


def _qemu_pids(needle: str) -> list[int]:
    """Host pids of QEMU processes with ``needle`` in their command line (QEMU is
    named after its instance, and its QMP socket is in the node's data dir)."""
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if argv.startswith(b"/") and b"qemu-system-x86_64\0" in argv and (
                needle.encode() in argv):
            found.append(int(pid))
    return found


def _leave_nothing(data_dir: Path) -> None:
    """Whatever a failed test left: its QEMUs (by pid) and their cgroups."""
    for pid in _qemu_pids(str(data_dir)):
        os.kill(pid, signal.SIGKILL)
    groups = detect(NODE)
    for inst in (data_dir / "instances").glob("i-*"):
        group = groups.open(inst.name)
        if group is not None:
            deadline = time.monotonic() + 10
            while group.populated() and time.monotonic() < deadline:
                time.sleep(0.1)
            group.remove()


@pytest.fixture(scope="module")
def images_dir() -> Path:
    missing = [f"{tool} (apt-get install {pkg})" for tool, pkg in TOOLS.items()
               if shutil.which(tool) is None]
    if missing:
        pytest.fail("the vm driver's tests need: " + ", ".join(missing)
                    + "; `make system-packages` installs them")
    d = default_images_dir()
    if not is_current(d):
        done = subprocess.run([sys.executable, "-m", "roost", "images", "build"],
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr
    return d


class VmNode:
    """``roost node --driver vm`` as a child process."""

    def __init__(self, nats_url: str, data_dir: Path) -> None:
        self.argv = [sys.executable, "-m", "roost", "node", "--nats", nats_url,
                     "--node-id", NODE, "--data-dir", str(data_dir), "--driver", "vm",
                     "--capacity", "4vcpu,4GiB", "--heartbeat-seconds", "0.5",
                     "--stop-grace-seconds", "5"]
        self.log = data_dir.with_suffix(".log")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT)

    def wait_ready(self, times: int, timeout: float = 60.0) -> None:
        """Until the node has said it is ready ``times`` times in all (its instances
        re-adopted and its subscriptions made)."""
        deadline = time.monotonic() + timeout
        while self.log.read_text().count(f"node {NODE} ready") < times:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.1)

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


@pytest.fixture(scope="module")
def vm(tmp_path_factory: pytest.TempPathFactory,
       images_dir: Path) -> Iterator[tuple[ThreadedCluster, VmNode]]:
    tmp = tmp_path_factory.mktemp("vm")
    # One sim node too small for any type, so that every launch lands on the vm node.
    c = make_cluster(tmp, nodes=1, capacity="1vcpu,256MiB")
    node = VmNode(c.nats.url, tmp / NODE)
    try:
        node.start()
        node.wait_ready(1)
        c.wait_nodes(2, timeout=30)
        yield c, node
    finally:
        node.stop()
        c.stop()
        _leave_nothing(tmp / NODE)


def _launch(ec2: Any, user_data: str, *, itype: str = "t3.nano",
            image: str = MICROVM_IMAGE_ID) -> str:
    out = ec2.run_instances(ImageId=image, InstanceType=itype, MinCount=1, MaxCount=1,
                            UserData=user_data)
    return str(out["Instances"][0]["InstanceId"])


def test_bad_input_is_refused_and_nothing_is_lost(vm: tuple[ThreadedCluster, VmNode]) -> None:
    cluster, _ = vm
    ec2 = cluster.client()
    before = cluster.allocations()
    with pytest.raises(ClientError) as exc:  # larger than the host
        _launch(ec2, "", itype="t3.2xlarge")
    assert code(exc) == "InsufficientInstanceCapacity"
    # A missing QEMU, an image the node lacks and a non-VM image are refused by the
    # node before anything starts: tests/unit/test_vm_driver.py.
    assert cluster.allocations() == before
    reservations = ec2.describe_instances()["Reservations"]
    assert not [i for r in reservations for i in r["Instances"]
                if i["State"]["Name"] not in ("terminated",)]


def test_a_micro_vm_runs_user_data_and_lives_through_its_lifecycle(
        vm: tuple[ThreadedCluster, VmNode]) -> None:
    cluster, node = vm
    ec2 = cluster.client()
    user_data = (
        'echo "MARKER-$(imds instance-id)-$(imds instance-type)"\n'
        # More than the guest has: the guest's OOM killer ends it; the host is untouched.
        "awk 'BEGIN { s = \"x\"; while (1) s = s s }'; echo \"HOG-DONE $?\"\n"
    )
    iid = _launch(ec2, user_data)
    try:
        wait_state(ec2, iid, "running", timeout=30)
        text = console(ec2, iid, "HOG-DONE", timeout=BOOT_SECONDS)
        assert f"MARKER-{iid}-t3.nano" in text  # its own id, from 169.254.169.254
        assert "Out of memory" in text or "Killed" in text, text
        [pid] = _qemu_pids(iid)
        group = detect(NODE).open(iid)
        assert group is not None and pid in group.pids()
        usage = group.usage()
        assert usage.oom_kills == 0  # the guest's OOM killer acted, not the host's
        limit = BUILTIN["t3.nano"].mem_mib + DEFAULT_OVERHEAD_MIB
        assert usage.memory_peak_bytes <= limit * 2**20, usage  # no more than its cgroup

        # kill -9 of the node agent, then a restart: the VM is re-adopted.
        node.kill()
        assert _qemu_pids(iid) == [pid]
        node.start()
        node.wait_ready(2)
        assert wait_state(ec2, iid, "running")["InstanceId"] == iid
        assert _qemu_pids(iid) == [pid]

        # reboot: the same QEMU resets, and the user data runs again at boot.
        ec2.reboot_instances(InstanceIds=[iid])
        deadline = time.monotonic() + BOOT_SECONDS
        while console(ec2, iid, "MARKER-").count(f"MARKER-{iid}") < 2:
            assert time.monotonic() < deadline, "no second boot after reboot"
            time.sleep(0.5)
        assert _qemu_pids(iid) == [pid]

        ec2.stop_instances(InstanceIds=[iid])
        wait_state(ec2, iid, "stopped", timeout=30)
        assert _qemu_pids(iid) == []
        ec2.start_instances(InstanceIds=[iid])
        wait_state(ec2, iid, "running", timeout=30)
        assert len(_qemu_pids(iid)) == 1
    finally:
        ec2.terminate_instances(InstanceIds=[iid])
    wait_state(ec2, iid, "terminated", timeout=30)
    assert _qemu_pids(iid) == []
    assert detect(NODE).open(iid) is None
