"""Launch templates: kept in `roost_launch_templates`, mirrored by every gateway, and
expanded into RunInstances parameters.

A template is one KV value (``lt-…`` -> `LaunchTemplate`, every version inside), changed
with compare-and-set, so two gateways adding versions at once both land with distinct
numbers. Names are unique through a second key (``ltname.<base32>`` -> id) written with
``create``. A version's data is kept as the Query pairs of `RequestLaunchTemplateData`
(the same form the request carried), and `roost.gateway.shapes` turns it into
RunInstances parameters or XML.
"""

from __future__ import annotations

import base64
import logging
import re
import secrets
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

import msgspec
import nats.errors
import nats.js.errors
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from roost.bus.connect import BucketMirror
from roost.domain.errors import (
    MissingParameter,
    ServiceUnavailable,
    TemplateIdMalformed,
    TemplateIdNotFound,
    TemplateNameExists,
    TemplateNameMalformed,
    TemplateNameNotFound,
    TemplateVersionNotFound,
)
from roost.gateway import shapes
from roost.gateway.query import Params
from roost.gateway.tenancy import account, visible

log = logging.getLogger(__name__)
_NAME = re.compile(r"[a-zA-Z0-9().\-/_]{3,128}")
_ID = re.compile(r"lt-[0-9a-f]{17}")
_RETRIES = 20


class TemplateVersion(msgspec.Struct, frozen=True):
    number: int
    data: dict[str, str]  # RequestLaunchTemplateData as Query pairs
    description: str = ""
    created: str = ""


class LaunchTemplate(msgspec.Struct, frozen=True):
    template_id: str
    name: str
    created: str
    created_by: str
    default_version: int
    latest_version: int
    versions: list[TemplateVersion]
    tags: dict[str, str] = {}

    def version(self, which: str) -> TemplateVersion:
        """``$Latest``, ``$Default`` or a number; VersionNotFound otherwise."""
        number = {"$Latest": self.latest_version, "$Default": self.default_version,
                  "": self.default_version}.get(which)
        if number is None:
            number = int(which) if which.isdigit() and len(which) < 10 else -1
        for v in self.versions:
            if v.number == number:
                return v
        raise TemplateVersionNotFound(
            f"Could not find launch template version {which[:40]} of {self.template_id}.")


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _name_key(owner_id: str, name: str) -> str:
    """Template names are unique per account, as on EC2."""
    return f"ltname.{owner_id}." + base64.b32encode(name.encode()).decode()


def owner_of(template: LaunchTemplate) -> str:
    """The account in ``created_by`` (``arn:aws:iam::<account>:root``)."""
    parts = template.created_by.split(":")
    return parts[4] if len(parts) > 4 else ""


def template_data(p: Params) -> dict[str, str]:
    """``LaunchTemplateData.*`` in canonical Query pairs (members EC2 does not know are
    dropped, as EC2 ignores them)."""
    req = shapes.shape("RequestLaunchTemplateData")
    value = shapes.read(p.under("LaunchTemplateData"), req) or {}
    return shapes.flatten(value, req)


def overlay(base: Mapping[str, str], top: Mapping[str, str]) -> dict[str, str]:
    """``top`` over ``base`` member by member: a member ``top`` names (a list or a
    structure as a whole) replaces ``base``'s."""
    named = {k.split(".", 1)[0] for k in top}
    out = {k: v for k, v in base.items() if k.split(".", 1)[0] not in named}
    out.update(top)
    return out


def run_parameters(version: TemplateVersion) -> dict[str, str]:
    """A version's data as RunInstances parameters."""
    req = shapes.shape("RequestLaunchTemplateData")
    value = shapes.read(Params(version.data), req) or {}
    return shapes.flatten(value, shapes.run_instances_shape())


