"""One function per EC2 action: parse the form, call the model, render the result.

Each handler is three lines on purpose; anything longer belongs in `requests` (what a
well-formed call is), `service`/`reads` (what it does) or `render` (how EC2 shows it).
"""

from __future__ import annotations

from roost.gateway import render
from roost.gateway import requests as rq
from roost.gateway.call import Action, Call
from roost.gateway.imageactions import IMAGE_ACTIONS
from roost.gateway.ltactions import TEMPLATE_ACTIONS, expand
from roost.gateway.netactions import NETWORK_ACTIONS
from roost.gateway.volactions import VOLUME_ACTIONS, devices_of
from roost.gateway.vpcextras import VPC_EXTRA_ACTIONS


async def run_instances(c: Call) -> str:
    params, stamps = expand(c.service.templates, c.params)
    reservation = await c.service.run_instances(rq.parse_run_instances(params, stamps))
    return render.run_instances(reservation, c.service.types.all(), c.request_id,
                                c.service.net.group_names(), devices_of(c.service.volumes))


async def terminate_instances(c: Call) -> str:
    changes = await c.service.change_state("terminate", rq.parse_terminate_instances(c.params))
    return render.state_changes("TerminateInstances", changes, c.request_id)


async def stop_instances(c: Call) -> str:
    changes = await c.service.change_state("stop", rq.parse_instance_ids(c.params))
    return render.state_changes("StopInstances", changes, c.request_id)


async def start_instances(c: Call) -> str:
    changes = await c.service.change_state("start", rq.parse_instance_ids(c.params))
    return render.state_changes("StartInstances", changes, c.request_id)


async def describe_instances(c: Call) -> str:
    page = await c.reads.describe_instances(rq.parse_describe_instances(c.params))
    return render.describe_instances(page, c.service.types.all(), c.request_id,
                                     c.service.net.group_names(), devices_of(c.service.volumes))


async def describe_instance_status(c: Call) -> str:
    page = await c.reads.describe_instance_status(rq.parse_describe_instance_status(c.params))
    return render.instance_status(page, c.request_id)


async def describe_instance_types(c: Call) -> str:
    page = await c.reads.describe_instance_types(rq.parse_describe_instance_types(c.params))
    return render.instance_types(page, c.request_id)


async def describe_availability_zones(c: Call) -> str:
    zones = c.reads.describe_zones(rq.parse_describe_named(c.params, "ZoneName"),
                                   zone_ids=tuple(c.params.values("ZoneId")))
    return render.zones(zones, c.request_id)


async def describe_regions(c: Call) -> str:
    regions = c.reads.describe_regions(rq.parse_describe_named(c.params, "RegionName"))
    return render.regions(regions, c.request_id)


async def create_tags(c: Call) -> str:
    req = rq.parse_tags(c.params, deleting=False)
    await c.service.change_tags(req.resource_ids, dict(req.tags), delete=False,
                                dry_run=req.dry_run)
    return render.ok("CreateTags", c.request_id)


async def delete_tags(c: Call) -> str:
    req = rq.parse_tags(c.params, deleting=True)
    await c.service.change_tags(req.resource_ids, dict(req.tags), delete=True,
                                dry_run=req.dry_run)
    return render.ok("DeleteTags", c.request_id)


async def describe_tags(c: Call) -> str:
    page = c.reads.describe_tags(rq.parse_describe_tags(c.params))
    return render.tags(page, c.request_id)


async def describe_instance_attribute(c: Call) -> str:
    attr = await c.reads.describe_instance_attribute(rq.parse_instance_attribute(c.params))
    return render.instance_attribute(attr, c.request_id)


async def describe_instance_credit_specifications(c: Call) -> str:
    req = rq.parse_describe_credit_specifications(c.params)
    recs = await c.reads.describe_credit_specifications(req)
    return render.credit_specifications(recs, c.request_id)


async def modify_instance_attribute(c: Call) -> str:
    await c.service.modify_instance(rq.parse_modify_instance_attribute(c.params))
    return render.ok("ModifyInstanceAttribute", c.request_id)


async def modify_instance_metadata_options(c: Call) -> str:
    req = rq.parse_modify_metadata_options(c.params)
    await c.service.modify_instance(req)
    (rec,) = await c.service.index.require([req.instance_id])
    return render.metadata_options_result(rec, c.request_id)


async def reboot_instances(c: Call) -> str:
    await c.service.change_state("reboot", rq.parse_instance_ids(c.params))
    return render.ok("RebootInstances", c.request_id)


async def get_console_output(c: Call) -> str:
    out = await c.service.console_output(rq.parse_console_output(c.params))
    return render.console_output(out.instance_id, out.output, out.timestamp, c.request_id)


async def describe_instance_type_offerings(c: Call) -> str:
    where = c.params.get("LocationType") or "region"
    page = await c.reads.describe_type_offerings(rq.parse_describe_offerings(c.params), where)
    return render.type_offerings(page, where, c.request_id)


async def describe_account_attributes(c: Call) -> str:
    found = c.reads.describe_account_attributes(tuple(c.params.values("AttributeName")))
    return render.account_attributes(found, c.request_id)


ACTIONS: dict[str, Action] = {
    "RunInstances": run_instances,
    "TerminateInstances": terminate_instances,
    "StopInstances": stop_instances,
    "StartInstances": start_instances,
    "DescribeInstances": describe_instances,
    "DescribeInstanceStatus": describe_instance_status,
    "DescribeInstanceTypes": describe_instance_types,
    "DescribeAvailabilityZones": describe_availability_zones,
    "DescribeRegions": describe_regions,
    "CreateTags": create_tags,
    "DeleteTags": delete_tags,
    "DescribeTags": describe_tags,
    "DescribeInstanceAttribute": describe_instance_attribute,
    "DescribeInstanceCreditSpecifications": describe_instance_credit_specifications,
    "ModifyInstanceAttribute": modify_instance_attribute,
    "ModifyInstanceMetadataOptions": modify_instance_metadata_options,
    "RebootInstances": reboot_instances,
    "GetConsoleOutput": get_console_output,
    "DescribeInstanceTypeOfferings": describe_instance_type_offerings,
    "DescribeAccountAttributes": describe_account_attributes,
    **NETWORK_ACTIONS,
    **TEMPLATE_ACTIONS,
    **IMAGE_ACTIONS,
    **VPC_EXTRA_ACTIONS,
    **VOLUME_ACTIONS,
}
