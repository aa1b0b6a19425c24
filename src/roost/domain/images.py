"""The image catalog: AMI ids that roost knows, and what a node runs for each.

An image names an interpreter for the instance's user data. With no user data, the
instance idles until it is stopped or terminated, like a booted machine.

A VM image (the ``vm`` driver) also names what the machine boots: a kernel and an
initramfs, as paths on the node, absolute or relative to the node's images directory
(``roost images build`` fills it), or a disk image (raw or qcow2) that boots on its own.
The process driver runs a VM image's user data under /bin/sh, as the image's own init
does inside the guest.

The built-in images are `IMAGES`; RegisterImage adds more (`roost.gateway.images` keeps
them, every gateway sees them), with the checks here: EC2's id and name forms, and what
a path must be to name a kernel, an initramfs or a disk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from roost.domain.errors import (
    InvalidAMIIDMalformed,
    InvalidAMINameMalformed,
    InvalidParameterValue,
)
from roost.domain.volumes import DEFAULT_ROOT_DEVICE

DiskFormat = str  # "raw" or "qcow2"
DISK_FORMATS = ("raw", "qcow2")


@dataclass(frozen=True, slots=True)
class Image:
    image_id: str
    name: str
    description: str
    interpreter: str  # "sh" or "python": how the node runs the user data
    kernel: str = ""
    initrd: str = ""
    disk: str = ""
    """A raw or qcow2 disk image that boots by itself (absolute path on the nodes)."""
    disk_format: DiskFormat = ""
    registered: bool = False
    """Added by RegisterImage (a built-in otherwise)."""
    owner_id: str = ""
    """The registering account ("" for the built-ins: the site's owner)."""
    created: str = ""  # ISO 8601 UTC
    architecture: str = "x86_64"
    tags: tuple[tuple[str, str], ...] = field(default=())
    root_device_name: str = DEFAULT_ROOT_DEVICE
    """Where instances of the image have their root volume (RegisterImage's
    ``RootDeviceName``)."""
    root_volume_size: int = 8  # GiB: EC2's default root size, and roost's images'
    root_volume_type: str = "gp2"
    root_delete_on_termination: bool = True
    """The root volume a launch gets unless its own mapping for the root device says
    otherwise (RegisterImage's BlockDeviceMapping for it)."""

    @property
    def bootable(self) -> bool:
        """Whether the vm driver can boot it (it names a kernel or a disk)."""
        return bool(self.kernel or self.disk)

    @property
    def files(self) -> tuple[str, ...]:
        """The paths a node needs to boot it."""
        return tuple(f for f in (self.kernel, self.initrd, self.disk) if f)

    @property
    def location(self) -> str:
        """EC2's imageLocation: where its files are."""
        if not self.registered:
            return f"roost/{self.name}"
        return self.disk or self.kernel


MICROVM = "roost-microvm"
"""The name of the built-in VM image, and of its directory in a node's images directory."""

IMAGES: dict[str, Image] = {
    img.image_id: img
    for img in (
        Image("ami-00000000000000001", "roost-shell", "User data runs under /bin/sh.", "sh"),
        Image(
            "ami-00000000000000002",
            "roost-python",
            "User data runs under the node's Python interpreter.",
            "python",
        ),
        Image(
            "ami-00000000000000003",
            MICROVM,
            "A QEMU micro-VM: a Debian kernel and a busybox initramfs whose init brings up "
            "the network, reads its user data from 169.254.169.254 and runs it under sh.",
            "sh",
            kernel=f"{MICROVM}/vmlinuz",
            initrd=f"{MICROVM}/initrd.img",
        ),
    )
}
DEFAULT_IMAGE_ID = "ami-00000000000000001"
MICROVM_IMAGE_ID = "ami-00000000000000003"


_AMI_ID = re.compile(r"ami-(?:[0-9a-f]{8}|[0-9a-f]{17})")
_AMI_NAME = re.compile(r"[a-zA-Z0-9()\[\] ./\-'@_]{3,128}")
QCOW2_MAGIC = b"QFI\xfb"
BZIMAGE_MAGIC = (0x202, b"HdrS")
"""A Linux boot image (bzImage) says ``HdrS`` at offset 0x202 (the x86 boot protocol)."""


def check_image_id(image_id: str) -> str:
    """EC2's form, ``ami-`` and 8 or 17 hex digits; InvalidAMIID.Malformed otherwise."""
    if not _AMI_ID.fullmatch(image_id):
        raise InvalidAMIIDMalformed(f'Invalid id: "{image_id[:80]}" (expecting "ami-...")')
    return image_id


def check_image_name(name: str) -> str:
    """EC2's rule: 3 to 128 letters, digits, spaces and ( ) [ ] . / - ' @ _."""
    if not _AMI_NAME.fullmatch(name):
        raise InvalidAMINameMalformed(
            "AMI names must be between 3 and 128 characters long, and may contain letters, "
            "numbers, '(', ')', '.', '-', '/', '_', '[', ']', ' ', '@' and \"'\"")
    return name


def check_path(path: str, what: str) -> str:
    """An absolute, normalised path on the nodes (no ``..``, no NUL)."""
    pure = PurePosixPath(path)
    if (not path or "\0" in path or not pure.is_absolute() or ".." in pure.parts
            or str(pure) != path):
        raise InvalidParameterValue(
            f"Value ({path[:200]}) for parameter {what} is invalid. It must be an absolute, "
            "normalised path to the file on the nodes.")
    return path


def disk_format(head: bytes) -> DiskFormat:
    """A disk image's format from its first bytes: qcow2 by its magic, raw otherwise."""
    return "qcow2" if head.startswith(QCOW2_MAGIC) else "raw"


def is_kernel(head: bytes) -> bool:
    """Whether the first kilobyte is a Linux x86 boot image's."""
    at, magic = BZIMAGE_MAGIC
    return head[at:at + len(magic)] == magic
