"""EBS volumes as roost records them: pure data and EC2's rules for them.

An instance's root volume and the extra volumes RunInstances maps are derived from the
instance record (`LaunchVolume`, ids named after the instance), so a launch writes
nowhere but the instance record. A volume that lives on its own (CreateVolume, or a
launch volume once detached or kept after its instance terminated) is a stored `Volume`
in the `roost_volumes` bucket; a stored record under a derived id replaces what the
instance record says. Nothing is mounted: the volumes are recorded, not provided (see
docs/gateway.md).
"""

from __future__ import annotations

import re

import msgspec

from roost.domain.network import derived_id

VOLUME_TYPES = ("standard", "io1", "io2", "gp2", "gp3", "sc1", "st1")
SIZE_LIMITS = {"standard": (1, 1024), "io1": (4, 16384), "io2": (4, 65536),
               "gp2": (1, 16384), "gp3": (1, 16384), "sc1": (125, 16384),
               "st1": (125, 16384)}
"""GiB, per volume type, as EC2 bounds them."""
_DEVICE = re.compile(r"/dev/(sd|xvd|hd)[a-z]{1,2}[0-9]{0,2}|xvd[a-z]{1,2}[0-9]{0,2}")


class Attachment(msgspec.Struct, frozen=True):
    instance_id: str
    device: str
    attach_time: str  # ISO 8601, UTC
    delete_on_termination: bool = False


class Volume(msgspec.Struct, frozen=True):
    volume_id: str
    size: int  # GiB
    volume_type: str
    availability_zone: str
    create_time: str  # ISO 8601, UTC
    iops: int | None = None
    throughput: int | None = None
    encrypted: bool = False
    snapshot_id: str = ""
    tags: dict[str, str] = {}
    attachment: Attachment | None = None
    deleted: bool = False
    """A tombstone: kept so that a late "keep this volume" write (its instance's
    termination seen again after a restart) cannot bring a deleted volume back."""
    owner_id: str = ""
    """The account the volume belongs to: its instance's, or its creator's ("" predates
    accounts: the default account)."""

    @property
    def state(self) -> str:
        return "in-use" if self.attachment is not None else "available"


class LaunchVolume(msgspec.Struct, frozen=True):
    """A mapping of RunInstances beyond the root device: a new, empty EBS volume."""

    device: str
    size: int
    volume_type: str = "gp2"
    iops: int | None = None
    throughput: int | None = None
    encrypted: bool = False
    delete_on_termination: bool = True


def launch_volume_id(instance_id: str, device: str) -> str:
    return derived_id("vol", instance_id, device)


DEFAULT_ROOT_DEVICE = "/dev/xvda"
"""The root device of roost's built-in images, and of a registered image that names
none (EC2's images each name theirs: ``RootDeviceName``)."""


def valid_device(name: str) -> bool:
    return bool(_DEVICE.fullmatch(name))


def default_iops(volume_type: str, size: int) -> int | None:
    if volume_type == "gp3":
        return 3000
    if volume_type == "gp2":
        return min(16000, max(100, 3 * size))
    return None


def default_throughput(volume_type: str) -> int | None:
    return 125 if volume_type == "gp3" else None


def size_error(volume_type: str, size: int) -> str:
    """EC2's message for a size out of its type's range, or "" when it is in range."""
    low, high = SIZE_LIMITS[volume_type]
    if low <= size <= high:
        return ""
    return f"Volume of {size}GiB is out of range for {volume_type} ({low}-{high} GiB)."
