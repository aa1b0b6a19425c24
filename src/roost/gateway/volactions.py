"""The volume actions, three lines each as in `actions` (parse, act, render), and how
EC2's XML shows a volume, its attachment, and an instance's block device mappings."""

from __future__ import annotations

from collections.abc import Mapping

from roost.bus.schemas import InstanceRecord
from roost.domain.volumes import Volume
from roost.gateway import requests as rq
from roost.gateway.call import Action, Call
from roost.gateway.describe import page_of
from roost.gateway.render import Devices, block_devices, root_volume_id
from roost.gateway.volservice import VolumeService, parse_create_volume, volume_id
from roost.gateway.xml import Fragment, items, response, text, timestamp


def _tags(tags: Mapping[str, str]) -> Fragment:
    if not tags:
        return Fragment("")
    return items("tagSet", (text("key", k) + text("value", v) for k, v in tags.items()))


def _attachment(v: Volume, status: str = "attached") -> Fragment:
    a = v.attachment
    if a is None:
        return Fragment("")
    return Fragment(text("volumeId", v.volume_id) + text("instanceId", a.instance_id)
                    + text("device", a.device) + text("status", status)
                    + text("attachTime", timestamp(a.attach_time))
                    + text("deleteOnTermination", a.delete_on_termination))


def volume(v: Volume) -> Fragment:
    return Fragment("".join([
        text("volumeId", v.volume_id), text("size", v.size),
        text("snapshotId", v.snapshot_id),
        text("availabilityZone", v.availability_zone), text("status", v.state),
        text("createTime", timestamp(v.create_time)),
        items("attachmentSet", [_attachment(v)] if v.attachment is not None else []),
        text("volumeType", v.volume_type), text("iops", v.iops),
        text("throughput", v.throughput), text("encrypted", v.encrypted),
        text("multiAttachEnabled", False), _tags(v.tags),
    ]))


def devices_of(service: VolumeService) -> Devices:
    """What DescribeInstances renders as an instance's ``blockDeviceMapping`` when it is
    more than the root volume its record names; None for the rest (most instances),
    which render their own without a lookup."""
    busy = service.store.attached_elsewhere()

    def devices(rec: InstanceRecord) -> str | None:
        if rec.state == "terminated" or rec.network is None:
            return None
        if (rec.instance_id not in busy and not rec.network.volumes
                and not service.store.has_stored(root_volume_id(rec.instance_id))):
            return None
        return block_devices(service.store.attached(rec))
    return devices


async def create_volume(c: Call) -> str:
    vol = await c.service.volumes.create(parse_create_volume(c.params))
    return response("CreateVolume", c.request_id, volume(vol))


async def attach_volume(c: Call) -> str:
    vol = await c.service.volumes.attach(volume_id(c.params), c.params.require("InstanceId"),
                                         c.params.require("Device"))
    return response("AttachVolume", c.request_id, _attachment(vol, "attaching"))


async def detach_volume(c: Call) -> str:
    vol = await c.service.volumes.detach(volume_id(c.params), c.params.get("InstanceId") or "",
                                         c.params.get("Device") or "")
    return response("DetachVolume", c.request_id, _attachment(vol, "detaching"))


async def delete_volume(c: Call) -> str:
    await c.service.volumes.delete(volume_id(c.params))
    return response("DeleteVolume", c.request_id, text("return", True))


async def describe_volumes(c: Call) -> str:
    req = rq.parse_describe_listed(c.params, "VolumeId", "DescribeVolumes")
    page = page_of(c.service.volumes.describe(req), req.page, key=lambda v: v.volume_id,
                   kind="vol")
    return response("DescribeVolumes", c.request_id, items("volumeSet", map(volume, page.items)),
                    text("nextToken", page.next_token))


VOLUME_ACTIONS: dict[str, Action] = {
    "CreateVolume": create_volume,
    "AttachVolume": attach_volume,
    "DetachVolume": detach_volume,
    "DeleteVolume": delete_volume,
    "DescribeVolumes": describe_volumes,
}
