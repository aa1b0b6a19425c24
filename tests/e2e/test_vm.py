"""The vm driver through boto3: every instance a QEMU micro-VM booting roost-microvm.

The gateway and NATS run in-process; the vm nodes are real ``roost node --driver vm``
processes, so that one can be killed with SIGKILL and restarted. A second vm node has a
QEMU that is not there (``ROOST_QEMU``) and says so in its snapshots: launches go to the
first, and one only it fits is refused at once, saying why. One VM carries most of the
checks, because a boot is the cost: under KVM about a second, under TCG (no usable KVM)
tens of seconds.
The tests never skip: missing tools fail with how to install them.
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
from roost.domain.images import MICROVM, MICROVM_IMAGE_ID
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
NO_QEMU = "vm2"
"""A vm node whose QEMU binary is missing, and larger than ``NODE``: the spread policy
would try it first."""


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

    def __init__(self, nats_url: str, data_dir: Path, *, node_id: str = NODE,
                 capacity: str = "4vcpu,4GiB", env: dict[str, str] | None = None) -> None:
        self.node_id = node_id
        self.argv = [sys.executable, "-m", "roost", "node", "--nats", nats_url,
                     "--node-id", node_id, "--data-dir", str(data_dir), "--driver", "vm",
                     "--capacity", capacity, "--heartbeat-seconds", "0.5",
                     "--stop-grace-seconds", "5"]
        self.env = {**os.environ, **(env or {})}
        self.log = data_dir.with_suffix(".log")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         env=self.env)

    def wait_ready(self, times: int, timeout: float = 60.0) -> None:
        """Until the node has said it is ready ``times`` times in all (its instances
        re-adopted and its subscriptions made)."""
        deadline = time.monotonic() + timeout
        while self.log.read_text().count(f"node {self.node_id} ready") < times:
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
    # One sim node too small for any type, so that every launch lands on a vm node.
    c = make_cluster(tmp, nodes=1, capacity="1vcpu,256MiB", policy="spread")
    node = VmNode(c.nats.url, tmp / NODE)
    lacking = VmNode(c.nats.url, tmp / NO_QEMU, node_id=NO_QEMU, capacity="8vcpu,20GiB",
                     env={"ROOST_QEMU": str(tmp / "no-such-qemu")})
    try:
        node.start()
        lacking.start()
        node.wait_ready(1)
        lacking.wait_ready(1)
        c.wait_nodes(3, timeout=30)
        yield c, node
    finally:
        node.stop()
        lacking.stop()
        c.stop()
        _leave_nothing(tmp / NODE)


def _launch(ec2: Any, user_data: str, *, itype: str = "t3.nano",
            image: str = MICROVM_IMAGE_ID) -> str:
    out = ec2.run_instances(ImageId=image, InstanceType=itype, MinCount=1, MaxCount=1,
                            UserData=user_data)
    return str(out["Instances"][0]["InstanceId"])


def _console(ec2: Any, iid: str, marker: str, node: VmNode) -> str:
    """`console`, with what tells why when the marker never comes: the node agent's
    lines about the instance and its last lines, and the processes in the instance's
    cgroup and QEMU's (the metadata service knows a caller by that cgroup)."""
    try:
        return console(ec2, iid, marker, timeout=BOOT_SECONDS)
    except AssertionError as exc:
        lines = node.log.read_text(errors="replace").splitlines()
        about = "\n".join([x for x in lines if iid in x][-20:])
        tail = "\n".join(lines[-40:])
        try:
            processes = _processes(iid)
        except Exception as err:  # the diagnosis must not hide the failure it explains
            processes = f"the instance's processes not read: {err!r}"
        raise AssertionError(f"{exc}\n{processes}\nthe node agent's lines about "
                             f"{iid}:\n{about}\nthe node agent's log ends:\n{tail}") from None


