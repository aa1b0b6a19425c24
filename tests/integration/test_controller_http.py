"""The controller's HTTP API: readiness semantics, the /status document, metrics, the
OpenAPI document, and problem details for every kind of bad request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from roost.controller.config import ControllerConfig
from roost.controller.http import build_app
from roost.controller.loop import Controller
from roost.controller.service import serve
from roost.embedded.proc import free_port
from tests.integration.test_controller_helpers import Rig, enqueue, open_db, status_when


@pytest.fixture
async def rig(pg_dsn: str) -> AsyncIterator[Rig]:
    r = Rig(pg_dsn, await open_db(pg_dsn))
    try:
        yield r
    finally:
        await r.close()


def client(c: Controller) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(c)),
                             base_url="http://controller")


async def test_readiness_as_leader_follower_and_on_error(rig: Rig) -> None:
    leader, follower = rig.controller(), rig.controller()
    await rig.add_pool(replicas=1)
    async with client(leader) as lc, client(follower) as fc:
        r = await lc.get("/readyz")  # no tick yet
        assert r.status_code == 503
        assert r.headers["content-type"] == "application/problem+json"
        await rig.tick(leader)
        await rig.tick(follower, advance=0)
        r = await lc.get("/readyz")
        assert (r.status_code, r.json()["leader"]) == (200, True)
        r = await fc.get("/readyz")
        assert (r.status_code, r.json()["leader"]) == (200, False)
        assert (await fc.get("/healthz")).status_code == 200
        rig.clock.advance(31)  # the loop stalled for three intervals
        assert (await fc.get("/readyz")).status_code == 503
        await rig.tick(follower, advance=0)
        assert (await fc.get("/readyz")).status_code == 200
        # Postgres unreachable for the follower's leadership connection: an error.
        follower.leadership.dsn = "postgresql://postgres@127.0.0.1:1/none"
        await follower.leadership.step_down("test")
        res = await rig.tick(follower, advance=1)
        assert res.error and "cannot connect" in res.error
        r = await fc.get("/readyz")
        assert r.status_code == 503 and "cannot connect" in r.json()["detail"]


async def test_status_shows_leader_queue_plan_and_actions(rig: Rig) -> None:
    c = rig.controller(scale_up_window=0)
    follower = rig.controller()
    await rig.add_pool(replicas=1)
    await rig.add_pool("other", replicas=2)
    await enqueue(rig.db, "p", 3)
    await rig.tick(c)
    await rig.tick(follower, advance=0)
    async with client(c) as http, client(follower) as fhttp:
        doc = (await http.get("/status")).json()
        assert doc["leader"] is True and doc["epoch"] == 1 and doc["lastError"] is None
        assert doc["lastRunAt"].endswith("+00:00")
        assert doc["queue"]["p"] == {"queued": 3, "running": 0}
        pool = doc["plan"]["pools"]["p"]
        assert (pool["desiredReplicas"], pool["currentReplicas"], pool["frozenReason"]) == (
            3, 1, None)
        assert doc["plan"]["source"] == "leader"
        assert [(a["pool"], a["kind"], a["outcome"], a["replicas"])
                for a in doc["scaleActions"]] == [("p", "scale_up", "ok", 3)]
        only = (await http.get("/status", params={"pool": "other"})).json()
        assert list(only["plan"]["pools"]) == ["other"] and only["scaleActions"] == []
        fdoc = (await fhttp.get("/status")).json()
        assert fdoc["leader"] is False and fdoc["plan"]["source"] == "published"
        assert fdoc["plan"]["pools"]["p"]["desiredReplicas"] == 3


async def test_metrics_and_openapi(rig: Rig) -> None:
    c = rig.controller()
    await rig.add_pool(replicas=2)
    await rig.tick(c)
    async with client(c) as http:
        text = (await http.get("/metrics")).text
        assert "roost_controller_is_leader 1.0" in text
        assert 'roost_controller_pool_replicas{kind="current",pool="p"} 2.0' in text
        assert "roost_controller_tick_seconds_bucket" in text
        doc = (await http.get("/openapi.json")).json()
        assert doc["openapi"].startswith("3.")
        assert set(doc["paths"]) == {"/healthz", "/readyz", "/status", "/metrics",
                                     "/openapi.json", "/api/v1/pools/{pool}/tasks",
                                     "/api/v1/tasks/{task_id}", "/api/v1/pools/{pool}",
                                     "/api/v1/worker-credentials"}
        schema = doc["components"]["schemas"]["StatusDoc"]
        assert {"leader", "epoch", "lastRunAt", "lastError", "queue", "plan",
                "scaleActions"} <= set(schema["properties"])


@pytest.mark.parametrize(
    ("method", "path", "params", "status"),
    [
        ("GET", "/nowhere", {}, 404),
        ("POST", "/status", {}, 405),
        ("GET", "/status", {"pool": "Not A Pool!"}, 400),
        ("GET", "/status", {"pool": "ghost"}, 404),
        ("GET", "/status", {"verbose": "1"}, 400),
    ],
)
async def test_bad_requests_get_problem_details(rig: Rig, method: str, path: str,
                                                params: dict[str, str], status: int) -> None:
    c = rig.controller()
    await rig.add_pool(replicas=1)
    await rig.tick(c)
    async with client(c) as http:
        r = await http.request(method, path, params=params)
    assert r.status_code == status
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["status"] == status and body["title"]
    assert "Traceback" not in r.text


async def test_an_internal_error_is_a_problem_not_a_traceback(rig: Rig) -> None:
    c = rig.controller()
    await rig.tick(c)

    def boom() -> bytes:
        raise RuntimeError("secret internals")

    c.metrics.render = boom  # type: ignore[method-assign]
    async with client(c) as http:
        r = await http.get("/metrics")
    assert r.status_code == 500
    assert r.headers["content-type"] == "application/problem+json"
    assert "secret" not in r.text and "error" in r.json()["detail"]


async def test_serve_migrates_leads_and_answers_status(pg_dsn: str) -> None:
    """`roost controller` end to end: a fresh database, a real HTTP port."""
    port = free_port()
    config = ControllerConfig(dsn=pg_dsn, interval=0.2, http_port=port, fake=True,
                              holder="served").validate()
    stop, started = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve(config, stop=stop, started=started))
    try:
        await asyncio.wait_for(started.wait(), 10)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            doc = await status_when(http, "the controller leads through a whole tick",
                                    lambda d: d["leader"] and d["lastRunAt"], timeout=5)
            assert doc["leader"] and doc["holder"] == "served" and doc["plan"] is not None
            r = await http.get("/readyz")
            assert r.status_code == 200, r.text
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
