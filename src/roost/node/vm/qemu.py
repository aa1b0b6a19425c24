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


def vcpus(itype: InstanceType) -> int:
    return max(1, math.ceil(itype.cpu_milli / 1000))


def command(qemu: str, *, itype: InstanceType, kernel: Path, initrd: Path | None,
            workdir: Path, accel: Accel, imds_port: int | None) -> list[str]:
    """QEMU's argv for one instance: the serial console on stdout (the driver points it
    at console.log), QMP on a unix socket in the instance's directory."""
    net = f"user,id=net0,net={GUEST_NET},dhcpstart={GUEST_ADDRESS}"
    if imds_port:
        # One short-lived connector per guest connection, started by QEMU and so in the
        # instance's cgroup: the metadata service recognises its caller as for a process.
        net += (f",guestfwd=tcp:{METADATA_ADDRESS}:80-cmd:"
                f"{_connector()} 127.0.0.1 {imds_port}")
    # microvm under KVM; under TCG its guest finds no clock to calibrate against, so q35.
    # TCG's translation cache is capped (its default, 1 GiB, would count against the
    # instance's memory limit).
    machine, accel_opt = (("microvm", "kvm") if accel == "kvm"
                          else ("q35", f"tcg,tb-size={TCG_CACHE_MIB}"))
    nic = "virtio-net-device" if accel == "kvm" else "virtio-net-pci"
    argv = [
        qemu, "-name", workdir.name, "-machine", machine, "-accel", accel_opt,
        "-cpu", "host" if accel == "kvm" else "max",
        "-smp", str(vcpus(itype)), "-m", str(itype.mem_mib),
        "-no-user-config", "-display", "none", "-monitor", "none", "-serial", "stdio",
        "-qmp", f"unix:{workdir / QMP_SOCKET},server=on,wait=off",
        "-kernel", str(kernel), "-append", KERNEL_ARGS,
        "-netdev", net, "-device", f"{nic},netdev=net0",
    ]
    if initrd is not None:
        argv[argv.index("-append"):argv.index("-append")] = ["-initrd", str(initrd)]
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
