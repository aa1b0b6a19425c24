"""Typed requests, parsed from Query parameters. The actions never see the raw form.

Each ``parse_*`` checks what EC2 checks before any state is touched: required
parameters, counts, id formats, tag limits, page sizes. So a request that reaches the
service is well formed, and every rejection here is a 400 with EC2's code.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from roost.bus.schemas import DEFAULT_OPTIONS, InstanceChanges, InstanceOptions
from roost.domain.errors import (
    InvalidID,
    InvalidInstanceIDMalformed,
    InvalidParameterCombination,
    InvalidParameterValue,
    MissingParameter,
)
from roost.gateway.netrequests import LaunchNetwork, check_id, parse_launch_network
from roost.gateway.query import Params
from roost.gateway.tagging import specified, tag_list

INSTANCE_ID = re.compile(r"i-(?:[0-9a-f]{8}|[0-9a-f]{17})")
MAX_USER_DATA = 16 * 1024
TAGGABLE_NETWORK = ("vpc", "subnet", "sg")
"""Besides instances, CreateTags and DeleteTags take these resources' ids."""
LAUNCH_TAGGED = ("instance", "volume")
"""What RunInstances' TagSpecification.N may tag: the instances and their volumes."""
LAUNCH_UNTAGGED = ("network-interface", "spot-instances-request")
"""EC2 tags these at launch too. roost keeps no tags on an instance's network interface
and has no Spot requests, so they are refused rather than dropped."""
DEFAULT_INSTANCE_TYPE = "m1.small"
"""What EC2 launches when RunInstances names no type; roost's catalog has it."""


@dataclass(frozen=True, slots=True)
class Filter:
    name: str
    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Page:
    """MaxResults/NextToken. ``max_results`` None means "everything in one page"."""

    max_results: int | None = None
    next_token: str | None = None


@dataclass(frozen=True, slots=True)
class RunInstancesRequest:
    image_id: str
    instance_type: str
    min_count: int
    max_count: int
    client_token: str = ""
    tags: tuple[tuple[str, str], ...] = ()
    user_data: str = ""
    availability_zone: str = ""
    dry_run: bool = False
    options: InstanceOptions = DEFAULT_OPTIONS
    network: LaunchNetwork = field(default_factory=LaunchNetwork)

    def fingerprint(self) -> tuple[object, ...]:
        """What must match for a repeated ClientToken to count as the same request."""
        return (self.image_id, self.instance_type, self.min_count, self.max_count,
                self.tags, self.user_data, self.availability_zone,
                tuple(sorted(msgspec.structs.asdict(self.options).items())),
                repr(self.network))


@dataclass(frozen=True, slots=True)
class InstanceIdsRequest:
    """Stop, Start and Terminate: a list of ids and nothing else of note."""

    instance_ids: tuple[str, ...]
    dry_run: bool = False
    force: bool = False


@dataclass(frozen=True, slots=True)
class DescribeRequest:
    """The shape shared by the Describe* actions: ids (or names), filters, a page."""

    ids: tuple[str, ...] = ()
    filters: tuple[Filter, ...] = ()
    page: Page = field(default_factory=Page)
    dry_run: bool = False
    include_all: bool = False  # DescribeInstanceStatus: IncludeAllInstances


@dataclass(frozen=True, slots=True)
class TagsRequest:
    """CreateTags and DeleteTags. ``value`` None (DeleteTags only) matches any value."""

    resource_ids: tuple[str, ...]
    tags: tuple[tuple[str, str | None], ...]
    dry_run: bool = False


@dataclass(frozen=True, slots=True)
class InstanceAttributeRequest:
    instance_id: str
    attribute: str


@dataclass(frozen=True, slots=True)
class ConsoleOutputRequest:
    instance_id: str
    latest: bool = False
    dry_run: bool = False


