"""How one micro-VM is started and spoken to: QEMU's command line, the KVM probe, and
QMP over the unix socket in the instance's directory."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from qemu.qmp import QMPClient

from roost.domain.catalog import InstanceType
from roost.node.vm import connector

log = logging.getLogger(__name__)

QEMU = "qemu-system-x86_64"
QEMU_PACKAGE = "qemu-system-x86"
QMP_SOCKET = "qmp.sock"
METADATA_ADDRESS = "169.254.169.254"
GUEST_NET = "169.254.169.0/24"
"""The guest's user-mode network. QEMU forwards only addresses inside it to the host
(guestfwd), so the network is the link-local /24 that holds the metadata address; the
guest leases .15 from QEMU's DHCP."""
GUEST_ADDRESS = "169.254.169.15"
KERNEL_ARGS = ("console=ttyS0 quiet panic=-1 mitigations=off tsc=reliable no_timer_check "
               "random.trust_cpu=on i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd")
Accel = Literal["kvm", "tcg"]
TCG_CACHE_MIB = 64


@dataclass(frozen=True, slots=True)
class Accelerator:
    accel: Accel
    note: str
    """Why it is TCG ("" with KVM)."""


def qemu_binary(name: str = QEMU) -> str | None:
    return shutil.which(name)


def missing_qemu(name: str = QEMU) -> str:
    return (f"{name} is not installed on this node (Debian/Ubuntu: apt-get install "
            f"{QEMU_PACKAGE})")


def probe_accelerator(qemu: str, kernel: Path | None, *, timeout: float = 4.0) -> Accelerator:
    """KVM when /dev/kvm opens and a guest really runs under it (its kernel prints its
    banner within ``timeout``); otherwise TCG, saying why. Nested hosts can expose a
    /dev/kvm whose guests hang, so opening the device is not proof."""
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
    except OSError as exc:
        return Accelerator("tcg", f"KVM unavailable ({exc.strerror}: /dev/kvm); micro-VMs "
                                  "run under TCG emulation, many times slower")
    os.close(fd)
    if kernel is None or not kernel.exists():
        return Accelerator("kvm", "")
    argv = [qemu, "-machine", "microvm,accel=kvm", "-cpu", "host", "-m", "128",
            "-no-user-config", "-display", "none", "-monitor", "none", "-serial", "stdio",
            "-kernel", str(kernel), "-append", "console=ttyS0 earlyprintk=ttyS0 panic=-1"]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    seen = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            seen += proc.stdout.read() or b""
            if b"Linux version" in seen:
                return Accelerator("kvm", "")
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    return Accelerator("tcg", f"/dev/kvm opens but a guest kernel did not start under KVM "
                              f"within {timeout:.0f} s (nested virtualisation without the "
                              "CPU features a guest needs?); micro-VMs run under TCG "
                              "emulation, many times slower")


STATE_DISK = "state.img"
STATE_DISK_BYTES = 64 * 1024
"""A small raw disk per instance that outlives reboots and stop/start: roost-microvm's
init marks it when it has run the user data, so that the user data runs at first boot
only, as cloud-init's scripts-user does."""
DISK_OVERLAY = "disk.qcow2"


@dataclass(frozen=True, slots=True)
class Boot:
    """What one machine boots: a kernel (and initramfs), or a disk with its own boot
    loader; ``state`` is the instance's state disk (kernel images only)."""

    kernel: Path | None = None
    initrd: Path | None = None
    disk: Path | None = None
    disk_format: str = "raw"
    state: Path | None = None


