"""RegisterImage, DescribeImages and DeregisterImage (EC2 2016-11-15 shapes).

RegisterImage takes files, not snapshots: ``ImageLocation`` is a raw or qcow2 disk image
that boots by itself, or ``KernelId`` (with an optional ``RamdiskId``) a Linux kernel
(bzImage) and its initramfs, each an absolute path on the nodes (EC2 takes ``aki-``/
``ari-`` ids there). The gateway checks the files on its own host, where roost keeps
gateways and nodes (one host, or the same paths on each); a node that lacks them when a
launch comes refuses it as ``image_unavailable`` and placement goes elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from roost.domain.errors import (
    DryRunOperation,
    InvalidParameterValue,
    MissingParameter,
)
from roost.domain.images import (
    Image,
    check_image_name,
    check_path,
    disk_format,
    is_kernel,
)
from roost.domain.volumes import DEFAULT_ROOT_DEVICE, VOLUME_TYPES, size_error, valid_device
from roost.gateway import requests as rq
from roost.gateway.call import Action, Call
from roost.gateway.describe import Field, apply_filters, page_of
from roost.gateway.images import ImageStore, now
from roost.gateway.model import Paged
from roost.gateway.netrequests import IMAGE_ROOT_GIB, resource_tags
from roost.gateway.query import Params
from roost.gateway.service import DRY_RUN
from roost.gateway.tenancy import account
from roost.gateway.xml import Fragment, items, node, response, text, timestamp

# -- RegisterImage: what a well-formed call is ----------------------------------------


def _head(path: str, what: str) -> bytes:
    """The file's first kilobyte; InvalidParameterValue when it is not a readable file
    on this host."""
    file = Path(path)
    try:
        if not file.is_file():
            raise InvalidParameterValue(
                f"Value ({path}) for parameter {what} is invalid: no such file on the "
                "gateway's host (image files must be at the same path on gateways and "
                "nodes).")
        with file.open("rb") as f:
            return f.read(1024)
    except OSError as exc:
        raise InvalidParameterValue(
            f"Value ({path}) for parameter {what} is invalid: {exc.strerror}.") from None


def parse_register_image(p: Params, owner_id: str) -> tuple[Image, bool]:
    """The image RegisterImage describes (no id yet), and whether it is a dry run."""
    name = check_image_name(p.require("Name"))
    arch = p.get("Architecture") or "x86_64"
    if arch != "x86_64":
        raise InvalidParameterValue(f"Value ({arch[:40]}) for parameter architecture is "
                                    "invalid. roost's nodes run x86_64 only.")
    root_device = p.get("RootDeviceName") or DEFAULT_ROOT_DEVICE
    if not valid_device(root_device):
        raise InvalidParameterValue(f"Value ({root_device[:80]}) for parameter "
                                    "rootDeviceName is invalid.")
    root = _root_volume(p, root_device)
    location, kernel, initrd = p.get("ImageLocation"), p.get("KernelId"), p.get("RamdiskId")
    if location and kernel:
        raise InvalidParameterValue("Give ImageLocation (a disk image) or KernelId (a "
                                    "kernel), not both.")
    if not location and not kernel:
        raise MissingParameter("The request must contain the parameter ImageLocation (a "
                               "raw or qcow2 disk image) or KernelId (a Linux kernel), as "
                               "paths on the nodes.")
    if initrd and not kernel:
        raise InvalidParameterValue("RamdiskId needs a KernelId.")
    image = Image("", name, p.get("Description") or "", "sh", registered=True,
                  owner_id=owner_id, created=now(), architecture=arch,
                  tags=resource_tags(p, "image"), root_device_name=root_device,
                  root_volume_size=root[0], root_volume_type=root[1],
                  root_delete_on_termination=root[2])
    if location:
        head = _head(check_path(location, "ImageLocation"), "ImageLocation")
        image = replace(image, disk=location, disk_format=disk_format(head))
    else:
        assert kernel is not None
        if not is_kernel(_head(check_path(kernel, "KernelId"), "KernelId")):
            raise InvalidParameterValue(f"Value ({kernel}) for parameter KernelId is "
                                        "invalid: not a Linux x86 kernel (bzImage).")
        if initrd:
            _head(check_path(initrd, "RamdiskId"), "RamdiskId")
        image = replace(image, kernel=kernel, initrd=initrd or "")
    return image, p.flag("DryRun")


def _root_volume(p: Params, root_device: str) -> tuple[int, str, bool]:
    """BlockDeviceMapping.N of RegisterImage: roost's images map their root device only
    (size, type, DeleteOnTermination of their instances' root volume); the disk is the
    image's file, so a snapshot is refused."""
    size, vtype, delete = IMAGE_ROOT_GIB, "gp2", True
    for m in p.members("BlockDeviceMapping"):
        if m.get("DeviceName") != root_device or m.has("Ebs.SnapshotId") or not m.has("Ebs"):
            raise InvalidParameterValue(
                "roost registers images from files, not snapshots: a BlockDeviceMapping "
                f"may only size the root device ({root_device[:80]}) with Ebs.VolumeSize, "
                "VolumeType and DeleteOnTermination.")
        size = m.integer("Ebs.VolumeSize") or size
        vtype = m.get("Ebs.VolumeType") or vtype
        if vtype not in VOLUME_TYPES:
            raise InvalidParameterValue(f"Value ({vtype[:80]}) for parameter volumeType is "
                                        f"invalid. Valid values: {', '.join(VOLUME_TYPES)}.")
        why = (f"at least {IMAGE_ROOT_GIB} GiB" if size < IMAGE_ROOT_GIB
               else size_error(vtype, size))
        if why:
            raise InvalidParameterValue(f"Value ({size}) for parameter volumeSize is "
                                        f"invalid: {why}")
        delete = m.flag("Ebs.DeleteOnTermination", default=True)
    return size, vtype, delete


# -- DescribeImages ---------------------------------------------------------------------


def _fields(store: ImageStore) -> dict[str, Field[Image]]:
    return {
        "image-id": lambda i: [i.image_id],
        "name": lambda i: [i.name],
        "description": lambda i: [i.description],
        "state": lambda i: ["available"],
        "architecture": lambda i: [i.architecture],
        "owner-id": lambda i: [store.owner(i)],
        "is-public": lambda i: [str(not i.registered).lower()],
        "image-type": lambda i: ["machine"],
        "root-device-type": lambda i: ["ebs"],
        "root-device-name": lambda i: [i.root_device_name],
        "virtualization-type": lambda i: ["hvm"],
        "hypervisor": lambda i: ["xen"],
        "platform-details": lambda i: ["Linux/UNIX"],
        "manifest-location": lambda i: [i.location],
    }


def describe(store: ImageStore, p: Params) -> Paged[Image]:
    """ImageId.N, Owner.N (account ids or ``self``), filters and a page (ExecutableBy.N is
    not read). A registered image is its owner's (private); the built-ins are public."""
    req = rq.parse_describe_listed(p, "ImageId", "DescribeImages")
    if req.dry_run:
        raise DryRunOperation(DRY_RUN)
    chosen = ([store.require(i) for i in dict.fromkeys(req.ids)] if req.ids
              else store.all())
    owners = {account(store.owner_id) if o == "self" else o for o in p.values("Owner")}
    if owners:
        chosen = [i for i in chosen if store.owner(i) in owners]
    found = apply_filters(chosen, req.filters, _fields(store), tags=lambda i: dict(i.tags))
    return page_of(found, req.page, key=lambda i: i.image_id, kind="ami")


def _tags(tags: Iterable[tuple[str, str]]) -> Fragment:
    return items("tagSet", (text("key", k) + text("value", v) for k, v in tags))


def _root_mapping(image: Image) -> Fragment:
    """The image's root device, as EC2 lists an EBS-backed image's: what a launch gets
    unless its own mapping for the device says otherwise."""
    return items("blockDeviceMapping", [
        text("deviceName", image.root_device_name)
        + node("ebs", text("snapshotId", "snap-" + image.image_id[4:])
               + text("volumeSize", image.root_volume_size)
               + text("deleteOnTermination", image.root_delete_on_termination)
               + text("volumeType", image.root_volume_type) + text("encrypted", False))])


def images_xml(found: Iterable[Image], store: ImageStore, request_id: str,
               next_token: str | None = None) -> str:
    return response("DescribeImages", request_id, items("imagesSet", (
        text("imageId", i.image_id) + text("imageLocation", i.location)
        + text("imageState", "available") + text("imageOwnerId", store.owner(i))
        + text("creationDate", timestamp(i.created) if i.created else None)
        + text("isPublic", not i.registered) + text("architecture", i.architecture)
        + text("imageType", "machine") + text("name", i.name)
        + text("description", i.description or None) + text("rootDeviceType", "ebs")
        + text("rootDeviceName", i.root_device_name) + _root_mapping(i)
        + text("virtualizationType", "hvm") + text("hypervisor", "xen")
        + text("platformDetails", "Linux/UNIX") + text("enaSupport", True)
        + (_tags(i.tags) if i.tags else Fragment(""))
        for i in found
    )), text("nextToken", next_token))


# -- the actions -------------------------------------------------------------------------


async def register_image(c: Call) -> str:
    image, dry_run = parse_register_image(c.params, account(c.service.images.owner_id))
    if dry_run:
        raise DryRunOperation(DRY_RUN)
    image = await c.service.images.register(image)
    return response("RegisterImage", c.request_id, text("imageId", image.image_id))


async def describe_images(c: Call) -> str:
    page = describe(c.service.images, c.params)
    return images_xml(page.items, c.service.images, c.request_id, page.next_token)


async def deregister_image(c: Call) -> str:
    image_id = c.params.require("ImageId")
    c.service.images.require(image_id)
    if c.params.flag("DryRun"):
        raise DryRunOperation(DRY_RUN)
    await c.service.images.deregister(image_id)
    return response("DeregisterImage", c.request_id, text("return", True))


IMAGE_ACTIONS: dict[str, Action] = {
    "RegisterImage": register_image,
    "DescribeImages": describe_images,
    "DeregisterImage": deregister_image,
}
