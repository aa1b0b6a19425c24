"""What the gateway's actions return: plain data, rendered to XML by `render`.

Instances travel as `InstanceRecord`, the same record the nodes write to the instances
bucket, so a reply, a describe and the admin API all show one shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

import msgspec

from roost.bus.schemas import InstanceNetwork, InstanceRecord
from roost.domain.errors import InvalidParameterValue

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Reservation:
    reservation_id: str
    owner_id: str
    instances: tuple[InstanceRecord, ...]


@dataclass(frozen=True, slots=True)
class StateChange:
    instance_id: str
    current: str
    previous: str


@dataclass(frozen=True, slots=True)
class Zone:
    name: str
    region: str
    zone_id: str


@dataclass(frozen=True, slots=True)
class TagRow:
    resource_id: str
    key: str
    value: str
    resource_type: str = "instance"


@dataclass(frozen=True, slots=True)
class Paged(Generic[T]):
    items: tuple[T, ...]
    next_token: str | None = None


@dataclass(frozen=True, slots=True)
class InstanceAttribute:
    instance_id: str
    name: str  # the attribute's XML element name, e.g. "disableApiTermination"
    value: str
    groups: tuple[str, ...] = ()  # "groupSet" only
    xml: str = ""  # the whole element, already rendered ("blockDeviceMapping")


# What DescribeInstanceAttribute answers for attributes roost has no notion of: the
# values a plain EC2 instance reports, which is what Terraform compares against.
# (Protection and shutdown behaviour are enforced and read from the record.)
FIXED_ATTRIBUTES = {
    "sourceDestCheck": "true",
    "ebsOptimized": "false",  # (both: recorded per instance, see RECORDED_ATTRIBUTES)
    "enaSupport": "true",
    "kernel": "",
    "ramdisk": "",
    "userData": "",
    "productCodes": "",
    "sriovNetSupport": "",
}


@dataclass(frozen=True, slots=True)
class InstanceStatusRow:
    """One DescribeInstanceStatus entry: the record, and the status of its checks:
    ``ok`` (running, its node heard from), ``impaired`` (its node is lost: EC2's
    answer for a failed host) or ``not-applicable`` (not running)."""

    record: InstanceRecord
    status: str

    @property
    def reachability(self) -> str:
        """The one check's result: ``passed``, ``failed`` or ``not-applicable``."""
        return {"ok": "passed", "impaired": "failed"}.get(self.status, self.status)


RECORDED_ATTRIBUTES = {"sourceDestCheck": "source_dest_check", "ebsOptimized": "ebs_optimized"}
"""ModifyInstanceAttribute names roost records in the instance's network attributes
(and enforces not: no packet is routed, no volume is attached)."""


def recorded_attributes(rec: InstanceRecord, fixed: dict[str, str]) -> InstanceNetwork | None:
    """The instance's network attributes with the recorded ones of ``fixed`` applied;
    None when ``fixed`` names none of them or the instance has no network record."""
    named = {RECORDED_ATTRIBUTES[k]: v for k, v in fixed.items() if k in RECORDED_ATTRIBUTES}
    if not named or rec.network is None:
        return None
    values: dict[str, bool] = {}
    for field, value in named.items():
        if value.lower() not in ("true", "false"):
            raise InvalidParameterValue(f"Value ({value[:80]}) for parameter {field} is "
                                        "invalid. Expected a boolean.")
        values[field] = value.lower() == "true"
    return msgspec.structs.replace(rec.network, **values)