def instance_disks(boot: Boot, workdir: Path) -> Boot:
    """``boot`` with the instance's own disks, made on first use: a kernel image gets a
    state disk; a disk image a qcow2 overlay on it (``qemu-img``), so the image itself
    is never written and what the guest writes lasts across stop and start."""
    if boot.kernel is not None:
        state = workdir / STATE_DISK
        if not state.exists():
            with state.open("wb") as f:
                f.truncate(STATE_DISK_BYTES)
        return Boot(kernel=boot.kernel, initrd=boot.initrd, state=state)
    assert boot.disk is not None
    overlay = workdir / DISK_OVERLAY
    if not overlay.exists():
        tool = shutil.which("qemu-img")
        if tool is None:
            raise OSError("qemu-img is not installed on this node (Debian/Ubuntu: "
                          "apt-get install qemu-utils)")
        done = subprocess.run([tool, "create", "-q", "-f", "qcow2", "-b", str(boot.disk),
                               "-F", boot.disk_format, str(overlay)],
                              capture_output=True, text=True, check=False, timeout=60)
        if done.returncode != 0:
            raise OSError(f"qemu-img create failed: {done.stderr.strip()[-300:]}")
    return Boot(disk=overlay, disk_format="qcow2")


def vcpus(itype: InstanceType) -> int:
    return max(1, math.ceil(itype.cpu_milli / 1000))


def command(qemu: str, *, itype: InstanceType, boot: Boot, workdir: Path, accel: Accel,
            imds_port: int | None) -> list[str]:
    """QEMU's argv for one instance: the serial console on stdout (the driver points it
    at console.log), QMP on a unix socket in the instance's directory."""
    net = f"user,id=net0,net={GUEST_NET},dhcpstart={GUEST_ADDRESS}"
    if imds_port:
        # One short-lived connector per guest connection, started by QEMU and so in the
        # instance's cgroup: the metadata service recognises its caller as for a process.
        net += (f",guestfwd=tcp:{METADATA_ADDRESS}:80-cmd:"
                f"{_connector()} 127.0.0.1 {imds_port}")
    # microvm under KVM; under TCG its guest finds no clock to calibrate against, so q35,
    # and q35 for a disk too (its firmware runs the disk's boot loader).
    # TCG's translation cache is capped (its default, 1 GiB, would count against the
    # instance's memory limit).
    micro = accel == "kvm" and boot.kernel is not None
    machine = "microvm" if micro else "q35"
    accel_opt = "kvm" if accel == "kvm" else f"tcg,tb-size={TCG_CACHE_MIB}"
    bus = "device" if micro else "pci"
    argv = [
        qemu, "-name", workdir.name, "-machine", machine, "-accel", accel_opt,
        "-cpu", "host" if accel == "kvm" else "max",
        "-smp", str(vcpus(itype)), "-m", str(itype.mem_mib),
        "-no-user-config", "-display", "none", "-monitor", "none", "-serial", "stdio",
        "-qmp", f"unix:{workdir / QMP_SOCKET},server=on,wait=off",
        "-netdev", net, "-device", f"virtio-net-{bus},netdev=net0",
    ]
    if boot.kernel is not None:
        argv += ["-kernel", str(boot.kernel), "-append", KERNEL_ARGS]
        if boot.initrd is not None:
            argv += ["-initrd", str(boot.initrd)]
    for drive, path, fmt in (("disk", boot.disk, boot.disk_format),
                             ("state", boot.state, "raw")):
        if path is not None:
            argv += ["-drive", f"file={path},if=none,id={drive},format={fmt}",
                     "-device", f"virtio-blk-{bus},drive={drive}"]
    return argv


def _connector() -> str:
    """The host command QEMU runs per guest connection to the metadata address."""
    return f"{sys.executable} -S -I {connector.__file__}"


async def qmp(workdir: Path, cmd: str, args: dict[str, Any] | None = None, *,
              timeout: float = 5.0) -> object:
    """Run one QMP command on the instance's socket (connect included, in ``timeout``)."""
    client = QMPClient(workdir.name)

    async def run() -> object:
        await client.connect(str(workdir / QMP_SOCKET))
        return await client.execute(cmd, args)

    try:
        return await asyncio.wait_for(run(), timeout)
    finally:
        with contextlib.suppress(Exception):  # after quit, QEMU hangs up first
            await client.disconnect()
