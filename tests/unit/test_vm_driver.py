"""The vm driver's decisions that need no VM: QEMU's command line, what a node refuses
before anything starts (and leaves nothing behind), the ledger's per-VM overhead, and the
image build's module order."""

from __future__ import annotations

from pathlib import Path

import pytest

from roost.domain.catalog import BUILTIN
from roost.domain.errors import (
    InvalidAMIIDMalformed,
    InvalidAMINameMalformed,
    InvalidParameterValue,
)
from roost.domain.host import HostCapacity
from roost.domain.images import (
    IMAGES,
    MICROVM,
    MICROVM_IMAGE_ID,
    Image,
    check_image_id,
    check_image_name,
    check_path,
    disk_format,
    is_kernel,
)
from roost.domain.resources import Resources
from roost.node.drivers import StartSpec, Unrunnable
from roost.node.isolation import Isolation
from roost.node.ledger import Ledger
from roost.node.process import ProcessDriver
from roost.node.vm import qemu
from roost.node.vm.build import _with_dependencies
from roost.node.vm.driver import VmDriver

NANO = BUILTIN["t3.nano"]
KVM = qemu.Accelerator("kvm", "")


def _driver(images: Path, binary: str | None = "/usr/bin/qemu-system-x86_64") -> VmDriver:
    return VmDriver(Isolation("none", ""), images_dir=images, qemu_binary=binary,
                    accelerator=KVM, overhead_mib=100)


def _spec(tmp: Path, image: str = MICROVM_IMAGE_ID) -> StartSpec:
    return StartSpec("i-0123456789abcdef0", NANO, IMAGES[image], "", tmp / "i")


def _built(tmp: Path) -> Path:
    (tmp / MICROVM).mkdir(parents=True)
    for name in ("vmlinuz", "initrd.img"):
        (tmp / MICROVM / name).write_bytes(b"x")
    return tmp


def test_qemu_command_sizes_the_vm_and_forwards_metadata(tmp_path: Path) -> None:
    boot = qemu.Boot(kernel=tmp_path / "k", initrd=tmp_path / "i", state=tmp_path / "s")
    argv = qemu.command("qemu", itype=BUILTIN["t3.large"], boot=boot,
                        workdir=tmp_path / "i-1", accel="kvm", imds_port=4567)
    assert argv[argv.index("-m") + 1] == str(BUILTIN["t3.large"].mem_mib)
    assert argv[argv.index("-smp") + 1] == "2"
    assert argv[argv.index("-machine") + 1] == "microvm"
    assert argv[argv.index("-accel") + 1] == "kvm"
    net = argv[argv.index("-netdev") + 1]
    assert "guestfwd=tcp:169.254.169.254:80-cmd:" in net and "127.0.0.1 4567" in net
    assert f"unix:{tmp_path / 'i-1' / 'qmp.sock'}" in argv[argv.index("-qmp") + 1]
    assert f"file={tmp_path / 's'},if=none,id=state,format=raw" in argv
    assert "virtio-blk-device,drive=state" in argv
    tcg = qemu.command("qemu", itype=NANO, boot=qemu.Boot(kernel=tmp_path / "k"),
                       workdir=tmp_path, accel="tcg", imds_port=None)
    assert tcg[tcg.index("-machine") + 1] == "q35" and "-initrd" not in tcg
    assert tcg[tcg.index("-accel") + 1].startswith("tcg,tb-size=")
    assert "guestfwd" not in tcg[tcg.index("-netdev") + 1]
    # A disk boots by its own loader, under q35's firmware even with KVM.
    disk = qemu.command("qemu", itype=NANO, boot=qemu.Boot(disk=tmp_path / "d.qcow2",
                                                           disk_format="qcow2"),
                        workdir=tmp_path, accel="kvm", imds_port=None)
    assert disk[disk.index("-machine") + 1] == "q35" and "-kernel" not in disk
    assert f"file={tmp_path / 'd.qcow2'},if=none,id=disk,format=qcow2" in disk


def test_a_disk_image_boots_from_an_overlay_and_a_kernel_gets_a_state_disk(
        tmp_path: Path) -> None:
    base = tmp_path / "base.raw"
    base.write_bytes(b"\0" * 65536)
    work = tmp_path / "i"
    work.mkdir()
    boot = qemu.instance_disks(qemu.Boot(disk=base, disk_format="raw"), work)
    assert boot.disk == work / qemu.DISK_OVERLAY and boot.disk_format == "qcow2"
    assert boot.disk.read_bytes().startswith(b"QFI\xfb")  # qemu-img made it
    assert base.read_bytes() == b"\0" * 65536  # the image itself is never written
    kernel = qemu.instance_disks(qemu.Boot(kernel=tmp_path / "k"), work)
    assert kernel.state is not None and kernel.state.stat().st_size == qemu.STATE_DISK_BYTES

