"""Images: the built-ins, and those RegisterImage adds, kept in `roost_images` and
mirrored by every gateway; RegisterImage, DescribeImages and DeregisterImage.

A registered image is one KV value (``ami-…`` -> `Image`). Its name is unique per owner
through a second key (``aminame.<base32 owner/name>`` -> id) written with ``create``,
so two gateways registering one name at once cannot both win. The built-in images
(`roost.domain.images.IMAGES`) are always there and cannot be deregistered.

The actions are `roost.gateway.imageactions`.
"""

from __future__ import annotations

import base64
import logging
import secrets
from dataclasses import replace
from datetime import UTC, datetime

import msgspec
import nats.errors
import nats.js.errors
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from roost.bus.connect import BucketMirror
from roost.domain.errors import (
    InvalidAMIIDNotFound,
    InvalidAMINameDuplicate,
    OperationNotPermitted,
    ServiceUnavailable,
)
from roost.domain.images import IMAGES, Image, check_image_id
from roost.gateway.tenancy import visible

log = logging.getLogger(__name__)


def _name_key(owner_id: str, name: str) -> str:
    return "aminame." + base64.b32encode(f"{owner_id}/{name}".encode()).decode()


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class ImageStore(BucketMirror):
    """Every image a gateway can launch: built-ins, then the mirror of `roost_images`."""

    def __init__(self, kv: KeyValue, *, owner_id: str) -> None:
        super().__init__(kv, "images")
        self.owner_id = owner_id
        self._registered: dict[str, Image] = {}

    # -- reading ---------------------------------------------------------------------

    def owner(self, image: Image) -> str:
        return image.owner_id or self.owner_id

    def all(self) -> list[Image]:
        """The built-ins (public) and the caller's registered images (private to their
        account, `roost.gateway.tenancy`)."""
        mine = [i for i in self._registered.values() if visible(self.owner(i))]
        return [*IMAGES.values(), *sorted(mine, key=lambda i: i.created)]

    def get(self, image_id: str) -> Image | None:
        if image_id in IMAGES:
            return IMAGES[image_id]
        found = self._registered.get(image_id)
        return found if found is None or visible(self.owner(found)) else None

    def registered(self, image_id: str) -> Image | None:
        """A registered image (which nodes learn from the launch), None for a built-in."""
        return self._registered.get(image_id)

    def require(self, image_id: str) -> Image:
        """The image; InvalidAMIID.Malformed or .NotFound (a deregistered one is gone)."""
        found = self.get(check_image_id(image_id))
        if found is None:
            raise InvalidAMIIDNotFound(f"The image id '[{image_id}]' does not exist")
        return found

    # -- writing ---------------------------------------------------------------------

    async def register(self, image: Image) -> Image:
        if any(i.name == image.name and self.owner(i) == self.owner(image)
               for i in self.all()):
            raise _duplicate(image.name)
        image_id = "ami-" + secrets.token_hex(9)[:17]
        image = replace(image, image_id=image_id)
        name_key = _name_key(self.owner(image), image.name)
        try:
            await self._kv.create(name_key, image_id.encode())
        except nats.js.errors.KeyWrongLastSequenceError:
            raise _duplicate(image.name) from None
        except (TimeoutError, nats.errors.Error) as exc:
            raise ServiceUnavailable(f"The image store is unreachable: {exc!r}") from None
        try:
            await self._kv.create(image_id, msgspec.json.encode(image))
        except (TimeoutError, nats.errors.Error) as exc:
            await self._forget(name_key)
            raise ServiceUnavailable(f"The image store is unreachable: {exc!r}") from None
        self._registered[image_id] = image
        return image

    async def deregister(self, image_id: str) -> None:
        image = self.require(image_id)
        if not image.registered:
            raise OperationNotPermitted(
                f"The image {image_id} ({image.name}) is built into roost and cannot be "
                "deregistered.")
        try:
            await self._kv.delete(image_id)
        except (TimeoutError, nats.errors.Error) as exc:
            raise ServiceUnavailable(f"The image store is unreachable: {exc!r}") from None
        self._registered.pop(image_id, None)
        await self._forget(_name_key(self.owner(image), image.name))

    async def _forget(self, key: str) -> None:
        try:
            await self._kv.delete(key)
        except (TimeoutError, nats.errors.Error) as exc:
            log.warning("could not release image name key %s: %r", key, exc)

    # -- watching --------------------------------------------------------------------

    def _on_entry(self, entry: KeyValue.Entry) -> None:
        key = entry.key
        if not key.startswith("ami-"):
            return
        if entry.operation in (KV_DEL, KV_PURGE):
            self._registered.pop(key, None)
            return
        try:
            self._registered[key] = msgspec.json.decode(entry.value or b"", type=Image)
        except (msgspec.DecodeError, msgspec.ValidationError):
            log.warning("undecodable image %s", key)


def _duplicate(name: str) -> InvalidAMINameDuplicate:
    return InvalidAMINameDuplicate(f"AMI name {name} is already in use by AMI "
                                   "owned by this account")
