"""The controller's store on real Postgres: migrations, the queue view, pool validation,
and the guards in every fenced write."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import asyncpg
import pytest

from roost.store import fenced, lease, runtime
from roost.store import pools as pools_q
from roost.store.errors import InvalidPool, PoolNotFound, StaleEpoch
from roost.store.migrations import Migration, MigrationError, discover, migrate
from tests.integration.test_controller_helpers import add_worker, enqueue, open_db, pool_spec


@pytest.fixture
async def db(pg_dsn: str) -> AsyncIterator[Any]:
    pool = await open_db(pg_dsn)
    try:
        yield pool
    finally:
        await pool.close()


async def test_concurrent_migrations_apply_each_version_once(pg_dsn: str) -> None:
    conns = [await asyncpg.connect(pg_dsn) for _ in range(3)]
    try:
        done = await asyncio.gather(*(migrate(c) for c in conns))
        assert sum(len(d) for d in done) == len(discover())  # each applied by one
        versions = await conns[0].fetch("SELECT version FROM roost_schema_migrations")
        assert sorted(r["version"] for r in versions) == [m.version for m in discover()]
        assert await migrate(conns[0]) == []
    finally:
        for c in conns:
            await c.close()


async def test_an_edited_migration_is_refused(db: Any) -> None:
    first = discover()[0]
    async with db.acquire() as conn:
        with pytest.raises(MigrationError, match="changed after it was applied"):
            await migrate(conn, [Migration(first.version, first.name, first.sql + "\n-- x")])


async def test_the_queue_view_counts_queued_and_running_per_pool(db: Any) -> None:
    for pid in ("a", "b", "idle"):
        await pools_q.create_pool(db, pool_spec(pid))
    await enqueue(db, "a", 3)
    await enqueue(db, "a", 2, status="running")
    await enqueue(db, "a", 4, status="done")
    await enqueue(db, "b", 1, status="running")
    demand = await runtime.read_demand(db)
    assert {k: (v.queued, v.running) for k, v in demand.items()} == {
        "a": (3, 2), "b": (0, 1), "idle": (0, 0)}


async def test_rates_read_the_busiest_five_seconds_since_the_previous_read(db: Any) -> None:
    await pools_q.create_pool(db, pool_spec("a"))
    for n, ago in ((20, 20.0), (12, 3.0)):  # a burst 20 s ago, a smaller one just now
        await db.execute(
            "INSERT INTO tasks (pool_id, status, created_at) SELECT 'a', 'queued', "
            "now() - make_interval(secs => $2) FROM generate_series(1, $1)", n, ago)
    recent = await runtime.read_rates(db, 30.0, grain=5.0, span=10.0)
    assert recent["a"] == (32 / 30, None, 0, 12 / 5)
    whole = await runtime.read_rates(db, 30.0, grain=5.0, span=30.0)
    assert whole["a"][3] == 20 / 5


async def test_rates_read_the_mean_run_time_and_how_many_completed(db: Any) -> None:
    """The service time is the mean of the tasks done within the window, and the count
    says how many it is the mean of (failed tasks and ones done before the window are
    not in it)."""
    await pools_q.create_pool(db, pool_spec("a"))
    for status, ran, ended in (("done", 2.0, 10.0), ("done", 4.0, 12.0), ("done", 9.0, 5.0),
                               ("failed", 1.0, 5.0), ("done", 50.0, 40.0)):
        await db.execute(
            "INSERT INTO tasks (pool_id, status, created_at, started_at, finished_at) "
            "VALUES ('a', $1, now() - make_interval(secs => $2::float8 + $3 + 100), "
            "now() - make_interval(secs => $2::float8 + $3), "
            "now() - make_interval(secs => $3::float8))",
            status, ran, ended)
    # a task marked done without a start has no run time: in neither the mean nor the count
    await db.execute("INSERT INTO tasks (pool_id, status, created_at, finished_at) VALUES "
                     "('a', 'done', now() - interval '200 seconds', now() - interval '3 seconds')")
    rate, service, completed, _ = (await runtime.read_rates(db, 30.0, grain=5.0, span=30.0))["a"]
    assert (rate, completed) == (0.0, 3)
    assert service == pytest.approx(5.0)


async def test_past_tasks_are_counted_by_age_in_buckets(db: Any) -> None:
    """A new leader's read of the tasks before it (`runtime.read_past`): created and
    completed by age, per pool, failed and unstarted ones not completed."""
    for p in ("a", "b"):
        await pools_q.create_pool(db, pool_spec(p))
    for pool, n, ago, status in (("a", 3, 2.0, "done"), ("a", 4, 12.0, "failed"),
                                 ("b", 5, 27.0, "done"), ("b", 1, 400.0, "done")):
        await db.execute(
            "INSERT INTO tasks (pool_id, status, created_at, started_at, finished_at) "
            "SELECT $1, $2, now() - make_interval(secs => $3::float8 + 1), "
            "now() - make_interval(secs => $3::float8 + 1), "
            "now() - make_interval(secs => $3::float8) FROM generate_series(1, $4)",
            pool, status, ago, n)
    past = await runtime.read_past(db, 30.0, grain=5.0)
    a, b = past["a"], past["b"]
    assert (a.grain, a.span, len(a.created)) == (5.0, 30.0, 6)
    assert a.created == (3, 0, 4, 0, 0, 0)  # created 3 s and 13 s ago
    assert a.completed == (3, 0, 0, 0, 0, 0) and a.ran == pytest.approx((3.0, 0, 0, 0, 0, 0))
    assert b.created == b.completed == (0, 0, 0, 0, 0, 5)  # 28 and 27 s ago; not 400 s


async def test_every_read_of_the_tasks_is_an_index_range_per_pool(db: Any) -> None:
    """The rate, peak and read-back queries range over (pool_id, time) indexes with the
    pool fixed. A range on the time alone cannot use them before Postgres 18's skip
    scan, and finished tasks are kept: on Postgres 15 every tick scanned the table."""
    for p in ("a", "b"):
        await pools_q.create_pool(db, pool_spec(p))
    async with db.acquire() as conn:
        await conn.execute("SET enable_seqscan = off")  # the shape, not the cost choice
        for sql, args in ((runtime._RATES, (30.0,)), (runtime._PEAKS, (10.0, 5.0)),
                          (runtime._PAST, (1230.0, 5.0))):
            plan = [r[0] for r in await conn.fetch("EXPLAIN " + sql, *args)]
            scans = [i for i, line in enumerate(plan) if " on tasks " in line]
            assert scans and not any("Seq Scan on tasks" in plan[i] for i in scans), plan
            for i in scans:
                cond = next(line for line in plan[i + 1:] if "Cond:" in line)
                assert re.search(r"\(pool_id = p(_\d+)?\.id\)", cond), plan


async def test_pool_validation_and_updates(db: Any) -> None:
    spec = await pools_q.create_pool(db, pool_spec("web"))
    with pytest.raises(InvalidPool):
        await pools_q.create_pool(db, replace(spec, pool_id="Bad_Id"))
    with pytest.raises(InvalidPool):
        await pools_q.create_pool(db, replace(spec, pool_id="x", min_replicas=5, max_replicas=2))
    with pytest.raises(InvalidPool, match="cannot update pool_id"):
        await pools_q.update_pool(db, "web", pool_id="other")
    with pytest.raises(PoolNotFound):
        await pools_q.update_pool(db, "nope", max_replicas=3)
    updated = await pools_q.update_pool(db, "web", max_replicas=3, expected_revision="r9")
    assert await pools_q.get_pool(db, "web") == updated
    assert (updated.max_replicas, updated.expected_revision) == (3, "r9")


async def test_pool_refusals_say_the_rule_not_the_constraint(db: Any) -> None:
    spec = await pools_q.create_pool(db, pool_spec("web"))
    for bad in ("Bad_Name", "-web", "web-", "a" * 64, ""):
        with pytest.raises(InvalidPool, match="must be 1 to 63 lower-case letters, digits"):
            await pools_q.create_pool(db, replace(spec, pool_id=bad))
    assert await pools_q.create_pool(db, replace(spec, pool_id="a" * 63))
    with pytest.raises(InvalidPool, match=r"orchestrator_ref must not contain NUL \(U\+0000\)"):
        await pools_q.update_pool(db, "web", orchestrator_ref="a\x00b")
    assert (await pools_q.get_pool(db, "web")) == spec


async def test_every_integer_column_is_bounded_by_its_int32_range(db: Any) -> None:
    """Each ``integer`` column of worker_pools is checked before the round trip, which
    otherwise fails inside asyncpg ("value out of int32 range")."""
    columns = {r["column_name"] for r in await db.fetch(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_name = 'worker_pools' AND data_type = 'integer'")}
    assert set(pools_q._INTEGER_FLOORS) == columns
    spec = await pools_q.create_pool(db, pool_spec("web"))
    top = pools_q.INT32_MAX
    assert await pools_q.create_pool(db, replace(spec, pool_id="big", max_replicas=top,
                                                 growth_replicas=top))
    for field, words in [
        ("max_replicas", "max_replicas must be within 0..2147483647 (got 2147483648)"),
        ("min_replicas", "need 0 <= min_replicas <= max_replicas"),
        ("target_per_replica", "target_per_replica must be within 1..2147483647"),
        ("worker_cpu_milli", "worker_cpu_milli must be within 1..2147483647"),
        ("worker_mem_mib", "worker_mem_mib must be within 1..2147483647"),
        ("worker_db_pool_size", "worker_db_pool_size must be within 0..2147483647"),
        ("growth_replicas", "growth_replicas must be within 1..2147483647"),
        ("growth_percent", "growth_percent must be within 0..2147483647"),
        ("disruption_replicas", "disruption_replicas must be within 1..2147483647"),
        ("disruption_percent", "disruption_percent must be within 0..100"),
        ("scale_down_window", "scale_down_window must be whole seconds within 0..3600"),
    ]:
        with pytest.raises(InvalidPool) as exc:
            await pools_q.update_pool(db, "web", **{field: top + 1})
        assert words in str(exc.value), (field, exc.value)
        with pytest.raises(InvalidPool):
            await pools_q.create_pool(db, replace(spec, pool_id="new", **{field: top + 1}))
    assert await pools_q.get_pool(db, "web") == spec
    assert [p.pool_id for p in await pools_q.list_pools(db)] == ["big", "web"]


async def test_fenced_writes_guard_worker_state(db: Any) -> None:
    await pools_q.create_pool(db, pool_spec("p"))
    async with db.acquire() as conn:
        epoch = await lease.bump_epoch(conn, "me")
    now = time.time()
    await add_worker(db, "p", "busy", at=now, running=2)
    await add_worker(db, "p", "idle", at=now)
    assert await fenced.mark_draining(db, epoch, "p", "busy", now=now)
    assert not await fenced.mark_draining(db, epoch, "p", "busy", now=now)  # already
    assert not await fenced.commit_removal(db, epoch, "p", "busy", 1)  # still running tasks
    assert not await fenced.commit_removal(db, epoch, "p", "idle", 1)  # not draining
    assert await fenced.mark_draining(db, epoch, "p", "idle", now=now)
    assert await fenced.commit_removal(db, epoch, "p", "idle", 1)
    assert await fenced.commit_removal(db, epoch, "p", "idle", 1)  # idempotent
    assert not await fenced.commit_removal(db, epoch, "p", "idle", 0)  # another count: no
    assert not await fenced.reactivate(db, epoch, "p", "idle")  # committed: never
    assert await fenced.reactivate(db, epoch, "p", "busy")
    assert await fenced.mark_gone(db, epoch, "p", "idle")
    workers = await runtime.read_workers(db)
    assert {w.worker_id: w.status.value for w in workers["p"]} == {"busy": "active"}
    async with db.acquire() as conn:
        await lease.bump_epoch(conn, "someone else")
    with pytest.raises(StaleEpoch):
        await fenced.mark_draining(db, epoch, "p", "busy", now=now)
    assert (await runtime.read_workers(db))["p"][0].status.value == "active"


async def test_database_health_reads_the_server(db: Any) -> None:
    health = await runtime.read_db_health(db, observed_at=1.0)
    assert health.max_connections == 200 and health.reserved_connections >= 3
    assert (health.sync_peers, health.in_recovery) == (0, False)
