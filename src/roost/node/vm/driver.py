"""The ``vm`` driver: every instance is one QEMU process running a micro-VM.

It is the process driver (`roost.node.process`) with QEMU as the instance's program, so
the parts that must not differ stay shared: the process runs in the instance's cgroup
from the isolation layer before it does anything (so the metadata service recognises
the guest's connections, which QEMU opens, as the instance's), the serial console is
QEMU's stdout into ``console.log``, an agent restart re-adopts by cgroup and pid, and a
QEMU that ends by itself (the guest powered off, or the OOM killer) is an
instance-initiated shutdown. What differs:

- the cgroup's memory limit is the type's memory plus ``overhead_mib`` for QEMU itself,
  so the guest can use all of its RAM and still cannot take the host's; the ledger
  charges the same overhead per instance;
- stop is an ACPI power-down over QMP, then ``quit`` after the grace period, then
  SIGKILL for anything left; terminate is the same with no grace;
- reboot is QMP ``system_reset``: the same QEMU process, cgroup and console.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from pathlib import Path

from roost.domain.catalog import InstanceType
from roost.domain.images import IMAGES, MICROVM_IMAGE_ID, Image
from roost.node.cgroups import Limits
from roost.node.drivers import (
    ExitCallback,
    ImageMissing,
    ProcessRef,
    StartSpec,
    Unrunnable,
    alive,
)
from roost.node.isolation import Isolation, Level, limits_for, make_isolation
from roost.node.metadata import ENDPOINT_ENV
from roost.node.process import ProcessDriver
from roost.node.vm import qemu
from roost.node.vm.build import default_images_dir

log = logging.getLogger(__name__)

DEFAULT_OVERHEAD_MIB = 160
"""QEMU's own memory per micro-VM, beyond the guest's RAM (measured: docs/benchmarks.md)."""
_QUIT_WAIT = 5.0  # after QMP quit, before SIGKILL


class VmDriver(ProcessDriver):
    name = "vm"

    def __init__(self, isolation: Isolation, *, images_dir: Path, qemu_binary: str | None,
                 accelerator: qemu.Accelerator,
                 overhead_mib: int = DEFAULT_OVERHEAD_MIB, qemu_name: str = qemu.QEMU) -> None:
        super().__init__(isolation)
        self.images_dir = images_dir
        self.qemu = qemu_binary
        self.qemu_name = qemu_name
        self.accel = accelerator
        self.overhead_mib = overhead_mib
        self._reset: set[str] = set()
        self._workdirs: dict[str, Path] = {}

    @property
    def isolation_note(self) -> str:
        notes = [n for n in (self._iso.note, self.accel.note) if n]
        if self.qemu is None:
            notes.append(qemu.missing_qemu(self.qemu_name))
        return "; ".join(notes)

    @property
    def cannot_launch(self) -> str:
        return "" if self.qemu is not None else qemu.missing_qemu(self.qemu_name)

    def limits(self, itype: InstanceType) -> Limits:
        base = limits_for(itype)
        return Limits(cpu_milli=base.cpu_milli, mem_mib=itype.mem_mib + self.overhead_mib,
                      pids_max=base.pids_max)

    # -- starting ------------------------------------------------------------------

    def boot_files(self, image: Image) -> qemu.Boot:
        """What QEMU boots for the image on this node; `Unrunnable` saying what is
        missing (and how to make it) when the node lacks it."""
        if not image.bootable and image.interpreter == "sh":
            # roost-shell promises user data under /bin/sh: roost-microvm's init keeps
            # that promise, so the default image launches on a vm node too.
            image = IMAGES[MICROVM_IMAGE_ID]
        if not image.bootable:
            raise Unrunnable(f"image {image.image_id} ({image.name}) is not a VM image; "
                             f"the vm driver boots images with a kernel or a disk, such "
                             f"as ami-00000000000000003 (roost-microvm)")
        fix = ("build it with `roost images build`" if not image.registered
               else "copy the image's files to the same path on every vm node")
        paths = [self.images_dir / f for f in image.files]  # absolute paths stay as they are
        for path in paths:
            if not path.is_file() or not os.access(path, os.R_OK):
                raise ImageMissing(f"image {image.image_id} ({image.name}): {path} is not "
                                 f"on this node ({fix})")
        if image.disk:
            return qemu.Boot(disk=paths[0], disk_format=image.disk_format or "raw")
        return qemu.Boot(kernel=paths[0], initrd=paths[1] if image.initrd else None)

    def check_image(self, image: Image) -> None:
        if self.qemu is None:
            raise Unrunnable(qemu.missing_qemu(self.qemu_name))
        self.boot_files(image)

    def _command(self, spec: StartSpec) -> list[str]:
        if self.qemu is None:
            raise Unrunnable(qemu.missing_qemu(self.qemu_name))
        boot = self.boot_files(spec.image)
        spec.workdir.mkdir(parents=True, exist_ok=True)
        (spec.workdir / qemu.QMP_SOCKET).unlink(missing_ok=True)
        return qemu.command(self.qemu, itype=spec.itype, boot=qemu.instance_disks(
                                boot, spec.workdir), workdir=spec.workdir,
                            accel=self.accel.accel,
                            imds_port=_port(spec.env.get(ENDPOINT_ENV, "")))

    async def start(self, spec: StartSpec, on_exit: ExitCallback) -> ProcessRef | None:
        iid = spec.instance_id
        ref = self._refs.get(iid)
        if iid in self._reset and ref is not None and alive(ref):
            self._reset.discard(iid)
            await qemu.qmp(spec.workdir, "system_reset")
            log.info("instance %s: reset", iid)
            return ref
        self._reset.discard(iid)
        self._workdirs[iid] = spec.workdir
        return await super().start(spec, on_exit)

    # -- stopping ----------------------------------------------------------------------

    async def stop(self, instance_id: str, *, grace: float, keep: bool = False) -> None:
        ref = self._refs.get(instance_id)
        running = ref is not None and alive(ref)
        if keep and running:
            # A reboot: the machine resets in place when the agent starts it again.
            self._reset.add(instance_id)
            return
        if running:
            self._stopping.add(instance_id)  # its exit is ours, not the guest's
            await self._shut_down(instance_id, grace)
        await super().stop(instance_id, grace=0.0, keep=keep)

    async def _shut_down(self, instance_id: str, grace: float) -> None:
        workdir = self._workdir_of(instance_id)
        watcher = self._watchers.get(instance_id)
        if workdir is None or watcher is None:
            return
        steps: list[tuple[str, float]] = [("quit", _QUIT_WAIT)]
        if grace > 0:
            steps.insert(0, ("system_powerdown", grace))
        for cmd, wait in steps:
            try:
                await qemu.qmp(workdir, cmd)
            except Exception as exc:  # QMP gone or QEMU hung: SIGKILL follows
                log.warning("instance %s: QMP %s failed: %s", instance_id, cmd, exc)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(watcher), wait)
                return

    def _workdir_of(self, instance_id: str) -> Path | None:
        return self._workdirs.get(instance_id)

    def adopt(self, spec: StartSpec, ref: ProcessRef | None, on_exit: ExitCallback) -> bool:
        self._workdirs[spec.instance_id] = spec.workdir
        return super().adopt(spec, ref, on_exit)


def _port(endpoint: str) -> int | None:
    """The port of ``http://127.0.0.1:PORT``, None when there is none."""
    tail = endpoint.rstrip("/").rpartition(":")[2]
    return int(tail) if tail.isdigit() else None


