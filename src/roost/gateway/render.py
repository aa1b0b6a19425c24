"""Each action's result as EC2's XML. Shapes follow the EC2 2016-11-15 service model.

Members that roost has no notion of (VPCs, volumes, security groups) are rendered with
the fixed values a plain EC2 instance would show, because Terraform's provider reads
them on every refresh and treats a missing one as drift.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from roost.bus.schemas import InstanceRecord
from roost.domain.catalog import InstanceType
from roost.domain.lifecycle import InstanceState
from roost.domain.network import private_dns_name, public_dns_name
from roost.domain.volumes import Volume
from roost.gateway.model import (
    InstanceAttribute,
    InstanceStatusRow,
    Paged,
    Reservation,
    StateChange,
    TagRow,
    Zone,
)
from roost.gateway.xml import (
    Fragment,
    escape_text,
    items,
    node,
    response,
    text,
    timestamp,
    values,
)


def state(tag: str, name: str) -> Fragment:
    try:
        code: int | None = InstanceState(name).code
    except ValueError:
        code = None
    return node(tag, text("code", code), text("name", name))


def _tags(tags: Mapping[str, str]) -> Fragment:
    """A resource's tagSet; EC2 leaves the element out when there are none."""
    if not tags:
        return Fragment("")
    return items("tagSet", (text("key", k) + text("value", v) for k, v in tags.items()))


def _group_set(ids: Iterable[str], names: Mapping[str, str]) -> Fragment:
    return items("groupSet", (text("groupId", g) + text("groupName", names.get(g, ""))
                              for g in ids))


def root_volume_id(instance_id: str) -> str:
    """An instance's root volume: one per instance, named after it."""
    return "vol-" + instance_id[2:]


def interface_id(instance_id: str) -> str:
    return "eni-" + instance_id[2:]


Devices = Callable[[InstanceRecord], "str | None"]
"""An instance's rendered ``blockDeviceMapping`` when it has volumes beyond the root one
its record names (`roost.gateway.volactions.devices_of`), else None."""


def block_devices(volumes: Iterable[Volume]) -> str:
    """An instance's ``blockDeviceMapping``, as DescribeInstances nests it."""
    out = []
    for v in volumes:
        a = v.attachment
        if a is None:
            continue
        out.append(f"<item><deviceName>{escape_text(a.device)}</deviceName><ebs>"
                   f"<volumeId>{escape_text(v.volume_id)}</volumeId><status>attached</status>"
                   f"<attachTime>{timestamp(a.attach_time)}</attachTime>"
                   f"<deleteOnTermination>{'true' if a.delete_on_termination else 'false'}"
                   "</deleteOnTermination></ebs></item>")
    return f"<blockDeviceMapping>{''.join(out)}</blockDeviceMapping>"


def _block_devices(rec: InstanceRecord, launched: str, devices: Devices | None) -> str:
    if devices is not None and (found := devices(rec)) is not None:
        return found
    if rec.network is None:
        return "<blockDeviceMapping/>"
    status = "detached" if rec.state == "terminated" else "attached"
    delete = "true" if rec.net.root_delete_on_termination else "false"
    device = escape_text(rec.net.root_device_name)
    return (f"<blockDeviceMapping><item><deviceName>{device}</deviceName><ebs>"
            f"<volumeId>{escape_text(root_volume_id(rec.instance_id))}</volumeId>"
            f"<status>{status}</status><attachTime>{launched}</attachTime>"
            f"<deleteOnTermination>{delete}</deleteOnTermination></ebs></item>"
            "</blockDeviceMapping>")


def _interfaces(rec: InstanceRecord, names: Mapping[str, str]) -> str:
    if not has_interface(rec):
        return "<networkInterfaceSet/>"
    return f"<networkInterfaceSet><item>{interface(rec, names)}</item></networkInterfaceSet>"


def has_interface(rec: InstanceRecord) -> bool:
    """Live instances with an address have their primary interface; terminated ones
    have none left."""
    return rec.network is not None and bool(rec.private_ip) and rec.state != "terminated"


