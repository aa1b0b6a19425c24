"""The ASGI app: the EC2 Query endpoint on ``/``, the admin API, /healthz and /metrics.

The EC2 route reads the raw body itself: SigV4 signs the exact bytes, so nothing may
consume or re-encode them before the signature is checked. Every outcome, including a
bug, leaves as EC2 XML with a request id; an unexpected exception is logged with that
id and answered as ``InternalError``, never as a traceback.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from roost.domain.errors import (
    DryRunOperation,
    InternalError,
    InvalidAction,
    InvalidParameterValue,
    MissingAction,
    RoostError,
)
from roost.gateway import xml
from roost.gateway.actions import ACTIONS
from roost.gateway.admin import admin_routes
from roost.gateway.call import Call
from roost.gateway.query import Params, parse_form
from roost.gateway.reads import Ec2Reads
from roost.gateway.service import DRY_RUN, Ec2Service
from roost.gateway.sigv4 import SignedRequest, SigV4Verifier
from roost.gateway.tenancy import Caller, acting_as

log = logging.getLogger(__name__)

MAX_BODY = 1024 * 1024
"""Larger than any EC2 call (user data is at most 16 KiB), small enough to refuse early."""
Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class AppParts:
    service: Ec2Service
    reads: Ec2Reads
    verifier: SigV4Verifier | None  # None: --no-auth
    callers: Callable[[str], Caller] | None = None
    """Access key id -> the account it acts for; None: nobody is scoped (--no-auth)."""


async def _body(request: Request) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise InvalidParameterValue(f"The request body exceeds {MAX_BODY} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)


def signed_request(request: Request, body: bytes) -> SignedRequest:
    raw_path = request.scope.get("raw_path")
    path = raw_path.decode("latin-1") if raw_path else request.url.path
    return SignedRequest(
        method=request.method,
        path=path.split("?", 1)[0],
        query=request.scope.get("query_string", b"").decode("latin-1"),
        headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw],
        body=body,
    )


def _xml_response(body: str, status: int, request_id: str) -> Response:
    return Response(body, status, media_type="text/xml",
                    headers={"x-amzn-RequestId": request_id})


def ec2_endpoint(parts: AppParts) -> Endpoint:
    metrics = parts.service.metrics

    async def handle(request: Request) -> Response:
        request_id = str(uuid.uuid4())
        started = time.perf_counter()
        action = "unknown"
        try:
            body = await _body(request)
            who = None
            if parts.verifier is not None:
                key_id = parts.verifier.verify(signed_request(request, body))
                who = parts.callers(key_id) if parts.callers is not None else None
            pairs = parse_form(body, request.scope.get("query_string", b"").decode("latin-1"))
            name = pairs.get("Action", "")
            if not name:
                raise MissingAction("The request must contain the parameter Action")
            handler = ACTIONS.get(name)
            if handler is None:
                raise InvalidAction(f"The action {name[:100]} is not valid for this web service.")
            action = name
            params = Params(pairs)
            if params.flag("DryRun"):
                # EC2 answers a dry run from the caller's permissions alone, before it
                # reads any other parameter; roost's caller may do anything it signs.
                raise DryRunOperation(DRY_RUN)
            with acting_as(who):
                text = await handler(Call(params, request_id, parts.service, parts.reads))
            status, code = 200, "ok"
        except RoostError as err:
            text, status, code = xml.error(err, request_id), err.http_status, err.code
        except Exception:
            log.exception("request %s (%s) failed", request_id, action)
            bug = InternalError(f"An internal error has occurred (request {request_id}).")
            text, status, code = xml.error(bug, request_id), bug.http_status, bug.code
        metrics.requests.labels(action, code).inc()
        metrics.observed(action, time.perf_counter() - started)
        return _xml_response(text, status, request_id)

    return handle


def signed_only(parts: AppParts, endpoint: Endpoint) -> Endpoint:
    """Wrap an admin endpoint so that it answers only SigV4-signed requests."""

    async def guarded(request: Request) -> Response:
        who = None
        if parts.verifier is not None:
            try:
                key_id = parts.verifier.verify(signed_request(request, await _body(request)))
            except RoostError as err:
                return JSONResponse({"error": err.code, "message": err.message},
                                    err.http_status)
            who = parts.callers(key_id) if parts.callers is not None else None
        with acting_as(who):  # the instances it lists are the caller's, as in EC2 calls
            return await endpoint(request)

    return guarded


def build_app(parts: AppParts, *, health: Callable[[], tuple[bool, dict[str, object]]]
              ) -> ASGIApp:
    metrics = parts.service.metrics

    async def healthz(request: Request) -> Response:
        ok, detail = health()
        return JSONResponse({"status": "ok" if ok else "unavailable", **detail},
                            200 if ok else 503)

    async def metrics_endpoint(request: Request) -> Response:
        metrics.nodes.set(parts.service.view.live_count())
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    admin = [Route(r.path, signed_only(parts, r.endpoint), methods=["GET"])
             for r in admin_routes(parts.service)]
    ec2 = ec2_endpoint(parts)
    routes = [
        Route("/", ec2, methods=["GET", "POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        *admin,
    ]
    return ec2_first(ec2, Starlette(routes=routes))


def ec2_first(ec2: Endpoint, rest: ASGIApp) -> ASGIApp:
    """The EC2 endpoint straight from the server, everything else through ``rest``.

    The EC2 handler answers every outcome itself (errors as EC2 XML, a bug as
    InternalError), so Starlette's router and its two exception middlewares add nothing
    to it; they were about a tenth of the gateway's time per RunInstances."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["path"] == "/"
                and scope["method"] in ("POST", "GET")):
            response = await ec2(Request(scope, receive))
            await response(scope, receive, send)
        else:
            await rest(scope, receive, send)

    return app
