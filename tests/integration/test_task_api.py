"""The task HTTP API and its Python client, on real Postgres: submit, idempotency, task
and pool reads, the OpenAPI fragment, and problem details for every bad request."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette

from roost.controller import tasks_api
from roost.embedded.proc import free_port
from roost.store import apitokens, fenced, lease
from roost.worker import Worker
from roost.worker.client import AsyncTasksClient, TaskApiError, TasksClient, submit_task
from tests.integration.worker_helpers import config, open_pool_db, running


@pytest.fixture
async def db(pg_dsn: str) -> AsyncIterator[Any]:
    pool = await open_pool_db(pg_dsn, "p", "other")
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
async def token(db: Any) -> str:
    """An operator token (every pool); the access rules have their own tests."""
    return await apitokens.create(db, "ops", None)


@pytest.fixture
async def http(db: Any, token: str) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=tasks_api.build_app(db))
    async with httpx.AsyncClient(transport=transport, base_url="http://controller",
                                 headers={"authorization": f"Bearer {token}"}) as c:
        yield c


@pytest.fixture
async def client(db: Any, token: str) -> AsyncIterator[AsyncTasksClient]:
    transport = httpx.ASGITransport(app=tasks_api.build_app(db))
    async with AsyncTasksClient("http://controller", token=token, transport=transport) as c:
        yield c


async def test_submit_run_and_read_back(client: AsyncTasksClient, db: Any,
                                        pg_dsn: str) -> None:
    async def double(payload: Any) -> Any:
        return {"twice": payload["n"] * 2}

    sub = await client.submit("p", {"n": 21}, idempotency_key="order-1")
    assert sub.created and sub.pool == "p"
    again = await client.submit("p", {"n": 21}, idempotency_key="order-1")
    assert (again.id, again.created) == (sub.id, False)
    queued = await client.get(sub.id)
    assert (queued.status, queued.attempts, queued.idempotency_key) == ("queued", 0, "order-1")
    pool = await client.pool("p")
    assert (pool.queued, pool.running, pool.succeeded, pool.failed) == (1, 0, 0, 0)
    assert (pool.replicas, pool.desired) == (None, None)  # no leader has published yet

    async with running(Worker(double, config(pg_dsn, worker_id="w1"))):
        done = await client.wait(sub.id, timeout=10, every=0.05)
        assert (await client.pool("p")).active_workers == 1
    assert (done.status, done.attempts, done.result, done.error) == (
        "succeeded", 1, {"twice": 42}, None)
    assert done.finished_at is not None

    # What the leader publishes shows up as replicas and desired.
    async with db.acquire() as conn:
        epoch = await lease.bump_epoch(conn, "test")
    now = time.time()
    await fenced.publish_desired(db, epoch, [fenced.DesiredRow("p", 3, 1, 3, "scale up", None)],
                                 now=now, valid_until=now + 20)
    pool = await client.pool("p")
    assert (pool.succeeded, pool.replicas, pool.desired) == (1, 1, 3)
    assert pool.desired_valid_until is not None


async def test_problem_details_for_bad_requests(http: httpx.AsyncClient, db: Any) -> None:
    first = (await http.post("/api/v1/pools/p/tasks",
                             json={"payload": 1, "idempotencyKey": "k"})).json()["id"]
    cases: list[tuple[str, str, dict[str, Any], int, str]] = [
        ("POST", "/api/v1/pools/p/tasks", {"content": b"{not json"}, 400, "Invalid JSON"),
        ("POST", "/api/v1/pools/p/tasks", {"json": {}}, 400, "Invalid task"),
        ("POST", "/api/v1/pools/p/tasks", {"json": {"payload": 1, "extra": 2}}, 400,
         "Invalid task"),
        ("POST", "/api/v1/pools/p/tasks", {"json": {"payload": 1, "maxAttempts": "3"}}, 400,
         "Invalid task"),
        ("POST", "/api/v1/pools/p/tasks", {"json": {"payload": 1, "maxAttempts": 0}}, 400,
         "Invalid task"),
        ("POST", "/api/v1/pools/p/tasks", {"json": {"payload": 1, "idempotencyKey": ""}}, 400,
         "Invalid task"),
        ("POST", "/api/v1/pools/p/tasks", {"content": b'{"payload": 1e999}'}, 400,
         "Invalid task"),
        ("POST", "/api/v1/pools/p/tasks", {"content": b"payload=1",
         "headers": {"content-type": "application/x-www-form-urlencoded"}}, 415,
         "Unsupported media type"),
        ("POST", "/api/v1/pools/p/tasks", {"json": {"payload": "x" * (1 << 20)}}, 413,
         "Request too large"),
        ("POST", "/api/v1/pools/p/tasks", {"json": {"payload": 2, "idempotencyKey": "k"}}, 409,
         "Idempotency key reused"),
        # Postgres text and jsonb cannot hold U+0000: refused before they get there
        ("POST", "/api/v1/pools/p/tasks", {"content": rb'{"payload": "a\u0000b"}'}, 400,
         "Invalid task"),
        ("POST", "/api/v1/pools/p/tasks", {"content": rb'{"payload": {"k\u0000": 1}}'}, 400,
         "Invalid task"),
        ("POST", "/api/v1/pools/p/tasks",
         {"content": rb'{"payload": 1, "idempotencyKey": "k\u0000"}'}, 400, "Invalid task"),
        ("POST", "/api/v1/pools/p/tasks", {"content": _nested(1000)}, 400, "Invalid JSON"),
        ("POST", "/api/v1/pools/p/tasks", {"content": _nested(tasks_api.MAX_DEPTH + 1)}, 400,
         "Invalid JSON"),
        ("POST", "/api/v1/pools/Bad_Pool/tasks", {"json": {"payload": 1}}, 400,
         "Invalid pool id"),
        ("POST", "/api/v1/pools/ghost/tasks", {"json": {"payload": 1}}, 404, "Unknown pool"),
        ("GET", "/api/v1/pools/ghost", {}, 404, "Unknown pool"),
        ("GET", "/api/v1/tasks/abc", {}, 400, "Invalid task id"),
        ("GET", "/api/v1/tasks/424242", {}, 400, "Invalid task id"),  # ids are not numbers
        ("GET", "/api/v1/tasks/t-" + "0" * 32, {}, 404, "Unknown task"),
        ("DELETE", f"/api/v1/tasks/{first}", {}, 405, "Method not allowed"),
        ("GET", "/api/v1/nothing", {}, 404, "Not found"),
    ]
    for method, path, kw, status, title in cases:
        r = await http.request(method, path, **kw)
        assert r.status_code == status, (path, kw, r.text)
        assert r.headers["content-type"] == "application/problem+json"
        doc = r.json()
        assert (doc["status"], doc["title"]) == (status, title), (path, kw, doc)
    conflict = await http.post("/api/v1/pools/p/tasks", json={"payload": 2, "idempotencyKey": "k"})
    assert f"task {first}" in conflict.json()["detail"]
    assert (await db.fetchval("SELECT count(*) FROM tasks")) == 1  # nothing else got in


def _nested(depth: int, inner: str = "1") -> bytes:
    """A task whose payload nests ``depth`` arrays and objects, alternating."""
    opens = "".join('{"a":' if i % 2 else "[" for i in range(depth))
    closes = "".join("}" if i % 2 else "]" for i in reversed(range(depth)))
    return f'{{"payload": {opens}{inner}{closes}}}'.encode()


async def test_what_postgres_cannot_store_is_a_400_that_says_why(
        http: httpx.AsyncClient, db: Any) -> None:
    for body, words in [
        (rb'{"payload": ["x", {"k": "a\u0000b"}]}', "NUL character (\\u0000)"),
        (rb'{"payload": {"\\\u0000": 1}}', "NUL character (\\u0000)"),
        (rb'{"payload": 1, "idempotencyKey": "\u0000"}', "NUL character (\\u0000)"),
        (_nested(1000), f"nests arrays and objects more than {tasks_api.MAX_DEPTH} deep"),
        (_nested(50_000), f"nests arrays and objects more than {tasks_api.MAX_DEPTH} deep"),
        (_nested(tasks_api.MAX_DEPTH + 1), f"more than {tasks_api.MAX_DEPTH} deep"),
    ]:
        r = await http.post("/api/v1/pools/p/tasks", content=body)
        assert r.status_code == 400 and words in r.json()["detail"], (body[:60], r.text)
    assert (await db.fetchval("SELECT count(*) FROM tasks")) == 0
    # a backslash and "u0000" is text, not a NUL; MAX_DEPTH itself is allowed
    text = await http.post("/api/v1/pools/p/tasks", content=rb'{"payload": "\\u0000"}')
    assert text.status_code == 201, text.text
    deep = await http.post("/api/v1/pools/p/tasks", content=_nested(tasks_api.MAX_DEPTH))
    assert deep.status_code == 201, deep.text
    got = await http.get(text.headers["location"])
    assert got.status_code == 200
    assert await db.fetchval("SELECT payload #>> '{}' FROM tasks ORDER BY id LIMIT 1") == (
        "\\u0000")


async def test_a_value_postgres_refuses_is_a_400_not_a_503(
        http: httpx.AsyncClient, db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The safety net under the request checks: with the NUL check off, Postgres itself
    refuses the NUL (a DataError), and that is still the client's error."""
    monkeypatch.setattr(tasks_api, "_NUL", re.compile(rb"(?!)"))
    for body in (rb'{"payload": "a\u0000b"}', rb'{"payload": 1, "idempotencyKey": "\u0000"}'):
        r = await http.post("/api/v1/pools/p/tasks", content=body)
        assert (r.status_code, r.json()["title"]) == (400, "Invalid task"), r.text
        assert "Postgres cannot store it" in r.json()["detail"], r.text
    assert (await db.fetchval("SELECT count(*) FROM tasks")) == 0