def interface(rec: InstanceRecord, names: Mapping[str, str], *,
              standalone: bool = False) -> Fragment:
    """An instance's primary interface: as DescribeInstances nests it, or (with
    ``standalone``) as DescribeNetworkInterfaces lists it. Written as one template:
    DescribeInstances renders one per instance, 10,000 at a time."""
    net = rec.net
    ip = escape_text(rec.private_ip)
    dns = escape_text(private_dns_name(rec.private_ip))
    short = escape_text(rec.instance_id[2:])
    owner = escape_text(rec.owner_id)
    extra_attach = (f"<instanceId>{escape_text(rec.instance_id)}</instanceId>"
                    f"<instanceOwnerId>{owner}</instanceOwnerId>") if standalone else ""
    zone = (f"<availabilityZone>{escape_text(rec.availability_zone)}</availabilityZone>"
            if standalone else "")
    managed = "<requesterManaged>false</requesterManaged>" if standalone else ""
    public = rec.shown_public_ip
    association = (f"<association><publicIp>{escape_text(public)}</publicIp>"
                   f"<publicDnsName>{escape_text(public_dns_name(public))}</publicDnsName>"
                   "<ipOwnerId>amazon</ipOwnerId></association>") if public else ""
    return Fragment(
        f"<networkInterfaceId>eni-{short}</networkInterfaceId>"
        f"<subnetId>{escape_text(net.subnet_id)}</subnetId><vpcId>{escape_text(net.vpc_id)}</vpcId>"
        f"{zone}<description></description><ownerId>{owner}</ownerId>{managed}"
        f"<status>in-use</status><macAddress>{_mac(rec.instance_id)}</macAddress>"
        f"<privateIpAddress>{ip}</privateIpAddress><privateDnsName>{dns}</privateDnsName>"
        f"<sourceDestCheck>{'true' if net.source_dest_check else 'false'}</sourceDestCheck>"
        f"{_group_set(net.security_group_ids, names)}"
        f"<attachment><attachmentId>eni-attach-{short}</attachmentId>"
        f"<deviceIndex>0</deviceIndex><status>attached</status>"
        f"<attachTime>{timestamp(rec.launch_time)}</attachTime>"
        f"<deleteOnTermination>true</deleteOnTermination>"
        f"<networkCardIndex>0</networkCardIndex>{extra_attach}</attachment>"
        f"{association}"
        f"<privateIpAddressesSet><item><privateIpAddress>{ip}</privateIpAddress>"
        f"<privateDnsName>{dns}</privateDnsName><primary>true</primary>{association}</item>"
        f"</privateIpAddressesSet>{_ipv6_set(net.ipv6_addresses)}"
        "<interfaceType>interface</interfaceType>"
    )


def _ipv6_set(addresses: list[str]) -> str:
    if not addresses:
        return "<ipv6AddressesSet/>"
    return "<ipv6AddressesSet>" + "".join(
        f"<item><ipv6Address>{escape_text(a)}</ipv6Address>"
        "<isPrimaryIpv6>false</isPrimaryIpv6></item>" for a in addresses
    ) + "</ipv6AddressesSet>"


def _mac(instance_id: str) -> str:
    tail = (instance_id[2:] + "0" * 10)[:10]
    return "02:" + ":".join(tail[i:i + 2] for i in range(0, 10, 2))


_FIXED = "".join([
    "<productCodes/>",
    text("architecture", "x86_64"), text("rootDeviceType", "ebs"),
    text("virtualizationType", "hvm"),
    text("hypervisor", "xen"), text("enaSupport", True),
    node("capacityReservationSpecification", text("capacityReservationPreference", "open")),
    node("enclaveOptions", text("enabled", False)),
    text("platformDetails", "Linux/UNIX"), text("usageOperation", "RunInstances"),
    node("maintenanceOptions", text("autoRecovery", "default")),
    text("currentInstanceBootMode", "legacy-bios"),
])
"""What every instance shows alike. Element order carries no meaning in EC2's XML, so
the constant part is rendered once, not 10,000 times per DescribeInstances."""


def instance(rec: InstanceRecord, itype: InstanceType | None,
             names: Mapping[str, str] | None = None, devices: Devices | None = None) -> str:
    reason = rec.state_reason
    cores = itype.vcpus if itype else 1
    net = rec.net
    names = names or {}
    live = rec.state != "terminated"
    vpc = rec.network is not None and live
    public = rec.shown_public_ip
    launched = timestamp(rec.launch_time)
    return Fragment("".join([
        text("instanceId", rec.instance_id),
        text("imageId", rec.image_id),
        state("instanceState", rec.state),
        text("privateDnsName", private_dns_name(rec.private_ip) if live else ""),
        text("reason", rec.state_transition_reason),
        text("amiLaunchIndex", rec.ami_launch_index),
        text("keyName", net.key_name or None),
        text("instanceType", rec.instance_type),
        text("launchTime", launched),
        f"<placement>{text('availabilityZone', rec.availability_zone)}<groupName/>"
        f"<tenancy>{escape_text(net.tenancy)}</tenancy></placement>",
        "<monitoring><state>enabled</state></monitoring>" if net.monitoring
        else "<monitoring><state>disabled</state></monitoring>",
        text("subnetId", net.subnet_id if vpc else None),
        text("vpcId", net.vpc_id if vpc else None),
        text("privateIpAddress", (rec.private_ip or None) if live else None),
        text("rootDeviceName", net.root_device_name),
        text("dnsName", public_dns_name(public)),
        text("ipAddress", public or None),
        text("ipv6Address", net.ipv6_addresses[0] if live and net.ipv6_addresses else None),
        _group_set(net.security_group_ids if live else (), names),
        node("stateReason", text("code", reason), text("message", reason)) if reason else "",
        _block_devices(rec, launched, devices),
        text("clientToken", rec.client_token),
        _tags(rec.tags),
        _interfaces(rec, names),
        "<ebsOptimized>true</ebsOptimized>" if net.ebs_optimized
        else "<ebsOptimized>false</ebsOptimized>",
        "<sourceDestCheck>false</sourceDestCheck>" if not net.source_dest_check
        else "<sourceDestCheck>true</sourceDestCheck>",
        "<hibernationOptions><configured>true</configured></hibernationOptions>"
        if net.hibernation else "<hibernationOptions><configured>false</configured>"
        "</hibernationOptions>",
        f"<cpuOptions><coreCount>{cores}</coreCount><threadsPerCore>1</threadsPerCore>"
        "</cpuOptions>",
        metadata_options(rec),
        _FIXED,
    ]))


