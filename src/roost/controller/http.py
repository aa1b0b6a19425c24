"""The controller's HTTP API, on its own port: health, readiness, status, metrics, the
task API (`roost.controller.tasks_api`, served by leader and followers alike), and an
OpenAPI document describing them all.

Only the task API asks for a bearer token. ``/healthz``, ``/readyz``, ``/metrics``,
``/status`` and ``/openapi.json`` stay open, for probes and scrapers: they show pool
names, counts and scaling decisions, never a task's payload or result (docs/security.md).

Every error, including an unknown path, a wrong method or a bad query parameter, is an
``application/problem+json`` body (RFC 9457), never an HTML page or a traceback.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from roost.controller import tasks_api
from roost.controller.adapters.native import NativeOrchestrator
from roost.controller.loop import Controller
from roost.controller.orchestrator import OrchestratorUnavailable
from roost.controller.status import HealthDoc, Problem, StatusDoc, known_pools, status_doc
from roost.store import roles
from roost.store.pools import POOL_ID

log = logging.getLogger("roost.controller.http")
Endpoint = Callable[[Request], Awaitable[Response]]


def _json(body: msgspec.Struct, status: int = 200) -> Response:
    return Response(msgspec.json.encode(body), status, media_type="application/json")


def problem(status: int, title: str, detail: str = "", *,
            headers: dict[str, str] | None = None) -> Response:
    body = msgspec.json.encode(Problem(title=title, status=status, detail=detail))
    return Response(body, status, headers=headers, media_type="application/problem+json")


class BadRequest(Exception):
    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail = status, title, detail


def _safe(fn: Endpoint) -> Endpoint:
    """Anything unexpected becomes a 500 problem with an error id that is in the log."""

    @functools.wraps(fn)
    async def wrapper(request: Request) -> Response:
        try:
            return await fn(request)
        except BadRequest as exc:
            return problem(exc.status, exc.title, exc.detail)
        except Exception:
            error_id = uuid.uuid4().hex[:12]
            log.exception("error %s serving %s", error_id, request.url.path)
            return problem(500, "Internal error", f"logged as error {error_id}")

    return wrapper


def _pool_filter(request: Request, c: Controller) -> set[str] | None:
    extra = set(request.query_params) - {"pool"}
    if extra:
        raise BadRequest(400, "Unknown query parameter",
                         f"/status takes only 'pool', not {', '.join(sorted(extra))}")
    wanted = request.query_params.getlist("pool")
    if not wanted:
        return None
    for pid in wanted:
        if not POOL_ID.fullmatch(pid):
            raise BadRequest(400, "Invalid pool id",
                             f"{pid!r} is not a pool id (lower-case letters, digits, '-')")
    unknown = set(wanted) - known_pools(c)
    if unknown:
        raise BadRequest(404, "Unknown pool", f"no pool {', '.join(sorted(unknown))}")
    return set(wanted)


def _enroller(c: Controller) -> tasks_api.Enroller | None:
    """The worker credential exchange, if a native adapter is served."""
    native = c.orchestrators.get("native")
    if not isinstance(native, NativeOrchestrator):
        return None

    async def enroll(token: str, instance_id: str) -> str | None:
        try:
            pool = await native.enroll(token, instance_id)
        except OrchestratorUnavailable as exc:
            raise tasks_api.ApiProblem(503, "Gateway unavailable",
                                       f"cannot check the instance: {exc}; retry") from None
        if pool is None or not await roles.record_enrollment(c.db, instance_id, pool):
            return None
        return native.settings.dsn

    return enroll


def build_app(controller: Controller) -> Starlette:
    c = controller

    @_safe
    async def healthz(request: Request) -> Response:
        if c.stopped:
            return _json(HealthDoc("stopped"), 503)
        return _json(HealthDoc("ok", c.leadership.is_leader))

    @_safe
    async def readyz(request: Request) -> Response:
        ready, why = c.readiness()
        if not ready:
            return problem(503, "Not ready", why)
        return _json(HealthDoc("ready", c.leadership.is_leader, why))

    @_safe
    async def status(request: Request) -> Response:
        return _json(status_doc(c, pools=_pool_filter(request, c)))

    @_safe
    async def metrics(request: Request) -> Response:
        return Response(c.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @_safe
    async def openapi_doc(request: Request) -> Response:
        return Response(OPENAPI, media_type="application/json")

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        titles = {404: "Not found", 405: "Method not allowed"}
        return problem(exc.status_code, titles.get(exc.status_code, "HTTP error"),
                       f"{request.method} {request.url.path}: {exc.detail}",
                       headers=dict(exc.headers or {}))

    async def crash(request: Request, exc: Exception) -> Response:
        log.error("unhandled error serving %s", request.url.path, exc_info=exc)
        return problem(500, "Internal error")

    return Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/status", status, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/openapi.json", openapi_doc, methods=["GET"]),
            *tasks_api.task_routes(c.db, timeout=c.config.io_timeout,
                                   enroller=_enroller(c)),
        ],
        exception_handlers={HTTPException: http_error, Exception: crash},
    )


def _openapi() -> bytes:
    (status_ref, health_ref, problem_ref), components = msgspec.json.schema_components(
        (StatusDoc, HealthDoc, Problem), ref_template="#/components/schemas/{name}"
    )

    def ok(ref: dict[str, Any], media: str = "application/json") -> dict[str, Any]:
        return {"description": "OK", "content": {media: {"schema": ref}}}

    task_paths, task_components = tasks_api.openapi_fragment()
    clash = {k for k, v in task_components.items() if components.get(k, v) != v}
    if clash:  # the same name for two different schemas would describe one of them wrongly
        raise AssertionError(f"task API schemas clash with the controller's: {sorted(clash)}")
    components = {**components, **task_components}
    err = {"content": {"application/problem+json": {"schema": problem_ref}}}
    doc = {
        "openapi": "3.1.0",
        "info": {"title": "roost capacity controller", "version": "1"},
        "paths": {
            "/healthz": {"get": {
                "summary": "The process is alive.",
                "responses": {"200": ok(health_ref), "503": {"description": "Stopped", **err}},
            }},
            "/readyz": {"get": {
                "summary": "Ready as leader and as follower; 503 on error, before the "
                           "first tick, or as a follower that cannot take the lead from a "
                           "leader that is gone (the detail says why).",
                "responses": {"200": ok(health_ref), "503": {"description": "Not ready", **err}},
            }},
            "/status": {"get": {
                "summary": "Leadership, queue, plan per pool and recent scale actions.",
                "parameters": [{"name": "pool", "in": "query", "required": False,
                                "description": "Only these pools (repeatable).",
                                "schema": {"type": "string"}}],
                "responses": {"200": ok(status_ref),
                              "400": {"description": "Bad query", **err},
                              "404": {"description": "Unknown pool", **err}},
            }},
            "/metrics": {"get": {
                "summary": "Prometheus metrics.",
                "responses": {"200": ok({"type": "string"}, "text/plain")},
            }},
            "/openapi.json": {"get": {"summary": "This document.",
                                      "responses": {"200": ok({"type": "object"})}}},
            **task_paths,
        },
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
    return msgspec.json.encode(doc)


OPENAPI = _openapi()