def _processes(iid: str) -> str:
    """The pids in the instance's cgroup, each with its command, and QEMU's cgroups."""
    group = detect(NODE).open(iid)
    pids = sorted(group.pids()) if group is not None else []
    out = [f"the instance's cgroup: {'absent' if group is None else f'{len(pids)} pids'}"]
    for pid in pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            argv = b"(gone)"
        out.append(f"  {pid}: {argv.decode(errors='replace')[:160]}")
    for pid in _qemu_pids(iid):
        try:
            where = Path(f"/proc/{pid}/cgroup").read_text().strip().replace("\n", "; ")
        except OSError:
            where = "(gone)"
        out.append(f"QEMU {pid} runs in: {where}")
    return "\n".join(out)


def _register(ec2: Any, name: str, kernel: Path, initrd: Path) -> str:
    return str(ec2.register_image(Name=name, KernelId=str(kernel),
                                  RamdiskId=str(initrd))["ImageId"])


def test_bad_input_is_refused_and_nothing_is_lost(vm: tuple[ThreadedCluster, VmNode],
                                                  images_dir: Path, tmp_path: Path) -> None:
    cluster, _ = vm
    ec2 = cluster.client()
    before = cluster.allocations()
    with pytest.raises(ClientError) as exc:  # larger than every host
        _launch(ec2, "", itype="t3.2xlarge")
    assert code(exc) == "InsufficientInstanceCapacity"
    # Only the node without QEMU fits a t3.xlarge: refused at once, saying why.
    started = time.monotonic()
    with pytest.raises(ClientError) as exc:
        _launch(ec2, "", itype="t3.xlarge")
    assert code(exc) == "Unsupported", exc.value.response["Error"]
    assert "no-such-qemu is not installed" in str(exc.value)
    assert time.monotonic() - started < 10.0
    # An image whose files went away after it was registered: no node can boot it.
    built = images_dir / MICROVM
    for name in ("vmlinuz", "initrd.img"):
        shutil.copy(built / name, tmp_path / name)
    gone = _register(ec2, "gone-after-registering", tmp_path / "vmlinuz",
                     tmp_path / "initrd.img")
    (tmp_path / "vmlinuz").unlink()
    with pytest.raises(ClientError) as exc:
        _launch(ec2, "", image=gone)
    assert code(exc) == "InvalidAMIID.Unavailable", exc.value.response["Error"]
    assert "is not on this node" in str(exc.value) and NODE in str(exc.value)
    ec2.deregister_image(ImageId=gone)
    assert cluster.allocations() == before
    reservations = ec2.describe_instances()["Reservations"]
    assert not [i for r in reservations for i in r["Instances"]
                if i["State"]["Name"] not in ("terminated",)]