@dataclass(frozen=True, slots=True)
class ModifyInstanceRequest:
    """ModifyInstanceAttribute or ModifyInstanceMetadataOptions: ``options`` holds the
    option fields named in the call (the rest keep their value); ``fixed`` holds the
    attributes roost has no notion of, which may only be "set" to what they are."""

    instance_id: str
    options: dict[str, object] = field(default_factory=dict)
    instance_type: str | None = None
    user_data: str | None = None
    fixed: dict[str, str] = field(default_factory=dict)
    dry_run: bool = False
    group_ids: tuple[str, ...] = ()  # GroupId.N: the instance's new security groups
    delete_on_termination: tuple[tuple[str, bool], ...] = ()
    """BlockDeviceMapping.N: (device, its volume's new DeleteOnTermination)."""

    def changes(self, current: InstanceOptions) -> InstanceChanges:
        opts = msgspec.structs.replace(current, **self.options) if self.options else None
        return InstanceChanges(options=opts, instance_type=self.instance_type,
                               user_data=self.user_data)


def instance_ids(values: list[str]) -> tuple[str, ...]:
    for v in values:
        if not INSTANCE_ID.fullmatch(v):
            raise InvalidInstanceIDMalformed(f'Invalid id: "{v}" (expecting "i-...")')
    return tuple(dict.fromkeys(values))  # de-duplicated, first-seen order


def filters(p: Params) -> tuple[Filter, ...]:
    out = []
    for f in p.members("Filter"):
        out.append(Filter(f.require("Name"), tuple(f.values("Value"))))
    return tuple(out)


def _page(p: Params, *, low: int, high: int | None) -> Page:
    """MaxResults within [low, high] (``high`` None: no upper bound is refused, and a
    page holds at most `LARGEST_PAGE`), and NextToken."""
    n = p.integer("MaxResults")
    if n is not None and not low <= n <= (high or n):
        limits = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise InvalidParameterValue(
            f"Value ( {n} ) for parameter maxResults is invalid. Expecting a value {limits}."
        )
    if n is not None and high is None:
        n = min(n, LARGEST_PAGE)
    return Page(n, p.get("NextToken") or None)


LARGEST_PAGE = 1000

PAGE_SIZES: dict[str, tuple[int, int | None]] = {
    "DescribeVpcs": (5, 1000),
    "DescribeSubnets": (5, 1000),
    "DescribeSecurityGroups": (5, 1000),
    "DescribeNetworkInterfaces": (5, 1000),
    "DescribeRouteTables": (5, 100),
    "DescribeNetworkAcls": (5, 1000),
    "DescribeLaunchTemplates": (1, 200),
    "DescribeVolumes": (5, None),
    "DescribeImages": (1, None),
}
"""MaxResults' bounds for the Describe calls of records other than instances, as EC2's
API model gives them. It gives none for volumes and images: volumes take EC2's
documented least, 5; images roost's, 1; neither refuses a large one (None), which
pages `LARGEST_PAGE`."""

IDS_NOT_WITH_MAX_RESULTS = {
    "DescribeNetworkInterfaces": "networkInterfaceIdSet",
    "DescribeVolumes": "volumeSet",
    "DescribeImages": "imagesSet",
}
"""The Describe calls that, as EC2, refuse their ids with MaxResults (the set's name
as the error gives it)."""