class TemplateStore(BucketMirror):
    def __init__(self, kv: KeyValue, *, owner_id: str) -> None:
        super().__init__(kv, "templates")
        self.owner_id = owner_id
        self._templates: dict[str, tuple[int, LaunchTemplate]] = {}

    # -- reading ---------------------------------------------------------------------

    def all(self) -> list[LaunchTemplate]:
        """The caller's templates (`roost.gateway.tenancy`)."""
        return sorted((t for _, t in self._templates.values() if visible(owner_of(t))),
                      key=lambda t: t.created)

    def find(self, template_id: str = "", name: str = "") -> LaunchTemplate:
        if not template_id and not name:
            raise MissingParameter("The request must contain the parameter "
                                   "LaunchTemplateId or LaunchTemplateName")
        if template_id:
            if not _ID.fullmatch(template_id):
                raise TemplateIdMalformed(
                    f"The launch template ID '{template_id[:80]}' is malformed.")
            found = self._templates.get(template_id)
            if found is None or not visible(owner_of(found[1])):
                raise TemplateIdNotFound(
                    f"The specified launch template, with template ID {template_id}, "
                    "does not exist.")
            return found[1]
        for t in self.all():
            if t.name == name:
                return t
        raise TemplateNameNotFound(
            f"The specified launch template, with template name {name[:128]}, does not exist.")

    # -- writing ---------------------------------------------------------------------

    async def create(self, name: str, data: dict[str, str], *, description: str,
                     tags: dict[str, str]) -> LaunchTemplate:
        if not _NAME.fullmatch(name):
            raise TemplateNameMalformed(
                "A launch template name must be 3 to 128 characters of letters, digits "
                "and ( ) . - / _")
        tid = "lt-" + secrets.token_hex(9)[:17]
        owner = account(self.owner_id)
        try:
            await self._kv.create(_name_key(owner, name), tid.encode())
        except nats.js.errors.KeyWrongLastSequenceError:
            raise TemplateNameExists(
                f"Launch template name already in use: {name}") from None
        except (TimeoutError, nats.errors.Error) as exc:
            raise ServiceUnavailable(f"The template store is unreachable: {exc!r}") from None
        at = now()
        template = LaunchTemplate(tid, name, at, f"arn:aws:iam::{owner}:root", 1, 1,
                                  [TemplateVersion(1, data, description, at)], tags)
        try:
            rev = await self._kv.create(tid, msgspec.json.encode(template))
        except (TimeoutError, nats.errors.Error) as exc:
            await self._forget_name(owner, name)
            raise ServiceUnavailable(f"The template store is unreachable: {exc!r}") from None
        self._templates[tid] = (rev, template)
        return template

    async def change(self, template_id: str,
                     edit: Callable[[LaunchTemplate], LaunchTemplate]) -> LaunchTemplate:
        for _ in range(_RETRIES):
            found = self._templates.get(template_id)
            if found is None:
                raise TemplateIdNotFound(f"The launch template {template_id} does not exist.")
            rev, current = found
            updated = edit(current)
            try:
                rev = await self._kv.update(template_id, msgspec.json.encode(updated), last=rev)
            except nats.js.errors.KeyWrongLastSequenceError:
                await self._reload(template_id)
                continue
            except (TimeoutError, nats.errors.Error) as exc:
                raise ServiceUnavailable(
                    f"The template store is unreachable: {exc!r}") from None
            self._templates[template_id] = (rev, updated)
            return updated
        raise ServiceUnavailable(f"{template_id} is changing too fast; retry.")

    async def delete(self, template: LaunchTemplate) -> None:
        try:
            await self._kv.delete(template.template_id)
        except (TimeoutError, nats.errors.Error) as exc:
            raise ServiceUnavailable(f"The template store is unreachable: {exc!r}") from None
        self._templates.pop(template.template_id, None)
        await self._forget_name(owner_of(template), template.name)

    async def _forget_name(self, owner: str, name: str) -> None:
        try:
            await self._kv.delete(_name_key(owner, name))
        except (TimeoutError, nats.errors.Error) as exc:
            log.warning("could not release launch template name %s: %r", name, exc)

    async def _reload(self, template_id: str) -> None:
        try:
            entry = await self._kv.get(template_id)
        except nats.js.errors.KeyNotFoundError:
            self._templates.pop(template_id, None)
            return
        self._templates[template_id] = (entry.revision or 0, msgspec.json.decode(
            entry.value or b"", type=LaunchTemplate))

    # -- watching --------------------------------------------------------------------

    def _on_entry(self, entry: KeyValue.Entry) -> None:
        key = entry.key
        if not key.startswith("lt-"):
            return
        if entry.operation in (KV_DEL, KV_PURGE):
            self._templates.pop(key, None)
            return
        try:
            template = msgspec.json.decode(entry.value or b"", type=LaunchTemplate)
        except (msgspec.DecodeError, msgspec.ValidationError):
            log.warning("undecodable launch template %s", key)
            return
        cur = self._templates.get(key)
        if cur is None or (entry.revision or 0) >= cur[0]:
            self._templates[key] = (entry.revision or 0, template)