@pytest.mark.timeout(600)  # two TCG boots (launch, reboot) of 30-50 s each on a busy host
def test_a_micro_vm_runs_user_data_and_lives_through_its_lifecycle(
        vm: tuple[ThreadedCluster, VmNode], images_dir: Path) -> None:
    cluster, node = vm
    ec2 = cluster.client()
    # The built image, registered under a name of its own: RegisterImage to a booted VM.
    image = _register(ec2, "microvm-registered", images_dir / MICROVM / "vmlinuz",
                      images_dir / MICROVM / "initrd.img")
    user_data = (
        'echo "MARKER-$(imds instance-id)-$(imds instance-type)"\n'
        # More than the guest has: the guest's OOM killer ends it; the host is untouched.
        "awk 'BEGIN { s = \"x\"; while (1) s = s s }'; echo \"HOG-DONE $?\"\n"
    )
    lacking_log = node.log.with_name(f"{NO_QEMU}.log")
    refusals = lacking_log.read_text().count("refused")
    iid = _launch(ec2, user_data, image=image)
    try:
        inst = wait_state(ec2, iid, "running", timeout=30)
        # The node without QEMU, larger and so first under spread, says in its snapshots
        # that it can launch nothing: it was not asked, and the launch landed here.
        assert lacking_log.read_text().count("refused") == refusals
        assert cluster.record(iid).node_id == NODE  # type: ignore[union-attr]
        text = _console(ec2, iid, "HOG-DONE", node)
        assert f"MARKER-{iid}-t3.nano" in text  # its own id, from 169.254.169.254
        # The guest carries the address EC2 shows for it.
        address = inst["PrivateIpAddress"]
        assert inst["NetworkInterfaces"][0]["PrivateIpAddress"] == address
        assert f"roost-microvm: private address {address}" in text
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

        # reboot: the same QEMU resets; the user data ran at first boot and, as with
        # cloud-init, does not run again.
        ec2.reboot_instances(InstanceIds=[iid])
        text = _console(ec2, iid, "user data ran at first boot; not again", node)
        assert text.count(f"MARKER-{iid}") == 1
        assert _qemu_pids(iid) == [pid]

        ec2.stop_instances(InstanceIds=[iid])
        wait_state(ec2, iid, "stopped", timeout=30)
        assert _qemu_pids(iid) == []
        ec2.start_instances(InstanceIds=[iid])
        wait_state(ec2, iid, "running", timeout=30)
        assert len(_qemu_pids(iid)) == 1
    finally:
        ec2.terminate_instances(InstanceIds=[iid])
        ec2.deregister_image(ImageId=image)
    wait_state(ec2, iid, "terminated", timeout=30)
    assert _qemu_pids(iid) == []
    assert detect(NODE).open(iid) is None


DISK_MARKER = b"roost-disk-boot"


def boot_sector() -> bytes:
    """A raw disk whose boot sector writes DISK_MARKER to the first serial port (the
    instance's console) and halts: a disk image that boots with no Linux in it, in the
    second or two that the firmware takes even under TCG."""
    code = bytes([
        0x31, 0xC0,              # xor ax, ax
        0x8E, 0xD8,              # mov ds, ax
        0xBE, 0x15, 0x7C,        # mov si, 0x7c15 (the message, below)
        0xBA, 0xF8, 0x03,        # mov dx, 0x3f8 (COM1)
        0xAC,                    # loop: lodsb
        0x84, 0xC0,              # test al, al
        0x74, 0x03,              # jz done
        0xEE,                    # out dx, al
        0xEB, 0xF8,              # jmp loop
        0xF4,                    # done: hlt
        0xEB, 0xFD,              # jmp done
    ]) + DISK_MARKER + b"\r\n\0"
    # 1 MiB: in a disk of less than one cylinder (16 heads of 63 sectors) the firmware
    # finds no geometry, and cannot read the boot sector.
    return (code.ljust(510, b"\0") + b"\x55\xaa").ljust(2**20, b"\0")


def test_a_registered_disk_image_boots_from_its_own_boot_loader(
        vm: tuple[ThreadedCluster, VmNode], tmp_path: Path) -> None:
    cluster, _ = vm
    ec2 = cluster.client()
    disk = tmp_path / "boot.raw"
    disk.write_bytes(boot_sector())
    image = str(ec2.register_image(Name="boot-sector", ImageLocation=str(disk))["ImageId"])
    iid = _launch(ec2, "", image=image)
    try:
        console(ec2, iid, DISK_MARKER.decode(), timeout=60)
        work = next(Path(p) for p in _qemu_argv(iid) if p.endswith("/disk.qcow2"))
        assert work.read_bytes().startswith(b"QFI\xfb")  # the instance's own overlay
        assert disk.read_bytes() == boot_sector()  # the image itself is not written
    finally:
        ec2.terminate_instances(InstanceIds=[iid])
        ec2.deregister_image(ImageId=image)
    wait_state(ec2, iid, "terminated", timeout=30)
    assert _qemu_pids(iid) == []


def _qemu_argv(iid: str) -> list[str]:
    """The QEMU command line of ``iid``'s machine, split into its arguments' parts."""
    [pid] = _qemu_pids(iid)
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return [part for arg in argv for part in arg.replace("=", ",").split(",")]
