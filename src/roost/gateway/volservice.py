"""CreateVolume, AttachVolume, DetachVolume, DeleteVolume and DescribeVolumes: typed
requests in, volumes or EC2's errors out. The volumes are recorded, not provided: no
block device appears in any instance (docs/gateway.md)."""

from __future__ import annotations

import re
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

import msgspec

from roost.bus.schemas import InstanceNetwork, InstanceRecord
from roost.domain.errors import (
    IncorrectInstanceState,
    IncorrectState,
    InvalidAttachmentNotFound,
    InvalidInstanceIDNotFound,
    InvalidParameterValue,
    InvalidVolumeIDMalformed,
    InvalidVolumeNotFound,
    InvalidVolumeZoneMismatch,
    InvalidZoneNotFound,
    MissingParameter,
    OperationNotPermitted,
    VolumeInUse,
)
from roost.domain.volumes import (
    VOLUME_TYPES,
    Attachment,
    Volume,
    default_iops,
    default_throughput,
    size_error,
    valid_device,
)
from roost.gateway.describe import Field, apply_filters
from roost.gateway.index import InstanceIndex
from roost.gateway.netrequests import resource_tags
from roost.gateway.query import Params
from roost.gateway.requests import DescribeRequest
from roost.gateway.tenancy import account
from roost.gateway.volumes import VolumeRaced, VolumeStore

_ID = re.compile(r"vol-[0-9a-f]{8,17}")


@dataclass(frozen=True, slots=True)
class CreateVolumeRequest:
    zone: str
    size: int
    volume_type: str = "gp2"
    iops: int | None = None
    throughput: int | None = None
    encrypted: bool = False
    tags: tuple[tuple[str, str], ...] = ()


def volume_id(p: Params, name: str = "VolumeId") -> str:
    vid = p.require(name)
    if not _ID.fullmatch(vid):
        raise InvalidVolumeIDMalformed(f"Invalid id: \"{vid[:80]}\" (expecting \"vol-...\")")
    return vid


def parse_create_volume(p: Params) -> CreateVolumeRequest:
    zone = p.require("AvailabilityZone")
    if p.get("SnapshotId"):
        raise InvalidParameterValue("roost keeps no snapshots: give Size instead of "
                                    "SnapshotId.")
    size = p.integer("Size")
    if size is None:
        raise MissingParameter("The request must contain the parameter size or snapshotId")
    vtype = p.get("VolumeType") or "gp2"
    if vtype not in VOLUME_TYPES:
        raise InvalidParameterValue(
            f"Value ({vtype[:80]}) for parameter volumeType is invalid. "
            f"Valid values: {', '.join(VOLUME_TYPES)}.")
    if why := size_error(vtype, size):
        raise InvalidParameterValue(why)
    iops, throughput = p.integer("Iops"), p.integer("Throughput")
    if iops is not None and vtype not in ("io1", "io2", "gp3"):
        raise InvalidParameterValue(f"The parameter iops is not supported for {vtype} volumes.")
    if vtype in ("io1", "io2") and iops is None:
        raise MissingParameter("The request must contain the parameter iops")
    if throughput is not None and vtype != "gp3":
        raise InvalidParameterValue("The parameter throughput is supported only for gp3 "
                                    "volumes.")
    return CreateVolumeRequest(zone, size, vtype, iops, throughput,
                               p.flag("Encrypted"), resource_tags(p, "volume"))


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _bool(value: bool) -> list[str]:
    return ["true" if value else "false"]


def _attached(field: Callable[[Attachment], str]) -> Field[Volume]:
    return lambda v: [field(v.attachment)] if v.attachment is not None else []


VOLUME_FIELDS: dict[str, Field[Volume]] = {
    "volume-id": lambda v: [v.volume_id],
    "attachment.instance-id": _attached(lambda a: a.instance_id),
    "attachment.device": _attached(lambda a: a.device),
    "attachment.status": _attached(lambda a: "attached"),
    "attachment.attach-time": _attached(lambda a: a.attach_time),
    "attachment.delete-on-termination": lambda v: (
        _bool(v.attachment.delete_on_termination) if v.attachment is not None else []),
    "availability-zone": lambda v: [v.availability_zone],
    "create-time": lambda v: [v.create_time],
    "size": lambda v: [str(v.size)],
    "snapshot-id": lambda v: [v.snapshot_id] if v.snapshot_id else [],
    "status": lambda v: [v.state],
    "volume-type": lambda v: [v.volume_type],
    "encrypted": lambda v: _bool(v.encrypted),
    "multi-attach-enabled": lambda v: ["false"],
}


T = TypeVar("T")
RACE_RETRIES = 5
"""Times a change that lost its write to another is judged again on what won."""


async def _judged_again(change: Callable[[], Awaitable[T]]) -> T:
    """Run ``change`` (read, check, conditional write) again when its write lost a race,
    as a client retrying would, so that a DeleteVolume just after the instance ended
    does not answer 503 because this gateway was storing that volume meanwhile."""
    for attempt in range(RACE_RETRIES):
        try:
            return await change()
        except VolumeRaced:
            if attempt + 1 == RACE_RETRIES:
                raise
    raise AssertionError("unreachable")


