"""The Describe* side of the model: reads of the instance mirror, the type registry and
the capacity view. None of them waits on a node."""

from __future__ import annotations

import re
from collections.abc import Iterable

from roost.bus.schemas import InstanceRecord
from roost.domain.catalog import InstanceType
from roost.domain.errors import (
    DryRunOperation,
    InvalidInstanceType,
    InvalidParameterValue,
)
from roost.gateway.describe import (
    INSTANCE_FIELDS,
    STATUS_FIELDS,
    TAG_FIELDS,
    TYPE_FIELDS,
    Field,
    apply_filters,
    paginate,
)
from roost.gateway.model import (
    FIXED_ATTRIBUTES,
    RECORDED_ATTRIBUTES,
    InstanceAttribute,
    InstanceStatusRow,
    Paged,
    Reservation,
    TagRow,
    Zone,
)
from roost.gateway.netreads import NetworkReads
from roost.gateway.render import block_devices, cpu_credits
from roost.gateway.requests import DescribeRequest, InstanceAttributeRequest
from roost.gateway.service import DRY_RUN, Ec2Service

ZONE_FIELDS: dict[str, Field[Zone]] = {
    "zone-name": lambda z: [z.name],
    "zone-id": lambda z: [z.zone_id],
    "region-name": lambda z: [z.region],
    "state": lambda z: ["available"],
    "zone-type": lambda z: ["availability-zone"],
}
REGION_FIELDS: dict[str, Field[tuple[str, str]]] = {
    "region-name": lambda r: [r[0]],
    "endpoint": lambda r: [r[1]],
    "opt-in-status": lambda r: ["opt-in-not-required"],
}


def launch_order(group: tuple[str, list[InstanceRecord]]) -> str:
    """Where a reservation (its id and instances) stands in DescribeInstances: in launch
    order (its earliest instance's launch time, then its id). EC2 documents no order;
    this one is stable from page to page and the one a reader expects. A page's
    ``MaxResults`` counts reservations, the items of the answer's list (botocore's
    paginator names ``Reservations`` its result key), and a reservation is never split
    across pages."""
    rid, recs = group
    return f"{min(i.launch_time for i in recs)} {rid}"


def _check_dry_run(req: DescribeRequest) -> None:
    if req.dry_run:
        raise DryRunOperation(DRY_RUN)


