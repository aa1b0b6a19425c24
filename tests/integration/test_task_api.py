"""The task HTTP API and its Python client, on real Postgres: submit, idempotency, task
and pool reads, the OpenAPI fragment, and problem details for every bad request."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn

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