def metadata_options(rec: InstanceRecord, tag: str = "metadataOptions") -> Fragment:
    opts = rec.opts
    return node(tag, text("state", "applied"), text("httpTokens", opts.http_tokens),
                text("httpPutResponseHopLimit", opts.http_put_response_hop_limit),
                text("httpEndpoint", opts.http_endpoint),
                text("httpProtocolIpv6", opts.http_protocol_ipv6),
                text("instanceMetadataTags", opts.instance_metadata_tags))


TypeLookup = Mapping[str, InstanceType]


def _instances(recs: Iterable[InstanceRecord], types: TypeLookup,
               names: Mapping[str, str], devices: Devices | None = None) -> Fragment:
    return items("instancesSet", (instance(r, types.get(r.instance_type), names, devices)
                                  for r in recs))


def run_instances(res: Reservation, types: TypeLookup, request_id: str,
                  names: Mapping[str, str] | None = None, devices: Devices | None = None
                  ) -> str:
    return response(
        "RunInstances", request_id,
        text("reservationId", res.reservation_id),
        text("ownerId", res.owner_id),
        Fragment("<groupSet/>"),
        _instances(res.instances, types, names or {}, devices),
    )


def describe_instances(page: Paged[Reservation], types: TypeLookup, request_id: str,
                       names: Mapping[str, str] | None = None, devices: Devices | None = None
                       ) -> str:
    reservations = items("reservationSet", (
        text("reservationId", r.reservation_id) + text("ownerId", r.owner_id)
        + Fragment("<groupSet/>") + _instances(r.instances, types, names or {}, devices)
        for r in page.items
    ))
    return response("DescribeInstances", request_id, reservations,
                    text("nextToken", page.next_token))


def state_changes(action: str, changes: Iterable[StateChange], request_id: str) -> str:
    return response(action, request_id, items("instancesSet", (
        text("instanceId", c.instance_id) + state("currentState", c.current)
        + state("previousState", c.previous)
        for c in changes
    )))


def _status(row: InstanceStatusRow) -> str:
    detail = text("name", "reachability") + text("status", row.reachability)
    return text("status", row.status) + items("details", [detail])


def instance_status(page: Paged[InstanceStatusRow], request_id: str) -> str:
    def one(row: InstanceStatusRow) -> str:
        r = row.record
        return (
            text("instanceId", r.instance_id) + text("availabilityZone", r.availability_zone)
            + Fragment("<eventsSet/>") + state("instanceState", r.state)
            + node("systemStatus", _status(row)) + node("instanceStatus", _status(row))
        )
    return response("DescribeInstanceStatus", request_id,
                    items("instanceStatusSet", map(one, page.items)),
                    text("nextToken", page.next_token))


def _gpu_info(t: InstanceType) -> Fragment:
    """One entry per GPU model the type accepts (any one of them will do)."""
    if not t.gpu_total_milli:
        return Fragment("")
    count = t.gpu_count or 1
    gpus = [text("name", m) + text("manufacturer", "NVIDIA") + text("count", count)
            for m in t.gpu_models or ("GPU",)]
    return node("gpuInfo", items("gpus", gpus))


