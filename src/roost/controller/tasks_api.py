"""The task API, served by every controller replica (leader or not):

- ``POST /api/v1/pools/{pool}/tasks``: submit ``{"payload": ..., "idempotencyKey": ...,
  "maxAttempts": ...}``; 201 with the new task's ``id``, or 200 with the existing one
  when the key was used before with the same payload (409 with another payload).
- ``GET /api/v1/tasks/{id}``: status (queued, running, succeeded, failed), attempts,
  result and last error.
- ``GET /api/v1/pools/{pool}``: queued, running, succeeded, failed, and the replicas
  and desired count the leader last published.

**Access.** Every request carries ``Authorization: Bearer <token>``, a token of one
pool or of every pool (`roost.store.apitokens`). No token, or one that is unknown or
revoked, is a 401 with ``WWW-Authenticate: Bearer``. A pool or task the token does not
reach answers exactly as one that does not exist, 404, so a token learns nothing about
other pools. Task ids are random (``t-`` and 32 hex digits), never the sequential
database id.

- ``POST /api/v1/worker-credentials``: a native pool's worker exchanges its enrollment
  token and instance id for its database DSN, once (`roost.controller.enrollment`);
  403 for anything refused, with no reason given. No bearer token: the enrollment token
  is the credential.

Protocol only: parse, call `roost.store.tasks`, serialize. Every error is an
``application/problem+json`` body; a database that does not answer is a 503, a body the
client does not finish sending in time a 408, a value Postgres cannot hold (U+0000, or
nesting past `MAX_DEPTH`) a 400, anything unexpected a 500 whose id is in the log, never
a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from itertools import compress
from typing import Annotated, Any, TypeVar

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from roost.controller.status import Problem
from roost.store import apitokens
from roost.store import tasks as tq
from roost.store.errors import PoolNotFound
from roost.store.pools import POOL_ID
from roost.store.session import CONNECTION_ERRORS, DATA_ERRORS

log = logging.getLogger("roost.controller.tasks_api")
T = TypeVar("T")

MAX_BODY = 1 << 20
MAX_DEPTH = 100
"""How deep a payload may nest arrays and objects: far past what a task needs, and short
of where a decoder or Postgres's parser runs out of stack."""
_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
r"""How JSON text holds a NUL (it cannot be there raw): ``\u0000`` after an even
number of backslashes; after an odd one, as in ``\\u0000``, it is text."""
TASK_ID = re.compile(r"t-[0-9a-f]{32}")
DB_ERRORS = CONNECTION_ERRORS
_STATUS = {"queued": "queued", "running": "running", "done": "succeeded", "failed": "failed"}


class _Doc(msgspec.Struct, rename="camel", omit_defaults=False):
    pass


class SubmitTask(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    payload: Any
    """Any JSON value; the task function receives it as is."""
    idempotency_key: Annotated[str, msgspec.Meta(min_length=1, max_length=200)] | None = None
    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=100)] = tq.DEFAULT_MAX_ATTEMPTS


class TaskSubmitted(_Doc):
    id: str
    pool: str
    created: bool
    """False: the idempotency key named an existing task, returned here."""


class TaskDoc(_Doc):
    id: str
    pool: str
    status: str
    """queued | running | succeeded | failed"""
    attempts: int
    max_attempts: int
    result: Any
    error: str | None
    idempotency_key: str | None
    created_at: str
    finished_at: str | None


