"""The task API mounted in the controller's own app: a task submitted through a running
controller (real port, real Postgres) reads back, and /openapi.json describes the task
paths next to /status."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from roost.controller.config import ControllerConfig
from roost.controller.service import serve
from roost.embedded.proc import free_port
from roost.store import apitokens
from roost.store import pools as pools_q
from tests.integration.test_controller_helpers import open_db, pool_spec

TASK_PATHS = {"/api/v1/pools/{pool}/tasks", "/api/v1/tasks/{task_id}", "/api/v1/pools/{pool}"}


@pytest.fixture
async def controller_url(pg_dsn: str) -> AsyncIterator[str]:
    port = free_port()
    config = ControllerConfig(dsn=pg_dsn, interval=0.2, http_port=port, fake=True,
                              holder="tasks-mount").validate()
    stop, started = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve(config, stop=stop, started=started))
    try:
        await asyncio.wait_for(started.wait(), 10)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


@pytest.fixture
async def db(pg_dsn: str, controller_url: str) -> AsyncIterator[Any]:
    pool = await open_db(pg_dsn)
    await pools_q.create_pool(pool, pool_spec("p"))
    try:
        yield pool
    finally:
        await pool.close()


async def test_a_task_posted_to_the_controller_reads_back(controller_url: str,
                                                          db: Any) -> None:
    token = await apitokens.create(db, "p-submitter", "p")
    async with httpx.AsyncClient(base_url=controller_url) as anonymous:
        r = await anonymous.post("/api/v1/pools/p/tasks", json={"payload": 1})
        assert (r.status_code, r.headers["www-authenticate"]) == (401, 'Bearer realm="roost"')
    async with httpx.AsyncClient(base_url=controller_url,
                                 headers={"authorization": f"Bearer {token}"}) as http:
        r = await http.post("/api/v1/pools/p/tasks",
                            json={"payload": {"n": 1}, "idempotencyKey": "k-1"})
        assert r.status_code == 201, r.text
        task_id = r.json()["id"]
        assert r.headers["location"] == f"/api/v1/tasks/{task_id}"
        again = await http.post("/api/v1/pools/p/tasks",
                                json={"payload": {"n": 1}, "idempotencyKey": "k-1"})
        assert (again.status_code, again.json()["id"]) == (200, task_id)
        doc = (await http.get(f"/api/v1/tasks/{task_id}")).json()
        assert (doc["id"], doc["pool"], doc["status"], doc["attempts"]) == (
            task_id, "p", "queued", 0)
        pool = (await http.get("/api/v1/pools/p")).json()
        assert (pool["pool"], pool["queued"]) == ("p", 1)
        # The controller's own routes and its problem details are still there.
        assert (await http.get("/healthz")).status_code == 200
        r = await http.post("/api/v1/pools/ghost/tasks", json={"payload": 1})
        assert r.status_code == 404
        assert r.headers["content-type"] == "application/problem+json"
        r = await http.get("/api/v1/tasks/not-an-id")
        assert r.status_code == 400 and "Traceback" not in r.text


async def test_openapi_lists_the_task_paths(controller_url: str) -> None:
    async with httpx.AsyncClient(base_url=controller_url) as http:
        doc = (await http.get("/openapi.json")).json()
    assert TASK_PATHS | {"/status", "/healthz"} <= set(doc["paths"])
    assert {"SubmitTask", "TaskDoc", "PoolDoc", "StatusDoc", "Problem"} <= set(
        doc["components"]["schemas"])
    post = doc["paths"]["/api/v1/pools/{pool}/tasks"]["post"]
    ref = post["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert ref == "#/components/schemas/SubmitTask"