def test_a_missing_qemu_is_refused_with_how_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(Unrunnable, match="apt-get install qemu-system-x86"):
        _driver(_built(tmp_path), binary=None).prepare(_spec(tmp_path))
    assert not (tmp_path / "i").exists()


def test_an_image_the_node_lacks_is_refused_saying_how_to_build_it(tmp_path: Path) -> None:
    with pytest.raises(Unrunnable, match="roost images build") as exc:
        _driver(tmp_path).prepare(_spec(tmp_path))
    assert str(tmp_path / MICROVM / "vmlinuz") in str(exc.value)
    with pytest.raises(Unrunnable, match="not a VM image"):
        _driver(_built(tmp_path)).prepare(_spec(tmp_path, "ami-00000000000000002"))
    _driver(tmp_path).prepare(_spec(tmp_path))  # built: accepted
    # roost-shell (user data under sh) boots roost-microvm, whose init runs it under sh.
    assert _driver(tmp_path).boot_files(IMAGES["ami-00000000000000001"]).kernel == (
        tmp_path / MICROVM / "vmlinuz")
    # A registered image names absolute paths on the node.
    disk = Image("ami-0123456789abcdef0", "mine", "", "sh", disk=str(tmp_path / "d.raw"),
                 disk_format="raw", registered=True)
    with pytest.raises(Unrunnable, match="same path on every vm node"):
        _driver(tmp_path).boot_files(disk)
    (tmp_path / "d.raw").write_bytes(b"\0")
    assert _driver(tmp_path).boot_files(disk).disk == tmp_path / "d.raw"
    # The process driver boots nothing: a registered image is not for it.
    with pytest.raises(Unrunnable, match="--driver vm"):
        ProcessDriver(Isolation("none", "")).check_image(disk)


def test_the_cgroup_holds_the_type_plus_qemu(tmp_path: Path) -> None:
    limits = _driver(tmp_path).limits(NANO)
    assert limits.mem_mib == NANO.mem_mib + 100 and limits.cpu_milli == NANO.cpu_milli


def test_the_ledger_charges_each_vm_its_overhead() -> None:
    host = HostCapacity(total=Resources(64_000, 4096), reserve=Resources(0, 0))
    plain, vms = Ledger(host, BUILTIN), Ledger(host, BUILTIN, overhead_mib=512)
    assert plain.fit_counts()["t3.nano"] == 8 and vms.fit_counts()["t3.nano"] == 4
    for i in range(4):
        assert vms.allocate(f"i-{i}", NANO) is not None
    assert vms.allocate("i-5", NANO) is None
    assert vms.release("i-0") and vms.free.resources.mem_mib == 1024


def test_modules_load_after_what_they_depend_on(tmp_path: Path) -> None:
    deps = {"virtio_ring": "", "virtio": "virtio_ring", "virtio_net": "virtio_ring,virtio",
            "button": ""}
    for name, dep in deps.items():
        (tmp_path / f"{name}.ko").write_bytes(b"\0stuff\0depends=" + dep.encode() + b"\0")
    order = [n for n, _ in _with_dependencies(tmp_path, ("virtio_net", "button", "gone"))]
    assert order == ["virtio_ring", "virtio", "virtio_net", "button"]


def test_image_ids_names_and_paths_are_checked_as_ec2_and_the_nodes_need() -> None:
    assert check_image_id("ami-0123456789abcdef0") and check_image_id("ami-12345678")
    for bad in ("ami-xyz", "ami-0123456789ABCDEF0", "i-0123456789abcdef0", "ami-123"):
        with pytest.raises(InvalidAMIIDMalformed):
            check_image_id(bad)
    assert check_image_name("web (v2) [x86] o'neil@home_1.0/a-b")
    for bad in ("ab", "x" * 129, "a|b", "tab\there"):
        with pytest.raises(InvalidAMINameMalformed):
            check_image_name(bad)
    assert check_path("/srv/images/disk.raw", "ImageLocation")
    for bad in ("disk.raw", "/srv/../etc/disk", "/srv//disk", "/srv/disk/", "/a\0b", ""):
        with pytest.raises(InvalidParameterValue):
            check_path(bad, "ImageLocation")
    assert disk_format(b"QFI\xfb\0\0\0\3") == "qcow2" and disk_format(bytes(512)) == "raw"
    kernel = bytearray(1024)
    assert not is_kernel(bytes(kernel))
    kernel[0x202:0x206] = b"HdrS"
    assert is_kernel(bytes(kernel))