class VolumeService:
    def __init__(self, store: VolumeStore, index: InstanceIndex,
                 zones: Callable[[], list[str]]) -> None:
        self.store = store
        self.index = index
        self._zones = zones

    def volume(self, vid: str) -> Volume:
        found = self.store.find(vid)
        if found is None:
            raise InvalidVolumeNotFound(f"The volume '{vid}' does not exist.")
        return found

    def describe(self, req: DescribeRequest) -> list[Volume]:
        every = self.store.all()
        missing = [i for i in req.ids if i not in every]
        if missing:
            raise InvalidVolumeNotFound(f"The volume '{', '.join(missing)}' does not exist.")
        chosen = ([every[i] for i in dict.fromkeys(req.ids)] if req.ids
                  else sorted(every.values(), key=lambda v: v.volume_id))
        return apply_filters(chosen, req.filters, VOLUME_FIELDS, tags=lambda v: v.tags)

    async def create(self, req: CreateVolumeRequest) -> Volume:
        if req.zone not in self._zones():
            raise InvalidZoneNotFound(f"The zone '{req.zone[:80]}' does not exist.")
        vol = Volume(f"vol-{secrets.token_hex(9)[:17]}", req.size, req.volume_type, req.zone,
                     _now(), req.iops or default_iops(req.volume_type, req.size),
                     req.throughput or default_throughput(req.volume_type), req.encrypted,
                     tags=dict(req.tags), owner_id=account())
        return await self.store.put(vol)

    async def attach(self, vid: str, instance_id: str, device: str) -> Volume:
        return await _judged_again(lambda: self._attach(vid, instance_id, device))

    async def _attach(self, vid: str, instance_id: str, device: str) -> Volume:
        vol = self.volume(vid)
        rec = self.index.find(instance_id)
        if rec is None:
            raise InvalidInstanceIDNotFound(f"The instance ID '{instance_id}' does not exist")
        if vol.attachment is not None:
            raise VolumeInUse(f"{vid} is already attached to an instance")
        if rec.state == "terminated":
            raise IncorrectInstanceState(
                f"The instance '{instance_id}' is not in a valid state for this operation.")
        if vol.availability_zone != rec.availability_zone:
            raise InvalidVolumeZoneMismatch(
                f"The volume '{vid}' is not in the same availability zone as instance "
                f"'{instance_id}'")
        if not valid_device(device):
            raise InvalidParameterValue(
                f"Value ({device[:80]}) for parameter device is invalid. {device[:80]} is "
                "not a valid EBS device name.")
        if any(v.attachment is not None and v.attachment.device == device
               for v in self.store.attached(rec)):
            raise InvalidParameterValue(f"Invalid value '{device}' for unixDevice. "
                                        f"Attachment point {device} is already in use")
        moved = msgspec.structs.replace(vol, attachment=Attachment(instance_id, device, _now()))
        return await self.store.put(moved, base=vol)

    async def detach(self, vid: str, instance_id: str = "", device: str = "") -> Volume:
        return await _judged_again(lambda: self._detach(vid, instance_id, device))

    async def _detach(self, vid: str, instance_id: str, device: str) -> Volume:
        vol = self.volume(vid)
        att = vol.attachment
        if att is None:
            raise IncorrectState(f"Volume '{vid}' is in the 'available' state.")
        if (instance_id and instance_id != att.instance_id) or (device and device != att.device):
            where = f" as device {device}" if device else ""
            raise InvalidAttachmentNotFound(
                f"The volume {vid} is not attached to instance "
                f"{instance_id or att.instance_id}{where}")
        rec = self.index.find(att.instance_id)
        if rec is not None and att.device == rec.net.root_device_name and rec.state != "stopped":
            raise OperationNotPermitted(
                f"Unable to detach root volume '{vid}' from instance '{att.instance_id}'")
        await self.store.put(msgspec.structs.replace(vol, attachment=None), base=vol)
        return vol

    async def set_delete_on_termination(self, rec: InstanceRecord,
                                        changes: Sequence[tuple[str, bool]]
                                        ) -> InstanceNetwork | None:
        """ModifyInstanceAttribute BlockDeviceMapping.N: each device's volume keeps or
        loses DeleteOnTermination. A volume attached after launch is changed in the
        store here; the root and launch volumes live in the instance's record, so the
        record's network attributes with the changes applied are returned for the node
        to store (None when none of them changed)."""
        attached = {v.attachment.device: v for v in self.store.attached(rec)
                    if v.attachment is not None}
        net = rec.network
        for device, delete in changes:
            vol = attached.get(device)
            if vol is None or vol.attachment is None or net is None:
                raise InvalidParameterValue(f"No volume is attached to {rec.instance_id} "
                                            f"as {device[:80]}.")
            if self.store.has_stored(vol.volume_id):
                att = msgspec.structs.replace(vol.attachment, delete_on_termination=delete)
                # What the store now holds is the base of a later change of this device.
                attached[device] = await self.store.put(
                    msgspec.structs.replace(vol, attachment=att), base=vol)
            elif device == net.root_device_name:
                net = msgspec.structs.replace(net, root_delete_on_termination=delete)
            else:
                net = msgspec.structs.replace(net, volumes=[
                    msgspec.structs.replace(v, delete_on_termination=delete)
                    if v.device == device else v for v in net.volumes])
        return net if net is not rec.network else None

    async def delete(self, vid: str) -> None:
        await _judged_again(lambda: self._delete(vid))

    async def _delete(self, vid: str) -> None:
        vol = self.volume(vid)
        if vol.attachment is not None:
            raise VolumeInUse(f"Volume {vid} is currently attached to "
                              f"{vol.attachment.instance_id}")
        await self.store.put(msgspec.structs.replace(vol, deleted=True), base=vol)