async def test_media_types_are_case_insensitive(http: httpx.AsyncClient) -> None:
    for ctype in ("Application/Json", "APPLICATION/JSON; charset=UTF-8",
                  "application/Problem+JSON"):
        r = await http.post("/api/v1/pools/p/tasks", content=b'{"payload": 1}',
                            headers={"content-type": ctype})
        assert r.status_code == 201, (ctype, r.text)


@contextlib.asynccontextmanager
async def _serving(app: Any) -> AsyncIterator[int]:
    """``app`` on a real uvicorn, on a free port (yielded) until the block ends."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:  # noqa: ASYNC110 (uvicorn offers a flag, not an event)
            await asyncio.sleep(0.01)
        yield port
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await serving


async def _exchange(port: int, token: str, body: bytes, *,
                    stall: float = 0.0) -> tuple[int, dict[str, str], Any]:
    """POST a task over a socket: the first half of ``body``, ``stall`` seconds of
    silence, then the rest. (status, headers, JSON) of the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"POST /api/v1/pools/p/tasks HTTP/1.1\r\nhost: c\r\n"
                     b"authorization: Bearer " + token.encode() + b"\r\n"
                     b"content-type: application/json\r\n"
                     b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
                     + body[:len(body) // 2])
        await writer.drain()
        head = None
        with contextlib.suppress(TimeoutError):  # an answer before the rest is sent
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), stall)
        if head is None:
            writer.write(body[len(body) // 2:])
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        status_line, *lines = head.decode().split("\r\n")
        headers = dict(x.lower().split(": ", 1) for x in lines if x)
        doc = json.loads(await reader.readexactly(int(headers["content-length"])))
        return int(status_line.split()[1]), headers, doc
    finally:
        writer.close()


async def test_a_body_sent_too_slowly_is_a_408_and_the_database_keeps_its_503(
        db: Any, token: str) -> None:
    app = Starlette(routes=tasks_api.task_routes(db, timeout=0.5))
    async with _serving(app) as port:
        # a client that stops halfway: it is the one that is late, not the database
        status, headers, doc = await _exchange(port, token, b'{"payload": 1}', stall=3.0)
        assert (status, doc["title"]) == (408, "Request timeout"), doc
        assert doc["detail"] == "the body did not arrive within 0.5 s"
        assert headers["content-type"] == "application/problem+json"
        assert headers["connection"] == "close"
        # one that finishes in time gets its task
        status, _, doc = await _exchange(port, token, b'{"payload": 2}', stall=0.2)
        assert status == 201, doc
        # a database that does not answer in time is still a 503
        async with db.acquire() as conn, conn.transaction():
            await conn.execute("LOCK TABLE tasks IN ACCESS EXCLUSIVE MODE")
            status, _, doc = await _exchange(port, token, b'{"payload": 3}')
            assert (status, doc["title"]) == (503, "Database unavailable"), doc
            assert "TimeoutError" in doc["detail"]
    assert await db.fetchval("SELECT array_agg(payload::text) FROM tasks") == ["2"]


async def test_an_unreachable_database_is_a_503_problem(pg_dsn: str) -> None:
    db = await open_pool_db(pg_dsn)
    await db.close()  # every query now fails
    transport = httpx.ASGITransport(app=tasks_api.build_app(db))
    async with httpx.AsyncClient(transport=transport, base_url="http://c",
                                 headers={"authorization": "Bearer rpt_any"}) as http:
        for r in (await http.post("/api/v1/pools/p/tasks", json={"payload": 1}),
                  await http.get("/api/v1/tasks/t-" + "1" * 32),
                  await http.get("/api/v1/pools/p")):
            assert r.status_code == 503 and r.json()["title"] == "Database unavailable"
            assert r.headers["content-type"] == "application/problem+json"


async def test_the_sync_client_over_real_http(db: Any, token: str) -> None:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(tasks_api.build_app(db), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:  # noqa: ASYNC110 (uvicorn offers a flag, not an event)
            await asyncio.sleep(0.01)
        url = f"http://127.0.0.1:{port}"

        def use() -> None:
            tid = submit_task(url, "other", [1, 2], token=token, idempotency_key="a")
            with TasksClient(url, token=token) as c:
                assert c.submit("other", [1, 2], idempotency_key="a").id == tid
                assert c.get(tid).status == "queued"
                assert c.pool("other").queued == 1
                with pytest.raises(TaskApiError) as exc:
                    c.get("t-" + "f" * 32)
                assert (exc.value.status, exc.value.title) == (404, "Unknown task")
                with pytest.raises(TimeoutError):
                    c.wait(tid, timeout=0.1, every=0.05)

        await asyncio.to_thread(use)
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await serving


def test_the_openapi_fragment_describes_every_route() -> None:
    paths, components = tasks_api.openapi_fragment()
    assert set(paths) == {"/api/v1/pools/{pool}/tasks", "/api/v1/tasks/{task_id}",
                          "/api/v1/pools/{pool}", "/api/v1/worker-credentials"}
    assert {"SubmitTask", "TaskSubmitted", "TaskDoc", "PoolDoc", "Problem"} <= set(components)
    assert set(components["SubmitTask"]["properties"]) == {
        "payload", "idempotencyKey", "maxAttempts"}
    assert components["SubmitTask"]["required"] == ["payload"]
    refs = {r.rsplit("/", 1)[1] for r in _refs(paths) | _refs(components)}
    assert refs <= set(components)


def _refs(doc: Any) -> set[str]:
    if isinstance(doc, dict):
        own = {doc["$ref"]} if "$ref" in doc else set()
        return own.union(*(_refs(v) for v in doc.values()))
    if isinstance(doc, list):
        return set().union(*(_refs(v) for v in doc))
    return set()
