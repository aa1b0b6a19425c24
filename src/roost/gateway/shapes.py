"""Moving a structure between EC2's Query form and its XML, driven by botocore's model.

Launch templates hold a `RequestLaunchTemplateData`: it arrives flattened
(``LaunchTemplateData.BlockDeviceMapping.1.Ebs.VolumeSize``), is described back as a
`ResponseLaunchTemplateData` (``<blockDeviceMappingSet><item><ebs><volumeSize>``), and
launches as RunInstances parameters (``BlockDeviceMapping.1.Ebs.VolumeSize``). The member
names are the same in all three shapes; only their wire names differ, and botocore's
service model knows those, so one walk per direction does for every member, including
ones roost ignores at launch.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

import botocore.session
from botocore.model import ListShape, Shape, StructureShape

from roost.gateway.query import Params
from roost.gateway.xml import Fragment, items, node, text, values

Value = Any
"""A nested value: dict (structure), list, or the string the form carried."""


@cache
def model() -> Any:
    return botocore.session.get_session().get_service_model("ec2")


def shape(name: str) -> StructureShape:
    found = model().shape_for(name)
    assert isinstance(found, StructureShape)
    return found


def run_instances_shape() -> StructureShape:
    found = model().operation_model("RunInstances").input_shape
    assert isinstance(found, StructureShape)
    return found


def query_name(member: Shape, name: str) -> str:
    """The member's name in the Query form, as botocore's EC2 serializer spells it."""
    ser = member.serialization
    if "queryName" in ser:
        return str(ser["queryName"])
    if "name" in ser:
        loc = str(ser["name"])
        return loc[0].upper() + loc[1:]
    return name


def read(p: Params, s: Shape, depth: int = 0) -> Value:
    """The value of shape ``s`` at ``p``'s prefix, or None when the form has none."""
    if depth > 8:
        return None
    if isinstance(s, StructureShape):
        out: dict[str, Value] = {}
        for name, member in s.members.items():
            key = query_name(member, name)
            if isinstance(member, (StructureShape, ListShape)):
                if not p.has(key):
                    continue
                if isinstance(member, StructureShape):
                    found = read(p.under(key), member, depth + 1)
                else:
                    found = _read_list(p, key, member, depth)
            else:
                found = p.get(key)
            if found is not None:
                out[name] = found
        return out
    return None


def _read_list(p: Params, key: str, s: ListShape, depth: int) -> list[Value]:
    if isinstance(s.member, StructureShape):
        return [read(m, s.member, depth + 1) for m in p.members(key)]
    return list(p.values(key))


def flatten(value: Mapping[str, Value], s: StructureShape, prefix: str = "") -> dict[str, str]:
    """``value`` as Query pairs for shape ``s`` (members ``s`` lacks are left out)."""
    out: dict[str, str] = {}
    for name, v in value.items():
        member = s.members.get(name)
        if member is None:
            continue
        key = f"{prefix}{query_name(member, name)}"
        if isinstance(member, StructureShape) and isinstance(v, Mapping):
            out.update(flatten(v, member, key + "."))
        elif isinstance(member, ListShape) and isinstance(v, list):
            for i, element in enumerate(v, 1):
                if isinstance(member.member, StructureShape) and isinstance(element, Mapping):
                    out.update(flatten(element, member.member, f"{key}.{i}."))
                else:
                    out[f"{key}.{i}"] = str(element)
        elif isinstance(v, str):
            out[key] = v
    return out


def to_xml(value: Mapping[str, Value], s: StructureShape) -> Fragment:
    """``value`` as the members of shape ``s`` in EC2's XML (``<tag>...</tag>`` each)."""
    parts: list[str] = []
    for name, v in value.items():
        member = s.members.get(name)
        if member is None:
            continue
        tag = str(member.serialization.get("name") or name[0].lower() + name[1:])
        if isinstance(member, StructureShape) and isinstance(v, Mapping):
            parts.append(node(tag, to_xml(v, member)))
        elif isinstance(member, ListShape) and isinstance(v, list):
            if isinstance(member.member, StructureShape):
                inner = member.member
                parts.append(items(tag, (to_xml(e, inner) for e in v if isinstance(e, Mapping))))
            else:
                parts.append(values(tag, [str(e) for e in v]))
        elif isinstance(v, str):
            parts.append(text(tag, _scalar(member, v)))
    return Fragment("".join(parts))


def _scalar(member: Shape, v: str) -> str:
    return v.lower() if member.type_name == "boolean" else v