ACCEL_ENV = "ROOST_VM_ACCEL"
"""kvm, tcg or auto (the default): auto probes KVM once when the node starts."""
QEMU_ENV = "ROOST_QEMU"
"""The QEMU binary, a name on PATH or a path (default ``qemu-system-x86_64``)."""


def make_vm_driver(*, node_id: str, isolation: Level, data_dir: Path,
                   images_dir: Path | None = None) -> VmDriver:
    """The vm driver for a node. The VM is the sandbox here, so isolation ``sandbox``
    means cgroup (bubblewrap would hide /dev/kvm from QEMU)."""
    level: Level = "cgroup" if isolation == "sandbox" else isolation
    iso = make_isolation(level, node_id=node_id, data_dir=data_dir)
    images = images_dir or default_images_dir()
    name = os.environ.get(QEMU_ENV) or qemu.QEMU
    binary = qemu.qemu_binary(name)
    wanted = os.environ.get(ACCEL_ENV, "auto")
    if binary is None:
        log.error("node %s: %s; every launch will be refused", node_id,
                  qemu.missing_qemu(name))
        accel = qemu.Accelerator("tcg", "")
    elif wanted == "kvm":
        accel = qemu.Accelerator("kvm", "")
    elif wanted == "tcg":
        accel = qemu.Accelerator("tcg", f"TCG chosen by {ACCEL_ENV}")
    else:
        accel = _probed(binary, images / IMAGES[MICROVM_IMAGE_ID].kernel, data_dir)
    if accel.note:
        log.warning("node %s: %s", node_id, accel.note)
    else:
        log.info("node %s: micro-VMs under %s", node_id, accel.accel.upper())
    return VmDriver(iso, images_dir=images, qemu_binary=binary, accelerator=accel,
                    qemu_name=name)


def _probed(binary: str, kernel: Path, data_dir: Path) -> qemu.Accelerator:
    """`qemu.probe_accelerator`, kept in the data dir for this host boot, so that an
    agent restart (re-adopting its VMs) does not wait on the probe again."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    path = data_dir / "accelerator.json"
    key = {"boot_id": boot, "qemu": binary, "kernel": str(kernel)}
    try:
        kept = json.loads(path.read_text())
        if boot and kept.get("key") == key and kept.get("accel") in ("kvm", "tcg"):
            return qemu.Accelerator(kept["accel"], str(kept.get("note", "")))
    except (OSError, ValueError):
        pass
    accel = qemu.probe_accelerator(binary, kernel)
    if kernel.exists():  # a probe without a kernel proves little: ask again next time
        data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"key": key, "accel": accel.accel, "note": accel.note}))
    return accel
