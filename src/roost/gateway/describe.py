"""Filters and pages for the Describe* actions: pure functions over plain records.

EC2 filter values may use ``*`` (any run of characters) and ``?`` (one character), with
``\\`` escaping either. A record matches when, for every filter, one of its values
matches one of the filter's values. An unknown filter name is a 400, not an empty
answer, so a typo is never mistaken for "nothing there".
"""

from __future__ import annotations

import base64
import binascii
import heapq
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from typing import TypeVar

from roost.bus.schemas import InstanceRecord
from roost.domain.catalog import InstanceType
from roost.domain.errors import InvalidPaginationToken, InvalidParameterValue
from roost.domain.lifecycle import InstanceState
from roost.domain.network import private_dns_name, public_dns_name
from roost.gateway.model import InstanceStatusRow, Paged, TagRow
from roost.gateway.requests import Filter, Page
from roost.gateway.xml import timestamp

T = TypeVar("T")
Field = Callable[[T], Iterable[str]]
"""The values of one filterable field of a record (several for tags)."""


@lru_cache(maxsize=512)
def _pattern(value: str) -> re.Pattern[str]:
    out, i = [], 0
    while i < len(value):
        c = value[i]
        if c == "\\" and i + 1 < len(value):
            out.append(re.escape(value[i + 1]))
            i += 2
            continue
        out.append(".*" if c == "*" else "." if c == "?" else re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def wildcard_match(pattern: str, value: str) -> bool:
    return _pattern(pattern).fullmatch(value) is not None


def _matcher(patterns: Sequence[str]) -> Callable[[str], bool]:
    """Whether a value matches any of ``patterns``: a set lookup for the patterns with no
    wildcard or escape in them (the usual filter, such as an instance type), a regular
    expression only for the rest. A filtered DescribeInstances tests every instance;
    at 100,000 a regular expression each was most of its time."""
    exact = frozenset(p for p in patterns if not any(c in p for c in "*?\\"))
    wild = [p for p in patterns if p not in exact]
    if not wild:
        return exact.__contains__
    return lambda v: v in exact or any(wildcard_match(p, v) for p in wild)


def _tag_filter(name: str) -> Callable[[Mapping[str, str]], Iterable[str]] | None:
    if name.startswith("tag:"):
        key = name[4:]
        return lambda tags: [tags[key]] if key in tags else []
    if name == "tag-key":
        return lambda tags: list(tags)
    if name == "tag-value":
        return lambda tags: list(tags.values())
    return None


def apply_filters(
    records: Iterable[T],
    filters: Sequence[Filter],
    fields: Mapping[str, Field[T]],
    *,
    tags: Callable[[T], Mapping[str, str]] | None = None,
) -> list[T]:
    checks: list[tuple[Field[T], Callable[[str], bool]]] = []
    for f in filters:
        tag_field = _tag_filter(f.name) if tags is not None else None
        if f.name in fields:
            checks.append((fields[f.name], _matcher(f.values)))
        elif tag_field is not None and tags is not None:
            checks.append((_compose(tag_field, tags), _matcher(f.values)))
        else:
            raise InvalidParameterValue(f"The filter '{f.name}' is invalid")
    if not checks:
        return list(records)
    return [r for r in records
            if all(any(map(match, field(r))) for field, match in checks)]


def _compose(
    tag_field: Callable[[Mapping[str, str]], Iterable[str]],
    tags: Callable[[T], Mapping[str, str]],
) -> Field[T]:
    return lambda r: tag_field(tags(r))


def encode_token(last_key: str) -> str:
    return base64.urlsafe_b64encode(f"v1:{last_key}".encode()).decode()


def decode_token(token: str) -> str:
    try:
        raw = base64.urlsafe_b64decode(token.encode("ascii")).decode("utf-8")
    except (binascii.Error, UnicodeError, ValueError):
        raise InvalidPaginationToken(f"Invalid pagination token: {token}") from None
    if not raw.startswith("v1:"):
        raise InvalidPaginationToken(f"Invalid pagination token: {token}")
    return raw[3:]


def paginate(items: Iterable[T], page: Page, key: Callable[[T], str], kind: str
             ) -> Paged[T]:
    """Items in ``key`` order, from after the token's key, at most ``max_results``.

    The token names the last key served rather than an offset, so a record that
    appears or goes between two pages neither repeats nor hides another. It names
    ``kind`` too: a token from another Describe call is refused rather than read as a
    place in this one's list.
    """
    keyed: Iterable[tuple[str, T]] = ((key(i), i) for i in items)
    if page.next_token is not None:
        got_kind, sep, after = decode_token(page.next_token).partition(":")
        if got_kind != kind or not sep:
            raise InvalidPaginationToken(f"Invalid pagination token: {page.next_token}")
        keyed = (ki for ki in keyed if ki[0] > after)
    if page.max_results is None:
        return Paged(tuple(i for _, i in sorted(keyed, key=_first)))
    # One more than a page, without sorting the rest: at 100,000 instances a sort of
    # everything for each page of 1,000 was most of a DescribeInstances.
    chunk = heapq.nsmallest(page.max_results + 1, keyed, key=_first)
    if len(chunk) <= page.max_results:
        return Paged(tuple(i for _, i in chunk))
    chunk = chunk[: page.max_results]
    return Paged(tuple(i for _, i in chunk), encode_token(f"{kind}:{chunk[-1][0]}"))


def page_of(found: Sequence[T], page: Page, key: Callable[[T], str], kind: str
            ) -> Paged[T]:
    """`paginate` when the request asked for a page (MaxResults or NextToken); else
    everything in the order found, as before paging was asked for."""
    if page.max_results is None and page.next_token is None:
        return Paged(tuple(found))
    return paginate(found, page, key, kind)


def _first(pair: tuple[str, object]) -> str:
    return pair[0]


def _state_code(state: str) -> list[str]:
    try:
        return [str(InstanceState(state).code)]
    except ValueError:
        return []


INSTANCE_FIELDS: dict[str, Field[InstanceRecord]] = {
    "instance-id": lambda r: [r.instance_id],
    "instance-state-name": lambda r: [r.state],
    "instance-state-code": lambda r: _state_code(r.state),
    "instance-type": lambda r: [r.instance_type],
    "availability-zone": lambda r: [r.availability_zone],
    "image-id": lambda r: [r.image_id],
    "reservation-id": lambda r: [r.reservation_id],
    "client-token": lambda r: [r.client_token],
    "private-ip-address": lambda r: [r.private_ip],
    "owner-id": lambda r: [r.owner_id],
    "vpc-id": lambda r: [r.net.vpc_id] if r.network else [],
    "subnet-id": lambda r: [r.net.subnet_id] if r.network else [],
    "key-name": lambda r: [r.net.key_name] if r.net.key_name else [],
    "instance.group-id": lambda r: r.net.security_group_ids,
    "group-id": lambda r: r.net.security_group_ids,
    "private-dns-name": lambda r: [private_dns_name(r.private_ip)] if r.private_ip else [],
    "ip-address": lambda r: _public(r, r.shown_public_ip),
    "dns-name": lambda r: _public(r, public_dns_name(r.shown_public_ip)),
    "network-interface.association.public-ip": lambda r: _public(r, r.shown_public_ip),
    "network-interface.addresses.association.public-ip": lambda r: _public(
        r, r.shown_public_ip),
    "network-interface.association.ip-owner-id": lambda r: _public(r, "amazon"),
    "ipv6-address": lambda r: r.net.ipv6_addresses if r.state != "terminated" else [],
    "network-interface.ipv6-addresses.ipv6-address": lambda r: (
        r.net.ipv6_addresses if r.state != "terminated" else []),
    "launch-time": lambda r: [timestamp(r.launch_time)],
    "architecture": lambda r: ["x86_64"],
    "source-dest-check": lambda r: [str(r.net.source_dest_check).lower()],
    "ebs-optimized": lambda r: [str(r.net.ebs_optimized).lower()],
    "hibernation-options.configured": lambda r: [str(r.net.hibernation).lower()],
    "platform-details": lambda r: ["Linux/UNIX"],
    "platform": lambda r: [],  # Linux instances have none (EC2: "windows" or absent)
    "root-device-type": lambda r: ["ebs"],
    "root-device-name": lambda r: [r.net.root_device_name],
    "virtualization-type": lambda r: ["hvm"],
    "hypervisor": lambda r: ["xen"],
    "state-reason-code": lambda r: [r.state_reason] if r.state_reason else [],
    "tenancy": lambda r: [r.net.tenancy],
    "placement.tenancy": lambda r: [r.net.tenancy],
    "monitoring-state": lambda r: ["enabled" if r.net.monitoring else "disabled"],
    "ami-launch-index": lambda r: [str(r.ami_launch_index)],
    "network-interface.network-interface-id": lambda r: _nic(r, "eni-" + r.instance_id[2:]),
    "network-interface.subnet-id": lambda r: _nic(r, r.net.subnet_id),
    "network-interface.vpc-id": lambda r: _nic(r, r.net.vpc_id),
    "network-interface.private-dns-name": lambda r: _nic(r, private_dns_name(r.private_ip)),
    "network-interface.addresses.private-ip-address": lambda r: _nic(r, r.private_ip),
    "network-interface.addresses.primary": lambda r: _nic(r, "true"),
    "network-interface.status": lambda r: _nic(r, "in-use"),
    "network-interface.attachment.device-index": lambda r: _nic(r, "0"),
    "network-interface.attachment.status": lambda r: _nic(r, "attached"),
    "network-interface.group-id": lambda r: r.net.security_group_ids if r.network else [],
    "network-interface.owner-id": lambda r: _nic(r, r.owner_id),
    "block-device-mapping.device-name": lambda r: _root(r, r.net.root_device_name),
    "block-device-mapping.volume-id": lambda r: _root(r, "vol-" + r.instance_id[2:]),
    "block-device-mapping.status": lambda r: _root(r, "attached"),
    "block-device-mapping.attach-time": lambda r: _root(r, timestamp(r.launch_time)),
    "block-device-mapping.delete-on-termination": lambda r: _root(
        r, str(r.net.root_delete_on_termination).lower()),
}


def _nic(rec: InstanceRecord, value: str) -> list[str]:
    """A field of the primary network interface, which live instances with an address
    have."""
    return [value] if rec.network and rec.private_ip and rec.state != "terminated" else []


def _public(rec: InstanceRecord, value: str) -> list[str]:
    return [value] if rec.shown_public_ip else []


def _root(rec: InstanceRecord, value: str) -> list[str]:
    return [value] if rec.network else []

STATUS_FIELDS: dict[str, Field[InstanceStatusRow]] = {
    "instance-state-name": lambda s: [s.record.state],
    "instance-state-code": lambda s: _state_code(s.record.state),
    "availability-zone": lambda s: [s.record.availability_zone],
    "instance-status.status": lambda s: [s.status],
    "system-status.status": lambda s: [s.status],
    "instance-status.reachability": lambda s: [s.reachability],
    "system-status.reachability": lambda s: [s.reachability],
}

TYPE_FIELDS: dict[str, Field[InstanceType]] = {
    "instance-type": lambda t: [t.name],
    "vcpu-info.default-vcpus": lambda t: [str(t.vcpus)],
    "vcpu-info.default-cores": lambda t: [str(t.vcpus)],
    "memory-info.size-in-mib": lambda t: [str(t.mem_mib)],
    "current-generation": lambda t: ["true"],
    "burstable-performance-supported": lambda t: [str(t.family.startswith("t")).lower()],
    "processor-info.supported-architecture": lambda t: ["x86_64"],
    "gpu-info.count": lambda t: [str(t.gpu_count)] if t.gpu_count else [],
}

TAG_FIELDS: dict[str, Field[TagRow]] = {
    "resource-id": lambda t: [t.resource_id],
    "resource-type": lambda t: [t.resource_type],
    "key": lambda t: [t.key],
    "value": lambda t: [t.value],
}