def _user_data(raw: str) -> str:
    try:
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidParameterValue("Invalid BASE64 encoding of user data.") from None
    if len(data) > MAX_USER_DATA:
        raise InvalidParameterValue(f"User data is limited to {MAX_USER_DATA} bytes.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidParameterValue("User data must be UTF-8 text.") from None


def _count(p: Params, name: str) -> int:
    n = p.integer(name)
    if n is None:
        raise MissingParameter(f"The request must contain the parameter {name}")
    return n


_SHUTDOWN = ("stop", "terminate")


def _choice(p: Params, name: str, allowed: tuple[str, ...]) -> str | None:
    value = p.get(name)
    if value is None:
        return None
    if value not in allowed:
        raise InvalidParameterValue(
            f"Value ({value}) for parameter {name} is invalid. "
            f"Valid values: {', '.join(allowed)}.")
    return value


def _metadata_options(p: Params, prefix: str) -> dict[str, object]:
    """MetadataOptions.* at launch, or the parameters of ModifyInstanceMetadataOptions
    (``prefix`` ""), as InstanceOptions fields."""
    out: dict[str, object] = {}
    tokens = _choice(p, f"{prefix}HttpTokens", ("optional", "required"))
    endpoint = _choice(p, f"{prefix}HttpEndpoint", ("enabled", "disabled"))
    tags = _choice(p, f"{prefix}InstanceMetadataTags", ("enabled", "disabled"))
    ipv6 = _choice(p, f"{prefix}HttpProtocolIpv6", ("enabled", "disabled"))
    hops = p.integer(f"{prefix}HttpPutResponseHopLimit")
    if hops is not None and not 1 <= hops <= 64:
        raise InvalidParameterValue(
            f"Value ({hops}) for parameter HttpPutResponseHopLimit is invalid. "
            "Expecting a value between 1 and 64.")
    for key, value in (("http_tokens", tokens), ("http_endpoint", endpoint),
                       ("instance_metadata_tags", tags), ("http_protocol_ipv6", ipv6),
                       ("http_put_response_hop_limit", hops)):
        if value is not None:
            out[key] = value
    return out


def _launch_options(p: Params) -> InstanceOptions:
    fields = _metadata_options(p, "MetadataOptions.")
    fields["disable_api_termination"] = p.flag("DisableApiTermination")
    fields["disable_api_stop"] = p.flag("DisableApiStop")
    fields["shutdown_behavior"] = _choice(p, "InstanceInitiatedShutdownBehavior",
                                          _SHUTDOWN) or "stop"
    return msgspec.structs.replace(DEFAULT_OPTIONS, **fields)


def parse_run_instances(p: Params, stamps: Mapping[str, str] | None = None
                        ) -> RunInstancesRequest:
    """``stamps``: tags EC2 sets itself (``aws:`` keys, which callers may not)."""
    image_id = p.require("ImageId")
    itype = p.get("InstanceType") or DEFAULT_INSTANCE_TYPE
    min_count, max_count = _count(p, "MinCount"), _count(p, "MaxCount")
    if min_count < 1 or max_count < 1:
        raise InvalidParameterValue("MinCount and MaxCount must be at least 1.")
    if min_count > max_count:
        raise InvalidParameterValue("MinCount must be less than or equal to MaxCount.")
    tags = specified(p, LAUNCH_TAGGED, elsewhere=LAUNCH_UNTAGGED)
    token = p.get("ClientToken") or ""
    if len(token) > 64:
        raise InvalidParameterValue("ClientToken must be at most 64 characters long.")
    return RunInstancesRequest(
        image_id, itype, min_count, max_count,
        client_token=token,
        tags=tuple({**dict(tags["instance"]), **(stamps or {})}.items()),
        user_data=_user_data(p.get("UserData") or ""),
        availability_zone=p.get("Placement.AvailabilityZone") or "",
        dry_run=p.flag("DryRun"),
        options=_launch_options(p),
        network=parse_launch_network(p, max_count=max_count, volume_tags=tags["volume"]),
    )


def parse_instance_ids(p: Params) -> InstanceIdsRequest:
    ids = p.values("InstanceId")
    if not ids:
        p.require("InstanceId.1")
    return InstanceIdsRequest(instance_ids(ids), dry_run=p.flag("DryRun"), force=p.flag("Force"))


def parse_terminate_instances(p: Params) -> InstanceIdsRequest:
    """EC2 answers a TerminateInstances that names no instance as a bad combination,
    not as a missing parameter (Stop/Start do the latter)."""
    if not p.values("InstanceId") and not p.get("InstanceId.1"):
        raise InvalidParameterCombination("No instances specified")
    return parse_instance_ids(p)


def _ids_or_page(p: Params) -> tuple[tuple[str, ...], Page]:
    """Instance ids or a page size, never both (EC2's rule for the Describe calls
    that take either)."""
    ids = instance_ids(p.values("InstanceId"))
    page = _page(p, low=5, high=1000)
    _ids_or_max_results(ids, page, "instancesSet")
    return ids, page


def _ids_or_max_results(ids: Sequence[str], page: Page, set_name: str) -> None:
    if ids and page.max_results is not None:
        raise InvalidParameterCombination(
            f"The parameter {set_name} cannot be used with the parameter maxResults")


def parse_describe_instances(p: Params) -> DescribeRequest:
    ids, page = _ids_or_page(p)
    return DescribeRequest(ids, filters(p), page, dry_run=p.flag("DryRun"))


def parse_describe_instance_status(p: Params) -> DescribeRequest:
    ids, page = _ids_or_page(p)
    return DescribeRequest(ids, filters(p), page, dry_run=p.flag("DryRun"),
                           include_all=p.flag("IncludeAllInstances"))


def parse_describe_credit_specifications(p: Params) -> DescribeRequest:
    return DescribeRequest(instance_ids(p.values("InstanceId")), filters(p),
                           _page(p, low=5, high=1000), dry_run=p.flag("DryRun"))


def parse_describe_instance_types(p: Params) -> DescribeRequest:
    return DescribeRequest(
        tuple(p.values("InstanceType")), filters(p), _page(p, low=5, high=100),
        dry_run=p.flag("DryRun"),
    )


def parse_describe_offerings(p: Params) -> DescribeRequest:
    return DescribeRequest((), filters(p), _page(p, low=5, high=1000), dry_run=p.flag("DryRun"))


def parse_describe_named(p: Params, list_name: str) -> DescribeRequest:
    """Zones and regions: names or ids, filters, no paging."""
    return DescribeRequest(tuple(p.values(list_name)), filters(p), dry_run=p.flag("DryRun"))


def parse_describe_listed(p: Params, list_name: str, action: str) -> DescribeRequest:
    """Ids (``<list_name>.N``), filters and a page (`PAGE_SIZES`): the Describe calls of
    VPCs, subnets, groups, interfaces, route tables, ACLs, volumes, images, templates."""
    low, high = PAGE_SIZES[action]
    ids, page = tuple(p.values(list_name)), _page(p, low=low, high=high)
    if action in IDS_NOT_WITH_MAX_RESULTS:
        _ids_or_max_results(ids, page, IDS_NOT_WITH_MAX_RESULTS[action])
    return DescribeRequest(ids, filters(p), page, dry_run=p.flag("DryRun"))


def parse_describe_tags(p: Params) -> DescribeRequest:
    return DescribeRequest((), filters(p), _page(p, low=5, high=1000), dry_run=p.flag("DryRun"))


def parse_tags(p: Params, *, deleting: bool) -> TagsRequest:
    ids = p.values("ResourceId")
    if not ids:
        p.require("ResourceId.1")
    checked: list[str] = []
    for rid in ids:
        kind = rid.split("-", 1)[0]
        if kind == "i":
            checked.extend(instance_ids([rid]))
        elif kind in TAGGABLE_NETWORK:
            checked.append(check_id(kind, rid))
        else:
            raise InvalidID(f"The ID '{rid}' is not valid")
    tags = tag_list(p.members("Tag"), deleting=deleting)
    if not tags and not deleting:
        p.require("Tag.1.Key")
    return TagsRequest(tuple(dict.fromkeys(checked)), tags, dry_run=p.flag("DryRun"))


def parse_instance_attribute(p: Params) -> InstanceAttributeRequest:
    (iid,) = instance_ids([p.require("InstanceId")])
    return InstanceAttributeRequest(iid, p.require("Attribute"))


# ModifyInstanceAttribute's attributes roost enforces: (wire name, option field, kind).
_MODIFIABLE: dict[str, tuple[str, Literal["bool", "shutdown"]]] = {
    "disableApiTermination": ("disable_api_termination", "bool"),
    "disableApiStop": ("disable_api_stop", "bool"),
    "instanceInitiatedShutdownBehavior": ("shutdown_behavior", "shutdown"),
}
_FIXED_NAMES = ("SourceDestCheck", "EbsOptimized", "EnaSupport", "Kernel", "Ramdisk")


def _lower_first(name: str) -> str:
    return name[0].lower() + name[1:]


def parse_modify_instance_attribute(p: Params) -> ModifyInstanceRequest:
    """Either form EC2 takes: ``Attribute`` + ``Value``, or ``<Attribute>.Value``
    (``DisableApiTermination.Value=false``)."""
    (iid,) = instance_ids([p.require("InstanceId")])
    raw: dict[str, str] = {}
    name = p.get("Attribute")
    if name:
        raw[name] = p.require("Value")
    for key in ("DisableApiTermination", "DisableApiStop", "InstanceInitiatedShutdownBehavior",
                "InstanceType", "UserData", *_FIXED_NAMES):
        value = p.get(f"{key}.Value")
        if value is not None:
            raw[_lower_first(key)] = value
    group_ids = tuple(check_id("sg", g) for g in p.values("GroupId"))
    if name == "groupSet":
        raise InvalidParameterValue("Give the groups as GroupId.N.")
    mappings = tuple(_delete_on_termination(m) for m in p.members("BlockDeviceMapping"))
    if not raw and not group_ids and not mappings:
        raise MissingParameter("The request must contain an attribute to modify.")
    options: dict[str, object] = {}
    fixed: dict[str, str] = {}
    instance_type = user_data = None
    for attr, value in raw.items():
        if attr in _MODIFIABLE:
            field_name, kind = _MODIFIABLE[attr]
            options[field_name] = (_boolean(attr, value) if kind == "bool"
                                   else _one_of(attr, value, _SHUTDOWN))
        elif attr == "instanceType":
            instance_type = value
        elif attr == "userData":
            user_data = _user_data(value)
        else:
            fixed[attr] = value
    return ModifyInstanceRequest(iid, options, instance_type, user_data, fixed,
                                 dry_run=p.flag("DryRun"), group_ids=group_ids,
                                 delete_on_termination=mappings)


def _delete_on_termination(m: Params) -> tuple[str, bool]:
    """One BlockDeviceMapping.N of ModifyInstanceAttribute: the device, and whether its
    volume goes with the instance (the one thing EC2 changes there)."""
    device = m.get("DeviceName")
    if not device:
        raise MissingParameter("The request must contain the parameter "
                               "BlockDeviceMapping.DeviceName")
    if not m.has("Ebs.DeleteOnTermination"):
        raise MissingParameter("The request must contain the parameter "
                               "BlockDeviceMapping.Ebs.DeleteOnTermination")
    return device, m.flag("Ebs.DeleteOnTermination")


def _boolean(attr: str, value: str) -> bool:
    low = value.lower()
    if low not in ("true", "false"):
        raise InvalidParameterValue(f"Value ({value}) for parameter {attr} is invalid. "
                                    "Expected a boolean.")
    return low == "true"


def _one_of(attr: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise InvalidParameterValue(f"Value ({value}) for parameter {attr} is invalid. "
                                    f"Valid values: {', '.join(allowed)}.")
    return value


def parse_modify_metadata_options(p: Params) -> ModifyInstanceRequest:
    (iid,) = instance_ids([p.require("InstanceId")])
    return ModifyInstanceRequest(iid, options=_metadata_options(p, ""),
                                 dry_run=p.flag("DryRun"))


def parse_console_output(p: Params) -> ConsoleOutputRequest:
    (iid,) = instance_ids([p.require("InstanceId")])
    return ConsoleOutputRequest(iid, latest=p.flag("Latest"), dry_run=p.flag("DryRun"))
