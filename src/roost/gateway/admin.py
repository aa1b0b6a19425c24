"""The admin JSON API under ``/api/v1``: nodes with their free resources and per-type fit
counts, and instances. ``GET /api/v1/openapi.json`` describes it.

It is read-only and signed like the EC2 endpoint (SigV4, any service name), so
``roost status`` and ``curl --aws-sigv4`` reach it with the same keys.
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from roost.gateway.capacity import NodeStatus
from roost.gateway.service import Ec2Service

API_PREFIX = "/api/v1"


def node_json(st: NodeStatus) -> dict[str, Any]:
    s = st.snap
    return {
        "node_id": s.node_id,
        "availability_zone": s.availability_zone,
        "live": st.live,
        "draining": s.draining,
        "age_seconds": round(st.age_seconds, 3),
        "allocatable": {"cpu_milli": s.alloc_cpu_milli, "mem_mib": s.alloc_mem_mib},
        "free": {"cpu_milli": s.free_cpu_milli, "mem_mib": s.free_mem_mib},
        "gpus": [{"index": i, "model": m, "free_milli": f}
                 for i, (m, f) in enumerate(zip(s.gpu_models, s.gpu_free, strict=False))],
        "fit": {k: v for k, v in s.fit.items() if v > 0},
        "instances": s.instances,
        "isolation": s.isolation or "unknown",
        "isolation_note": s.isolation_note,
        "boot_id": s.boot_id,
        "seq": s.seq,
    }


def _json(data: object, status: int = 200) -> Response:
    return Response(msgspec.json.encode(data), status, media_type="application/json")


def not_found(what: str) -> Response:
    return JSONResponse({"error": "NotFound", "message": f"{what} not found"}, 404)


def admin_routes(service: Ec2Service) -> list[Route]:
    async def nodes(request: Request) -> Response:
        return _json({"nodes": [node_json(st) for st in service.view.status()]})

    async def node(request: Request) -> Response:
        node_id = request.path_params["node_id"]
        for st in service.view.status():
            if st.snap.node_id == node_id:
                return _json(node_json(st))
        return not_found(f"node {node_id}")

    async def instances(request: Request) -> Response:
        recs = service.index.all()
        for key in ("state", "node_id", "instance_type"):
            want = request.query_params.get(key)
            if want:
                field = "node_id" if key == "node_id" else key
                recs = [r for r in recs if getattr(r, field) == want]
        recs.sort(key=lambda r: r.instance_id)
        return _json({"instances": recs})

    async def instance(request: Request) -> Response:
        iid = request.path_params["instance_id"]
        rec = service.index.find(iid)
        return _json(rec) if rec is not None else not_found(f"instance {iid}")

    async def openapi(request: Request) -> Response:
        return JSONResponse(OPENAPI)

    return [
        Route(f"{API_PREFIX}/nodes", nodes),
        Route(f"{API_PREFIX}/nodes/{{node_id}}", node),
        Route(f"{API_PREFIX}/instances", instances),
        Route(f"{API_PREFIX}/instances/{{instance_id}}", instance),
        Route(f"{API_PREFIX}/openapi.json", openapi),
    ]


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    return out


_INT = {"type": "integer"}
_STR = {"type": "string"}
_RES = _obj({"cpu_milli": _INT, "mem_mib": _INT})
_NODE = _obj({
    "node_id": _STR, "availability_zone": _STR, "live": {"type": "boolean"},
    "draining": {"type": "boolean"}, "age_seconds": {"type": "number"},
    "allocatable": _RES, "free": _RES,
    "gpus": {"type": "array", "items": _obj({"index": _INT, "model": _STR, "free_milli": _INT})},
    "fit": {"type": "object", "additionalProperties": _INT,
            "description": "How many more of each instance type fit (types with none omitted)"},
    "instances": _INT, "boot_id": _STR, "seq": _INT,
}, ["node_id", "live", "draining", "allocatable", "free", "fit"])
_INSTANCE = _obj({
    "instance_id": _STR, "node_id": _STR, "instance_type": _STR, "image_id": _STR,
    "state": _STR, "reservation_id": _STR, "launch_time": _STR, "availability_zone": _STR,
    "tags": {"type": "object", "additionalProperties": _STR}, "private_ip": _STR,
}, ["instance_id", "node_id", "instance_type", "state"])
_ERROR = _obj({"error": _STR, "message": _STR})


def _get(summary: str, schema: dict[str, Any], params: list[dict[str, Any]] | None = None
         ) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": schema}}},
            "401": {"description": "Bad or missing SigV4 signature",
                    "content": {"application/json": {"schema": _ERROR}}},
        },
    }
    if params:
        op["parameters"] = params
    return {"get": op}


def _path_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": _STR}


def _query_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": _STR}


OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "roost gateway admin API", "version": "1"},
    "components": {"securitySchemes": {"sigv4": {
        "type": "apiKey", "in": "header", "name": "Authorization",
        "description": "AWS Signature Version 4 with the gateway's access keys",
    }}},
    "security": [{"sigv4": []}],
    "paths": {
        f"{API_PREFIX}/nodes": _get(
            "Nodes in the capacity view: free resources and per-type fit counts",
            _obj({"nodes": {"type": "array", "items": _NODE}})),
        f"{API_PREFIX}/nodes/{{node_id}}": _get("One node", _NODE, [_path_param("node_id")]),
        f"{API_PREFIX}/instances": _get(
            "Instances, optionally filtered",
            _obj({"instances": {"type": "array", "items": _INSTANCE}}),
            [_query_param("state"), _query_param("node_id"), _query_param("instance_type")]),
        f"{API_PREFIX}/instances/{{instance_id}}": _get(
            "One instance", _INSTANCE, [_path_param("instance_id")]),
        f"{API_PREFIX}/openapi.json": _get("This document", {"type": "object"}),
    },
}
