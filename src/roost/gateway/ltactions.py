"""Launch template actions, and their XML (EC2 2016-11-15 shapes)."""

from __future__ import annotations

import msgspec

from roost.domain.errors import InvalidParameterValue
from roost.gateway import netrequests as nq
from roost.gateway import requests as rq
from roost.gateway import shapes
from roost.gateway.call import Action, Call
from roost.gateway.describe import Field, apply_filters, page_of
from roost.gateway.query import Params
from roost.gateway.tagging import specified
from roost.gateway.templates import (
    LaunchTemplate,
    TemplateStore,
    TemplateVersion,
    now,
    overlay,
    run_parameters,
    template_data,
)
from roost.gateway.xml import Fragment, items, node, response, text, timestamp

TEMPLATE_FIELDS: dict[str, Field[LaunchTemplate]] = {
    "launch-template-name": lambda t: [t.name],
    "create-time": lambda t: [timestamp(t.created)],
}
VERSION_FIELDS: dict[str, Field[TemplateVersion]] = {}


def _tags(tags: dict[str, str]) -> Fragment:
    if not tags:
        return Fragment("")
    return items("tagSet", (text("key", k) + text("value", v) for k, v in tags.items()))


def template_xml(t: LaunchTemplate) -> Fragment:
    return Fragment("".join([
        text("launchTemplateId", t.template_id), text("launchTemplateName", t.name),
        text("createTime", timestamp(t.created)), text("createdBy", t.created_by),
        text("defaultVersionNumber", t.default_version),
        text("latestVersionNumber", t.latest_version), _tags(t.tags),
    ]))


def version_xml(t: LaunchTemplate, v: TemplateVersion) -> Fragment:
    req = shapes.shape("RequestLaunchTemplateData")
    data = shapes.read(Params(v.data), req) or {}
    return Fragment("".join([
        text("launchTemplateId", t.template_id), text("launchTemplateName", t.name),
        text("versionNumber", v.number), text("versionDescription", v.description or None),
        text("createTime", timestamp(v.created)), text("createdBy", t.created_by),
        text("defaultVersion", v.number == t.default_version),
        node("launchTemplateData",
             shapes.to_xml(data, shapes.shape("ResponseLaunchTemplateData"))),
    ]))


def _store(c: Call) -> TemplateStore:
    return c.service.templates


def _find(c: Call) -> LaunchTemplate:
    return _store(c).find(c.params.get("LaunchTemplateId") or "",
                          c.params.get("LaunchTemplateName") or "")


def _data(p: Params) -> dict[str, str]:
    """LaunchTemplateData, its tags held to the rules RunInstances holds them to (any
    type EC2 tags at launch is kept: RunInstances refuses those roost cannot tag)."""
    data = template_data(p)
    specified(Params(data), (*rq.LAUNCH_TAGGED, *rq.LAUNCH_UNTAGGED))
    return data


async def create_launch_template(c: Call) -> str:
    t = await _store(c).create(
        c.params.require("LaunchTemplateName"), _data(c.params),
        description=c.params.get("VersionDescription") or "",
        tags=dict(nq.resource_tags(c.params, "launch-template")))
    return response("CreateLaunchTemplate", c.request_id, node("launchTemplate", template_xml(t)))


async def create_launch_template_version(c: Call) -> str:
    found = _find(c)
    source = c.params.get("SourceVersion")
    data = _data(c.params)
    if source:
        data = overlay(found.version(source).data, data)
    description = c.params.get("VersionDescription") or ""

    def add(t: LaunchTemplate) -> LaunchTemplate:
        number = t.latest_version + 1
        version = TemplateVersion(number, data, description, now())
        return msgspec.structs.replace(t, latest_version=number, versions=[*t.versions, version])

    t = await _store(c).change(found.template_id, add)
    return response("CreateLaunchTemplateVersion", c.request_id,
                    node("launchTemplateVersion", version_xml(t, t.versions[-1])))


async def describe_launch_templates(c: Call) -> str:
    req = rq.parse_describe_listed(c.params, "LaunchTemplateId", "DescribeLaunchTemplates")
    names = c.params.values("LaunchTemplateName")
    store = _store(c)
    if req.ids or names:
        chosen = [store.find(template_id=i) for i in req.ids]
        chosen += [store.find(name=n) for n in names]
    else:
        chosen = store.all()
    found = apply_filters(chosen, req.filters, TEMPLATE_FIELDS, tags=lambda t: t.tags)
    page = page_of(found, req.page, key=lambda t: t.template_id, kind="lt")
    return response("DescribeLaunchTemplates", c.request_id,
                    items("launchTemplates", map(template_xml, page.items)),
                    text("nextToken", page.next_token))


async def describe_launch_template_versions(c: Call) -> str:
    t = _find(c)
    wanted = c.params.values("LaunchTemplateVersion")
    if wanted:
        chosen = list({v.number: v for v in (t.version(w) for w in wanted)}.values())
    else:
        chosen = list(t.versions)
    low, high = c.params.get("MinVersion"), c.params.get("MaxVersion")
    for bound in (low, high):
        if bound is not None and not bound.isdigit():
            raise InvalidParameterValue(f"Invalid version bound {bound[:20]}.")
    if low is not None:
        chosen = [v for v in chosen if v.number >= int(low)]
    if high is not None:
        chosen = [v for v in chosen if v.number <= int(high)]
    fields: dict[str, Field[TemplateVersion]] = {
        "is-default-version": lambda v: [str(v.number == t.default_version).lower()]}
    chosen = apply_filters(chosen, rq.filters(c.params), fields)
    return response("DescribeLaunchTemplateVersions", c.request_id,
                    items("launchTemplateVersionSet", (version_xml(t, v) for v in chosen)))


async def modify_launch_template(c: Call) -> str:
    found = _find(c)
    default = c.params.get("SetDefaultVersion")
    if default:
        number = found.version(default).number
        found = await _store(c).change(
            found.template_id,
            lambda t: msgspec.structs.replace(t, default_version=number))
    return response("ModifyLaunchTemplate", c.request_id,
                    node("launchTemplate", template_xml(found)))


async def delete_launch_template(c: Call) -> str:
    found = _find(c)
    await _store(c).delete(found)
    return response("DeleteLaunchTemplate", c.request_id,
                    node("launchTemplate", template_xml(found)))


def expand(store: TemplateStore, p: Params) -> tuple[Params, dict[str, str]]:
    """RunInstances parameters with ``LaunchTemplate.*`` resolved: the version's data
    under the request's own members (a member the request names replaces the
    template's, as on EC2). The tags EC2 stamps on such an instance come back too."""
    if not p.has("LaunchTemplate"):
        return p, {}
    ref = p.under("LaunchTemplate")
    t = store.find(ref.get("LaunchTemplateId") or "", ref.get("LaunchTemplateName") or "")
    v = t.version(ref.get("Version") or "$Default")
    own = {k: v for k, v in p.pairs().items() if not k.startswith("LaunchTemplate.")}
    merged = overlay(run_parameters(v), own)
    stamps = {"aws:ec2launchtemplate:id": t.template_id,
              "aws:ec2launchtemplate:version": str(v.number)}
    return Params(merged), stamps


TEMPLATE_ACTIONS: dict[str, Action] = {
    "CreateLaunchTemplate": create_launch_template,
    "CreateLaunchTemplateVersion": create_launch_template_version,
    "DescribeLaunchTemplates": describe_launch_templates,
    "DescribeLaunchTemplateVersions": describe_launch_template_versions,
    "ModifyLaunchTemplate": modify_launch_template,
    "DeleteLaunchTemplate": delete_launch_template,
}