class Ec2Reads:
    def __init__(self, service: Ec2Service, *, endpoint: str = "") -> None:
        self.service = service
        self.endpoint = endpoint
        self.net = NetworkReads(service.net.store, service.index)

    def _instances(self, req: DescribeRequest, records: Iterable[InstanceRecord],
                   fields: dict[str, Field[InstanceRecord]]) -> list[InstanceRecord]:
        return apply_filters(records, req.filters, fields, tags=lambda r: r.tags)

    async def describe_instances(self, req: DescribeRequest) -> Paged[Reservation]:
        index = self.service.index
        records = await index.require(req.ids) if req.ids else index.all()
        _check_dry_run(req)
        names = self.service.net.group_names()
        fields: dict[str, Field[InstanceRecord]] = {
            **INSTANCE_FIELDS,
            "instance.group-name": lambda r: [names.get(g, "") for g in
                                              r.net.security_group_ids],
            "group-name": lambda r: [names.get(g, "") for g in r.net.security_group_ids],
        }
        grouped: dict[str, list[InstanceRecord]] = {}
        for rec in self._instances(req, records, fields):
            grouped.setdefault(rec.reservation_id, []).append(rec)
        owner = self.service.site.owner_id
        # Paged before the reservations are built: only a page's worth are.
        page = paginate(grouped.items(), req.page, key=launch_order, kind="r")
        return Paged(tuple(Reservation(rid, recs[0].owner_id or owner,
                                       tuple(sorted(recs, key=lambda r: r.ami_launch_index)))
                           for rid, recs in page.items), page.next_token)

    async def describe_instance_status(self, req: DescribeRequest
                                       ) -> Paged[InstanceStatusRow]:
        index = self.service.index
        records = await index.require(req.ids) if req.ids else index.all()
        _check_dry_run(req)
        if not req.include_all:
            records = [r for r in records if r.state == "running"]
        rows = [InstanceStatusRow(r, self.service.health(r)) for r in records]
        return paginate(apply_filters(rows, req.filters, STATUS_FIELDS), req.page,
                        key=lambda s: s.record.instance_id, kind="i")

    async def describe_instance_types(self, req: DescribeRequest) -> Paged[InstanceType]:
        """Every supported type, whatever is free now: a full type is still a type."""
        _check_dry_run(req)
        registry = self.service.types
        await registry.refresh()
        types = registry.all()
        missing = [n for n in req.ids if n not in types]
        if missing:
            raise InvalidInstanceType(
                f"The following supplied instance types do not exist: [{', '.join(missing)}]"
            )
        chosen = [types[n] for n in dict.fromkeys(req.ids)] if req.ids else types.values()
        return paginate(apply_filters(chosen, req.filters, TYPE_FIELDS), req.page,
                        key=lambda t: t.name, kind="type")

    async def describe_type_offerings(self, req: DescribeRequest, location_type: str
                                      ) -> Paged[tuple[str, str]]:
        """(type, location) for every type: once for the region, or once per zone."""
        registry = self.service.types
        await registry.refresh()
        if location_type == "region":
            locations = [self.service.site.region]
        elif location_type == "availability-zone":
            locations = self.service.zones()
        elif location_type == "availability-zone-id":
            locations = [z.zone_id for z in self.all_zones()]
        else:
            raise InvalidParameterValue(
                f"Value ({location_type[:80]}) for parameter locationType is invalid. Valid "
                "values: region, availability-zone, availability-zone-id.")
        rows = [(t, where) for t in registry.all() for where in locations]
        fields: dict[str, Field[tuple[str, str]]] = {
            "instance-type": lambda r: [r[0]], "location": lambda r: [r[1]]}
        return paginate(apply_filters(rows, req.filters, fields), req.page,
                        key=lambda r: f"{r[1]}\0{r[0]}", kind="offering")

    def describe_account_attributes(self, names: tuple[str, ...]
                                    ) -> list[tuple[str, list[str]]]:
        site = self.service.site
        store = self.service.net.store
        known = {
            "supported-platforms": ["VPC"],
            "default-vpc": [store.default_vpc.vpc_id if store.has_default_vpc else "none"],
            "max-instances": [str(site.max_instances_per_request)],
            "vpc-max-security-groups-per-interface": ["5"],
            "max-elastic-ips": ["0"],
            "vpc-max-elastic-ips": ["0"],
        }
        for name in names:
            if name not in known:
                raise InvalidParameterValue(
                    f"Value ({name[:80]}) for parameter attributeName is invalid.")
        return [(n, v) for n, v in known.items() if not names or n in names]

    def all_zones(self) -> list[Zone]:
        region = self.service.site.region
        compact = re.sub(r"[^a-z0-9]", "", region.lower())
        return [Zone(name, region, f"{compact}-az{i + 1}")
                for i, name in enumerate(self.service.zones())]

    def describe_zones(self, req: DescribeRequest, zone_ids: tuple[str, ...] = ()
                       ) -> list[Zone]:
        """The zones named (``ZoneName.N``) or whose ids are given (``ZoneId.N``), or
        all without either; then the filters."""
        _check_dry_run(req)
        zones = self.all_zones()
        for given, what, known in ((req.ids, "zone", {z.name for z in zones}),
                                   (zone_ids, "zone ID", {z.zone_id for z in zones})):
            for ref in given:
                if ref not in known:
                    raise InvalidParameterValue(f"The {what} '{ref[:80]}' does not exist.")
        chosen = [z for z in zones if not (req.ids or zone_ids)
                  or z.name in req.ids or z.zone_id in zone_ids]
        return apply_filters(chosen, req.filters, ZONE_FIELDS)

    def describe_regions(self, req: DescribeRequest) -> list[tuple[str, str]]:
        _check_dry_run(req)
        region = self.service.site.region
        for name in req.ids:
            if name != region:
                raise InvalidParameterValue(f"Invalid region: {name}")
        return apply_filters([(region, self.endpoint)], req.filters, REGION_FIELDS)

    def describe_tags(self, req: DescribeRequest) -> Paged[TagRow]:
        _check_dry_run(req)
        rows = [TagRow(r.instance_id, k, v) for r in self.service.index.all()
                for k, v in r.tags.items()]
        store = self.service.net.store
        for kind, found in (("vpc", store.vpcs()), ("subnet", store.subnets()),
                            ("security-group", store.groups())):
            rows += [TagRow(store.record_id(x), k, v, kind) for x in found
                     for k, v in x.tags.items()]
        return paginate(apply_filters(rows, req.filters, TAG_FIELDS), req.page,
                        key=lambda t: f"{t.resource_id}\0{t.key}", kind="tag")

    async def describe_credit_specifications(self, req: DescribeRequest
                                             ) -> list[InstanceRecord]:
        index = self.service.index
        records = await index.require(req.ids) if req.ids else index.all()
        _check_dry_run(req)
        # Named instances are answered whatever their type (a non-burstable one runs
        # "standard", as EC2 answers it); unnamed, only those running "unlimited".
        chosen = records if req.ids else [r for r in records if cpu_credits(r) == "unlimited"]
        return self._instances(req, chosen, INSTANCE_FIELDS)

    async def describe_instance_attribute(self, req: InstanceAttributeRequest
                                          ) -> InstanceAttribute:
        (rec,) = await self.service.index.require([req.instance_id])
        if req.attribute == "instanceType":
            return InstanceAttribute(rec.instance_id, "instanceType", rec.instance_type)
        if req.attribute == "groupSet":
            return InstanceAttribute(rec.instance_id, "groupSet", "",
                                     groups=tuple(rec.net.security_group_ids))
        if req.attribute == "userData":
            user_data = await self.service.index.user_data(rec.instance_id)
            return InstanceAttribute(rec.instance_id, "userData", user_data)
        if req.attribute == "blockDeviceMapping":
            attached = self.service.volumes.store.attached(rec)
            return InstanceAttribute(rec.instance_id, req.attribute, "",
                                     xml=block_devices(attached))
        if req.attribute in RECORDED_ATTRIBUTES:
            value = getattr(rec.net, RECORDED_ATTRIBUTES[req.attribute])
            return InstanceAttribute(rec.instance_id, req.attribute, str(value).lower())
        enforced = _enforced_attributes(rec)
        if req.attribute in enforced:
            return InstanceAttribute(rec.instance_id, req.attribute, enforced[req.attribute])
        if req.attribute not in FIXED_ATTRIBUTES:
            raise InvalidParameterValue(
                f"Value ({req.attribute}) for parameter attribute is invalid. "
                "Unknown attribute.")
        value = FIXED_ATTRIBUTES[req.attribute]
        return InstanceAttribute(rec.instance_id, req.attribute, value)


def _enforced_attributes(rec: InstanceRecord) -> dict[str, str]:
    """The attributes the node enforces, as DescribeInstanceAttribute shows them."""
    opts = rec.opts
    return {
        "disableApiTermination": str(opts.disable_api_termination).lower(),
        "disableApiStop": str(opts.disable_api_stop).lower(),
        "instanceInitiatedShutdownBehavior": opts.shutdown_behavior,
        "rootDeviceName": rec.net.root_device_name,
    }