class EnrollRequest(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    token: Annotated[str, msgspec.Meta(max_length=300)]
    instance_id: Annotated[str, msgspec.Meta(max_length=40)]


class WorkerCredentials(_Doc):
    dsn: str


Enroller = Callable[[str, str], Awaitable[str | None]]
"""(enrollment token, instance id) -> the worker DSN, or None when refused."""


class WorkerCounts(_Doc):
    active: int
    draining: int


class PoolDoc(_Doc):
    pool: str
    queued: int
    running: int
    succeeded: int
    failed: int
    replicas: int | None
    """The orchestrator's replica count at the leader's last tick (null before one)."""
    desired: int | None
    """The desired replica count the leader last published (null before one)."""
    desired_valid_until: str | None
    workers: WorkerCounts


class ApiProblem(Exception):
    def __init__(self, status: int, title: str, detail: str = "", *,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail = status, title, detail
        self.headers = headers


def problem(status: int, title: str, detail: str = "", *, instance: str = "",
            headers: dict[str, str] | None = None) -> Response:
    body = msgspec.json.encode(Problem(title=title, status=status, detail=detail,
                                       instance=instance))
    return Response(body, status, headers=headers, media_type="application/problem+json")


_CHALLENGE = {"www-authenticate": 'Bearer realm="roost"'}


async def _grant(db: Any, request: Request) -> apitokens.Grant:
    """The caller's grant, or 401. The token itself is never logged nor echoed."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiProblem(401, "Unauthorized", "send Authorization: Bearer <token>",
                         headers=_CHALLENGE)
    grant = await apitokens.lookup(db, token.strip())
    if grant is None:
        raise ApiProblem(401, "Unauthorized", "the token is unknown or revoked",
                         headers={"www-authenticate":
                                  'Bearer realm="roost", error="invalid_token"'})
    return grant


def _unknown_pool(pool: str) -> ApiProblem:
    return ApiProblem(404, "Unknown pool", f"no pool {pool!r}")


def _unknown_task(task_id: str) -> ApiProblem:
    return ApiProblem(404, "Unknown task", f"no task {task_id}")


def _json(body: msgspec.Struct, status: int = 200,
          headers: dict[str, str] | None = None) -> Response:
    return Response(msgspec.json.encode(body), status, headers=headers,
                    media_type="application/json")


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat()


def _pool_id(request: Request) -> str:
    pool = str(request.path_params["pool"])
    if not POOL_ID.fullmatch(pool):
        raise ApiProblem(400, "Invalid pool id",
                         f"{pool!r} is not a pool id (lower-case letters, digits, '-')")
    return pool


def _task_id(request: Request) -> str:
    raw = str(request.path_params["task_id"])
    if not TASK_ID.fullmatch(raw):
        raise ApiProblem(400, "Invalid task id",
                         f"{raw[:80]!r} is not a task id ('t-' and 32 hex digits)")
    return raw


@contextlib.asynccontextmanager
async def _stopped(deadline: asyncio.Timeout) -> AsyncIterator[None]:
    """Stop ``deadline`` for the block and give it back what it had left after: the
    time a client takes to send its body is not the database's."""
    if deadline.expired() or (when := deadline.when()) is None:
        yield
        return
    loop = asyncio.get_running_loop()
    left = when - loop.time()
    deadline.reschedule(None)
    try:
        yield
    finally:
        deadline.reschedule(loop.time() + left)


async def _body(request: Request, kind: type[T], *, timeout: float) -> T:
    """The request's JSON as ``kind``. The body is read within ``timeout`` of its own (a
    client slow to send it gets a 408), off the clock of the database's work."""
    ctype = request.headers.get("content-type", "application/json").split(";")[0]
    ctype = ctype.strip().lower()  # media types are case-insensitive (RFC 9110 8.3.1)
    if ctype != "application/json" and not ctype.endswith("+json"):
        raise ApiProblem(415, "Unsupported media type", f"send application/json, not {ctype}")
    raw = b""
    try:
        async with _stopped(request.state.deadline), asyncio.timeout(timeout):
            async for chunk in request.stream():
                raw += chunk
                if len(raw) > MAX_BODY:
                    raise ApiProblem(413, "Request too large",
                                     f"the body is over {MAX_BODY} bytes")
    except TimeoutError:
        raise ApiProblem(408, "Request timeout",
                         f"the body did not arrive within {timeout:g} s",
                         headers={"connection": "close"}) from None
    try:
        body = msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as exc:
        raise ApiProblem(400, "Invalid task" if kind is SubmitTask else "Invalid request",
                         str(exc)) from None
    except msgspec.DecodeError as exc:
        raise ApiProblem(400, "Invalid JSON", str(exc)) from None
    except RecursionError:
        raise ApiProblem(400, "Invalid JSON", _too_deep()) from None
    if _NUL.search(raw):
        raise ApiProblem(400, "Invalid task" if kind is SubmitTask else "Invalid request",
                         "the body holds a NUL character (\\u0000) in a string or key: "
                         "Postgres text and jsonb cannot store it")
    if isinstance(body, SubmitTask) and _nests_deeper(body.payload, MAX_DEPTH):
        raise ApiProblem(400, "Invalid JSON", _too_deep())
    return body


def _too_deep() -> str:
    return f"the payload nests arrays and objects more than {MAX_DEPTH} deep"


_NESTS = frozenset({list, dict}).__contains__


def _nests_deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` nests arrays and objects more than ``limit`` deep. Level by
    level, each node's nested members picked out in C: the walk costs about what
    decoding the body did (a 1 MiB body of numbers: ~15 ms), not a Python step per
    member."""
    level = [value] if _NESTS(type(value)) else []
    for _ in range(limit):
        nested: list[Any] = []
        for node in level:
            members = node.values() if type(node) is dict else node
            nested.extend(compress(members, map(_NESTS, map(type, members))))
        if not nested:
            return False
        level = nested
    return bool(level)


def _task_doc(t: tq.Task) -> TaskDoc:
    return TaskDoc(t.public_id, t.pool_id, _STATUS[t.status], t.attempts, t.max_attempts,
                   t.result, t.error, t.idempotency_key, _iso(t.created_at) or "",
                   _iso(t.finished_at))


Endpoint = Callable[[Request], Awaitable[Response]]


def task_routes(db: Any, *, timeout: float = 10.0,
                enroller: Enroller | None = None) -> list[Route]:
    """The task API's routes over ``db`` (an asyncpg pool), to mount in an app; with
    ``enroller``, also the worker credential exchange."""

    def guarded(fn: Callable[[Request], Awaitable[Response]]) -> Endpoint:
        @functools.wraps(fn)
        async def endpoint(request: Request) -> Response:
            try:
                async with asyncio.timeout(timeout) as deadline:
                    request.state.deadline = deadline  # stopped while the body is read
                    return await fn(request)
            except ApiProblem as exc:
                return problem(exc.status, exc.title, exc.detail, instance=request.url.path,
                               headers=exc.headers)
            except DB_ERRORS as exc:
                log.warning("database error serving %s: %s", request.url.path, exc)
                return problem(503, "Database unavailable",
                               f"{type(exc).__name__}; retry later", instance=request.url.path)
            except Exception:
                error_id = uuid.uuid4().hex[:12]
                log.exception("error %s serving %s", error_id, request.url.path)
                return problem(500, "Internal error", f"logged as error {error_id}",
                               instance=request.url.path)

        return endpoint

    @guarded
    async def submit(request: Request) -> Response:
        grant = await _grant(db, request)
        pool = _pool_id(request)
        if not grant.reaches(pool):
            raise _unknown_pool(pool)
        body = await _body(request, SubmitTask, timeout=timeout)
        try:
            s = await tq.submit(db, pool, body.payload, idempotency_key=body.idempotency_key,
                                max_attempts=body.max_attempts)
        except PoolNotFound:
            raise _unknown_pool(pool) from None
        except tq.IdempotencyConflict as exc:
            raise ApiProblem(409, "Idempotency key reused", str(exc)) from None
        except DATA_ERRORS as exc:  # a value _body let through that Postgres refuses
            raise ApiProblem(400, "Invalid task",
                             f"Postgres cannot store it: {exc}") from None
        except ValueError as exc:  # NaN/Infinity decoded from the body are not JSON
            raise ApiProblem(400, "Invalid task", str(exc)) from None
        location = f"/api/v1/tasks/{s.public_id}"
        return _json(TaskSubmitted(s.public_id, pool, s.created), 201 if s.created else 200,
                     {"location": location})

    @guarded
    async def get_task(request: Request) -> Response:
        grant = await _grant(db, request)
        task_id = _task_id(request)
        try:
            task = await tq.get_task(db, task_id)
        except tq.TaskNotFound:
            raise _unknown_task(task_id) from None
        if not grant.reaches(task.pool_id):
            raise _unknown_task(task_id)  # as if it did not exist: nothing leaks
        return _json(_task_doc(task))

    @guarded
    async def get_pool(request: Request) -> Response:
        grant = await _grant(db, request)
        pool = _pool_id(request)
        if not grant.reaches(pool):
            raise _unknown_pool(pool)
        try:
            p = await tq.pool_summary(db, pool)
        except PoolNotFound:
            raise _unknown_pool(pool) from None
        return _json(PoolDoc(p.pool_id, p.queued, p.running, p.succeeded, p.failed,
                             p.replicas, p.desired, _iso(p.desired_valid_until),
                             WorkerCounts(p.active_workers, p.draining_workers)))

    @guarded
    async def worker_credentials(request: Request) -> Response:
        body = await _body(request, EnrollRequest, timeout=timeout)
        dsn = None if enroller is None else await enroller(body.token, body.instance_id)
        if dsn is None:
            log.warning("worker enrollment refused for instance %r", body.instance_id[:40])
            raise ApiProblem(403, "Enrollment refused")
        return _json(WorkerCredentials(dsn), headers={"cache-control": "no-store"})

    return [
        Route("/api/v1/worker-credentials", worker_credentials, methods=["POST"]),
        Route("/api/v1/pools/{pool}/tasks", submit, methods=["POST"]),
        Route("/api/v1/tasks/{task_id}", get_task, methods=["GET"]),
        Route("/api/v1/pools/{pool}", get_pool, methods=["GET"]),
    ]


def openapi_fragment() -> tuple[dict[str, Any], dict[str, Any]]:
    """(paths, component schemas) of the task API, to merge into an OpenAPI document."""
    (submit_ref, submitted_ref, task_ref, pool_ref, problem_ref, enroll_ref,
     creds_ref), components = (
        msgspec.json.schema_components(
            (SubmitTask, TaskSubmitted, TaskDoc, PoolDoc, Problem, EnrollRequest,
             WorkerCredentials),
            ref_template="#/components/schemas/{name}",
        )
    )

    def ok(ref: dict[str, Any], description: str = "OK") -> dict[str, Any]:
        return {"description": description, "content": {"application/json": {"schema": ref}}}

    def err(description: str) -> dict[str, Any]:
        return {"description": description,
                "content": {"application/problem+json": {"schema": problem_ref}}}

    pool_param = {"name": "pool", "in": "path", "required": True,
                  "schema": {"type": "string", "pattern": POOL_ID.pattern}}
    unavailable = err("The database did not answer; retry later")
    unauthorized = err("No bearer token, or one that is unknown or revoked")
    bearer: list[dict[str, list[str]]] = [{"bearer": []}]
    paths = {
        "/api/v1/worker-credentials": {"post": {
            "summary": "A native pool's worker exchanges its enrollment token (from its "
                       "user data) and instance id for its database DSN, once.",
            "requestBody": {"required": True,
                            "content": {"application/json": {"schema": enroll_ref}}},
            "responses": {"200": ok(creds_ref), "400": err("Invalid JSON or field"),
                          "403": err("Refused: a bad token, an instance that is not a "
                                     "fresh one of the pool, or one that enrolled before"),
                          "408": err("The body did not arrive in time"),
                          "503": unavailable},
        }},
        "/api/v1/pools/{pool}/tasks": {"post": {
            "summary": "Submit a task. With an idempotency key, a repeat returns the "
                       "existing task instead of queueing another.",
            "parameters": [pool_param],
            "security": bearer,
            "requestBody": {"required": True,
                            "content": {"application/json": {"schema": submit_ref}}},
            "responses": {
                "201": ok(submitted_ref, "Queued"),
                "200": ok(submitted_ref, "An existing task with this idempotency key"),
                "400": err("Invalid JSON, pool id or field; a NUL (\\u0000) anywhere, or a "
                           f"payload nested over {MAX_DEPTH} deep: Postgres cannot store "
                           "them"),
                "401": unauthorized,
                "404": err("Unknown pool, or one the token does not reach"),
                "408": err("The body did not arrive in time"),
                "409": err("The idempotency key belongs to a task with another payload"),
                "413": err("Body over 1 MiB"),
                "415": err("Not JSON"),
                "503": unavailable,
            },
        }},
        "/api/v1/tasks/{task_id}": {"get": {
            "summary": "A task: status (queued, running, succeeded, failed), attempts, "
                       "result and last error.",
            "parameters": [{"name": "task_id", "in": "path", "required": True,
                            "schema": {"type": "string", "pattern": TASK_ID.pattern}}],
            "security": bearer,
            "responses": {"200": ok(task_ref), "400": err("Invalid task id"),
                          "401": unauthorized,
                          "404": err("Unknown task, or one of a pool the token does not "
                                     "reach"),
                          "503": unavailable},
        }},
        "/api/v1/pools/{pool}": {"get": {
            "summary": "A pool's task counts, and the replicas and desired count the "
                       "leader last published.",
            "parameters": [pool_param],
            "security": bearer,
            "responses": {"200": ok(pool_ref), "400": err("Invalid pool id"),
                          "401": unauthorized,
                          "404": err("Unknown pool, or one the token does not reach"),
                          "503": unavailable},
        }},
    }
    return paths, components


def build_app(db: Any) -> Starlette:
    """The task API on its own (tests, embedding). The controller mounts `task_routes`
    in its own app instead, next to /status."""

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        titles = {404: "Not found", 405: "Method not allowed"}
        return problem(exc.status_code, titles.get(exc.status_code, "HTTP error"),
                       f"{request.method} {request.url.path}: {exc.detail}",
                       instance=request.url.path)

    return Starlette(routes=task_routes(db), exception_handlers={HTTPException: http_error})
