"""What an instance sees under the metadata service's paths, as EC2 lays them out.

Pure: `InstanceMetadata` in, a tree of `Leaf`/`Dir` out, and `find` walks it. The HTTP
side (`roost.node.imds`) never builds a body itself, so every path's content and
content type can be read here in one place and tested without a socket.

EC2's rules followed here (EC2 User Guide, "Access instance metadata"):
- everything is ``text/plain`` except user data (``application/octet-stream``); that
  includes the identity document, which is JSON served as text/plain;
- a directory lists its entries one per line, subdirectories with a trailing ``/``,
  no final newline; ``public-keys/`` lists ``0=name`` lines instead;
- ``/`` and ``/latest/`` list bare names (``latest``; ``dynamic``, ``meta-data``,
  ``user-data``) without slashes;
- a missing item is 404, so unknown values (no private IPv4, no user data, tags not
  allowed) leave their path out rather than answering an empty string;
- a leaf asked for with a trailing slash still answers its value: botocore reads the
  region from ``placement/availability-zone/`` with the slash.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

IDENTITY_DOCUMENT_VERSION = "2017-09-30"
_ARCHITECTURES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64",
                  "arm64": "arm64", "i386": "i386", "i686": "i386"}


@dataclass(frozen=True, slots=True)
class InstanceMetadata:
    """One instance's facts as the node knows them now; the node builds a fresh one per
    lookup, so changes (tags, metadata options) show on the next request."""

    instance_id: str
    instance_type: str
    image_id: str
    availability_zone: str
    region: str
    reservation_id: str
    ami_launch_index: int
    launch_time: str
    """ISO 8601 UTC."""
    account_id: str
    local_hostname: str
    local_ipv4: str = ""
    """'' = unknown: the path is absent and the identity document says null."""
    public_ipv4: str = ""
    """'' = none: ``public-ipv4`` and ``public-hostname`` are absent, as on EC2."""
    public_hostname: str = ""
    tags: Mapping[str, str] = field(default_factory=dict)
    user_data: bytes | None = None
    http_tokens: str = "optional"
    """'optional' (IMDSv1 allowed) | 'required' (a token on every GET)."""
    http_endpoint: str = "enabled"
    """'enabled' | 'disabled' (every request answered 403)."""
    instance_metadata_tags: str = "disabled"
    """'enabled' | 'disabled': whether tags/instance/ exists."""
    public_keys: Mapping[str, str] = field(default_factory=dict)
    """Key name -> OpenSSH public key; index order is insertion order."""
    security_groups: Sequence[str] = ()
    architecture: str = ""
    """'' = this host's, from platform.machine() mapped to EC2's names."""


@dataclass(frozen=True, slots=True)
class Leaf:
    body: bytes
    content_type: str = "text/plain"


@dataclass(frozen=True, slots=True)
class Dir:
    entries: Mapping[str, Leaf | Dir]
    listing: str | None = None
    """How the directory lists itself when that is not EC2's default (names, one per
    line, subdirectories with a trailing slash)."""

    def render(self) -> Leaf:
        if self.listing is not None:
            return _text(self.listing)
        return _text("\n".join(name + "/" if isinstance(node, Dir) else name
                               for name, node in self.entries.items()))


def find(tree: Dir, path: str) -> Leaf | None:
    """The response for a URL path (``/latest/meta-data/instance-id``), or None for 404.

    A directory answers its listing with or without the trailing slash; a leaf answers
    its value with or without it. Empty segments (``a//b``) are not paths EC2 knows.
    """
    parts = path.strip("/").split("/") if path.strip("/") else []
    node: Leaf | Dir = tree
    for part in parts:
        if not isinstance(node, Dir) or not part or part not in node.entries:
            return None
        node = node.entries[part]
    return node.render() if isinstance(node, Dir) else node


def instance_tree(md: InstanceMetadata) -> Dir:
    """Everything the instance can read, rooted at ``/``."""
    latest: dict[str, Leaf | Dir] = {
        "dynamic": Dir({"instance-identity": Dir({"document": identity_document(md)})}),
        "meta-data": _meta_data(md),
    }
    if md.user_data is not None:
        latest["user-data"] = Leaf(md.user_data, "application/octet-stream")
    return Dir({"latest": Dir(latest, listing="\n".join(latest))}, listing="latest")


def _meta_data(md: InstanceMetadata) -> Dir:
    items: dict[str, Leaf | Dir] = {
        "ami-id": _text(md.image_id),
        "ami-launch-index": _text(str(md.ami_launch_index)),
        "hostname": _text(md.local_hostname),
        "instance-id": _text(md.instance_id),
        "instance-type": _text(md.instance_type),
        "local-hostname": _text(md.local_hostname),
    }
    if md.local_ipv4:
        items["local-ipv4"] = _text(md.local_ipv4)
    if md.public_ipv4:
        items["public-hostname"] = _text(md.public_hostname)
        items["public-ipv4"] = _text(md.public_ipv4)
    items["placement"] = Dir({"availability-zone": _text(md.availability_zone),
                              "region": _text(md.region)})
    if md.public_keys:
        items["public-keys"] = _public_keys(md.public_keys)
    items["reservation-id"] = _text(md.reservation_id)
    if md.security_groups:
        items["security-groups"] = _text("\n".join(md.security_groups))
    if md.instance_metadata_tags == "enabled":
        # EC2 refuses tag keys with '/' while tags are exposed here; such a key could
        # not be addressed as one path segment, so it is left out rather than mangled.
        keys = {k: _text(v) for k, v in md.tags.items() if k and "/" not in k}
        items["tags"] = Dir({"instance": Dir(keys)})
    return Dir(items)


def _public_keys(keys: Mapping[str, str]) -> Dir:
    entries: dict[str, Leaf | Dir] = {
        str(i): Dir({"openssh-key": _text(key)}) for i, key in enumerate(keys.values())
    }
    listing = "\n".join(f"{i}={name}" for i, name in enumerate(keys))
    return Dir(entries, listing=listing)


def identity_document(md: InstanceMetadata) -> Leaf:
    """``/latest/dynamic/instance-identity/document``: EC2's fields in EC2's order,
    the ones roost has no notion of (billing, kernel, ramdisk) as null."""
    doc = {
        "accountId": md.account_id,
        "architecture": md.architecture or host_architecture(),
        "availabilityZone": md.availability_zone,
        "billingProducts": None,
        "devpayProductCodes": None,
        "marketplaceProductCodes": None,
        "imageId": md.image_id,
        "instanceId": md.instance_id,
        "instanceType": md.instance_type,
        "kernelId": None,
        "pendingTime": ec2_time(md.launch_time),
        "privateIp": md.local_ipv4 or None,
        "ramdiskId": None,
        "region": md.region,
        "version": IDENTITY_DOCUMENT_VERSION,
    }
    return _text(json.dumps(doc, indent=2))


def host_architecture(machine: str | None = None) -> str:
    """EC2's name (i386 | x86_64 | arm64) for this host's CPU; others pass through."""
    name = (machine if machine is not None else platform.machine()).lower()
    return _ARCHITECTURES.get(name, name)


def ec2_time(iso: str) -> str:
    """``2016-11-19T16:32:11Z``, the form EC2 writes pendingTime in; a value that does
    not parse is passed through rather than hidden."""
    try:
        parsed = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return iso
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _text(value: str) -> Leaf:
    return Leaf(value.encode())
