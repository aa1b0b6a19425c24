"""The image catalog: AMI ids that roost knows, and what a node runs for each.

An image names an interpreter for the instance's user data. With no user data, the
instance idles until it is stopped or terminated, like a booted machine.

A VM image (the ``vm`` driver) also names what the machine boots: a kernel and an
initramfs, as paths on the node, absolute or relative to the node's images directory
(``roost images build`` fills it). The process driver runs a VM image's user data under
/bin/sh, as the image's own init does inside the guest.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Image:
    image_id: str
    name: str
    description: str
    interpreter: str  # "sh" or "python": how the node runs the user data
    kernel: str = ""
    initrd: str = ""

    @property
    def bootable(self) -> bool:
        """Whether the vm driver can boot it (it names a kernel)."""
        return bool(self.kernel)


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