def instance_type(t: InstanceType) -> str:
    burstable = t.family.startswith("t")
    return Fragment("".join([
        text("instanceType", t.name),
        text("currentGeneration", True),
        text("freeTierEligible", False),
        values("supportedUsageClasses", ["on-demand"]),
        values("supportedRootDeviceTypes", ["ebs"]),
        values("supportedVirtualizationTypes", ["hvm"]),
        text("bareMetal", False),
        text("hypervisor", "nitro"),
        node("processorInfo", values("supportedArchitectures", ["x86_64"])),
        node("vCpuInfo", text("defaultVCpus", t.vcpus), text("defaultCores", t.vcpus),
             text("defaultThreadsPerCore", 1)),
        node("memoryInfo", text("sizeInMiB", t.mem_mib)),
        text("instanceStorageSupported", False),
        node("ebsInfo", text("ebsOptimizedSupport", "default"),
             text("encryptionSupport", "supported"), text("nvmeSupport", "required")),
        node("networkInfo", text("networkPerformance", "Up to 5 Gigabit"),
             text("maximumNetworkInterfaces", 3), text("ipv4AddressesPerInterface", 15),
             text("ipv6Supported", False), text("enaSupport", "required")),
        _gpu_info(t),
        values("supportedBootModes", ["legacy-bios", "uefi"]),
        text("burstablePerformanceSupported", burstable),
        text("hibernationSupported", False),
        text("autoRecoverySupported", True),
        text("dedicatedHostsSupported", False),
    ]))


def instance_types(page: Paged[InstanceType], request_id: str) -> str:
    return response("DescribeInstanceTypes", request_id,
                    items("instanceTypeSet", map(instance_type, page.items)),
                    text("nextToken", page.next_token))


def zones(found: Iterable[Zone], request_id: str) -> str:
    return response("DescribeAvailabilityZones", request_id, items("availabilityZoneInfo", (
        text("zoneName", z.name) + text("zoneState", "available")
        + text("regionName", z.region) + text("zoneId", z.zone_id)
        + text("zoneType", "availability-zone") + text("optInStatus", "opt-in-not-required")
        + text("groupName", z.region) + text("networkBorderGroup", z.region)
        + Fragment("<messageSet/>")
        for z in found
    )))


def regions(found: Iterable[tuple[str, str]], request_id: str) -> str:
    return response("DescribeRegions", request_id, items("regionInfo", (
        text("regionName", name) + text("regionEndpoint", endpoint)
        + text("optInStatus", "opt-in-not-required")
        for name, endpoint in found
    )))


def tags(page: Paged[TagRow], request_id: str) -> str:
    return response("DescribeTags", request_id, items("tagSet", (
        text("resourceId", t.resource_id) + text("resourceType", t.resource_type)
        + text("key", t.key) + text("value", t.value)
        for t in page.items
    )), text("nextToken", page.next_token))


def ok(action: str, request_id: str) -> str:
    """CreateTags, DeleteTags and the like answer only ``<return>true</return>``."""
    return response(action, request_id, text("return", True))


def instance_attribute(attr: InstanceAttribute, request_id: str) -> str:
    # An unset attribute (no user data) is an empty element, not an empty value:
    # Terraform hashes an empty value as if it were user data.
    value = node(attr.name, text("value", attr.value)) if attr.value else f"<{attr.name}/>"
    if attr.name == "groupSet":
        value = items("groupSet", (text("groupId", g) for g in attr.groups))
    if attr.xml:
        value = attr.xml
    return response("DescribeInstanceAttribute", request_id,
                    text("instanceId", attr.instance_id), value)


def cpu_credits(rec: InstanceRecord) -> str:
    """EC2's defaults: t3 (and later t families) run "unlimited", t2 "standard"; a
    non-burstable type is reported "standard"."""
    family = rec.instance_type.partition(".")[0]
    return "unlimited" if family.startswith("t") and family not in ("t1", "t2") else "standard"


def credit_specifications(recs: Iterable[InstanceRecord], request_id: str) -> str:
    return response("DescribeInstanceCreditSpecifications", request_id, items(
        "instanceCreditSpecificationSet",
        (text("instanceId", r.instance_id) + text("cpuCredits", cpu_credits(r)) for r in recs),
    ))


def console_output(instance_id: str, output: str, at: str, request_id: str) -> str:
    return response("GetConsoleOutput", request_id, text("instanceId", instance_id),
                    text("timestamp", timestamp(at) if at else None),
                    text("output", output or None))


def metadata_options_result(rec: InstanceRecord, request_id: str) -> str:
    return response("ModifyInstanceMetadataOptions", request_id,
                    text("instanceId", rec.instance_id),
                    metadata_options(rec, "instanceMetadataOptions"))


def type_offerings(page: Paged[tuple[str, str]], location_type: str, request_id: str) -> str:
    return response("DescribeInstanceTypeOfferings", request_id, items(
        "instanceTypeOfferingSet",
        (text("instanceType", t) + text("locationType", location_type) + text("location", where)
         for t, where in page.items),
    ), text("nextToken", page.next_token))


def account_attributes(found: Iterable[tuple[str, list[str]]], request_id: str) -> str:
    return response("DescribeAccountAttributes", request_id, items("accountAttributeSet", (
        text("attributeName", name)
        + items("attributeValueSet", (text("attributeValue", v) for v in vals))
        for name, vals in found
    )))
