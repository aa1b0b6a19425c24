"""Who reaches what through the task API, on real Postgres: bearer tokens per pool or
for every pool (`roost api-tokens`), 401 without one, 404 for what a token does not
reach (exactly as for what does not exist), revocation at once; and the least-privilege
role workers get (`roost db worker-role`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from roost.controller import tasks_api
from roost.controller.cli import api_tokens, db
from roost.store import apitokens, roles
from tests.integration.test_controller_cli import invoke
from tests.integration.worker_helpers import open_pool_db


@pytest.fixture
async def pool_db(pg_dsn: str) -> AsyncIterator[Any]:
    pool = await open_pool_db(pg_dsn, "red", "blue")
    try:
        yield pool
    finally:
        await pool.close()


def _client(pool_db: Any, token: str | None) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=tasks_api.build_app(pool_db)),
                             base_url="http://controller", headers=headers)


def _same_answer(a: httpx.Response, b: httpx.Response, *names: str) -> None:
    """Two answers that differ at most by the names asked for: nothing else leaks."""
    text_a, text_b = a.text, b.text
    for n in names:
        text_a, text_b = text_a.replace(n, "?"), text_b.replace(n, "?")
    def headers(r: httpx.Response) -> dict[str, str]:
        return {k: v for k, v in r.headers.items() if k != "content-length"}

    assert (a.status_code, headers(a), text_a) == (b.status_code, headers(b), text_b)


async def test_no_token_or_a_bad_one_is_a_401_challenge(pool_db: Any) -> None:
    for token in (None, "rpt_not-issued", "x" * 500):
        async with _client(pool_db, token) as http:
            for r in (await http.post("/api/v1/pools/red/tasks", json={"payload": 1}),
                      await http.get("/api/v1/tasks/t-" + "0" * 32),
                      await http.get("/api/v1/pools/red")):
                assert r.status_code == 401, (token, r.text)
                assert r.headers["www-authenticate"].startswith('Bearer realm="roost"')
                assert r.headers["content-type"] == "application/problem+json"
    async with _client(pool_db, None) as http:
        r = await http.get("/api/v1/pools/red", headers={"authorization": "Basic cmVkOnJlZA=="})
        assert r.status_code == 401
    assert await pool_db.fetchval("SELECT count(*) FROM tasks") == 0


async def test_a_pool_token_reaches_its_pool_only_and_learns_nothing_of_others(
        pool_db: Any) -> None:
    red = await apitokens.create(pool_db, "red-producer", "red")
    blue = await apitokens.create(pool_db, "blue-producer", "blue")
    ops = await apitokens.create(pool_db, "ops", None)
    async with _client(pool_db, red) as as_red, _client(pool_db, blue) as as_blue, \
            _client(pool_db, ops) as as_ops:
        made = await as_red.post("/api/v1/pools/red/tasks", json={"payload": {"n": 1}})
        assert made.status_code == 201
        tid = made.json()["id"]
        assert (await as_red.get(f"/api/v1/tasks/{tid}")).json()["id"] == tid
        assert (await as_ops.get(f"/api/v1/tasks/{tid}")).status_code == 200

        # Blue sees red's task, red's pool and a submit to it exactly as missing ones.
        _same_answer(await as_blue.get(f"/api/v1/tasks/{tid}"),
                     await as_blue.get("/api/v1/tasks/t-" + "0" * 32), tid, "t-" + "0" * 32)
        _same_answer(await as_blue.get("/api/v1/pools/red"),
                     await as_blue.get("/api/v1/pools/ghost"), "red", "ghost")
        _same_answer(await as_blue.post("/api/v1/pools/red/tasks", json={"payload": 2}),
                     await as_blue.post("/api/v1/pools/ghost/tasks", json={"payload": 2}),
                     "red", "ghost")
        assert (await as_blue.get("/api/v1/pools/blue")).json()["queued"] == 0
        assert (await as_ops.get("/api/v1/pools/red")).json()["queued"] == 1

        # Task ids are random: the database's sequential ids are not even valid ids.
        internal = await pool_db.fetchval("SELECT id FROM tasks")
        assert (await as_ops.get(f"/api/v1/tasks/{internal}")).status_code == 400
        assert tasks_api.TASK_ID.fullmatch(tid)

        await apitokens.revoke(pool_db, "red-producer")
        assert (await as_red.get(f"/api/v1/tasks/{tid}")).status_code == 401
    assert await pool_db.fetchval("SELECT count(*) FROM tasks") == 1  # blue queued nothing
    assert await pool_db.fetchval(  # only hashes are kept
        "SELECT count(*) FROM api_tokens WHERE token_hash IN ($1, $2)", blue, ops) == 0


async def test_the_cli_makes_lists_and_revokes_tokens(pool_db: Any, pg_dsn: str) -> None:
    env = {"ROOST_DSN": pg_dsn}
    made = await invoke(api_tokens, "create", "ci", "--pool", "red", env=env)
    assert made.exit_code == 0, made.output
    token = made.output.strip()
    assert token.startswith(apitokens.PREFIX)
    assert await apitokens.lookup(pool_db, token) == apitokens.Grant("ci", "red")
    dup = await invoke(api_tokens, "create", "ci", env=env)
    assert dup.exit_code == 1 and "exists already" in dup.output
    ghost = await invoke(api_tokens, "create", "g", "--pool", "ghost", env=env)
    assert ghost.exit_code == 1 and "no worker pool 'ghost'" in ghost.output
    listed = await invoke(api_tokens, "list", "--json", env=env)
    assert token not in listed.output and '"pool_id": "red"' in listed.output
    assert (await invoke(api_tokens, "revoke", "ci", env=env)).exit_code == 0
    assert await apitokens.lookup(pool_db, token) is None
    again = await invoke(api_tokens, "revoke", "ci", env=env)
    assert again.exit_code == 1 and "no API token named 'ci'" in again.output


async def test_the_worker_role_runs_tasks_and_nothing_more(pool_db: Any, pg_dsn: str) -> None:
    made = await invoke(db, "worker-role", "--dsn", pg_dsn)
    assert made.exit_code == 0, made.output
    worker_dsn = made.output.strip()
    assert worker_dsn.startswith(f"postgresql://{roles.WORKER_ROLE}:")
    await pool_db.execute("INSERT INTO tasks (pool_id, payload) VALUES ('red', '1')")
    conn = await asyncpg.connect(worker_dsn)
    try:
        # What a worker does: read its pool, register, claim and settle.
        assert await conn.fetchval("SELECT count(*) FROM worker_pools") == 2
        await conn.execute("INSERT INTO workers (id, pool_id, revision, instance_ref, "
                           "heartbeat_at) VALUES ('w1', 'red', '', '', now())")
        await conn.execute("UPDATE tasks SET status = 'running', worker_id = 'w1'")
        # What it may not: tokens, enrollments, the plan, new or deleted tasks, pools.
        for sql in ("SELECT * FROM api_tokens", "SELECT * FROM worker_enrollments",
                    "SELECT * FROM desired_capacity",
                    "INSERT INTO tasks (pool_id, payload) VALUES ('red', '2')",
                    "DELETE FROM tasks", "UPDATE worker_pools SET max_replicas = 100",
                    "DROP TABLE tasks"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(sql)
    finally:
        await conn.close()
