"""The growth bound, the demand model's inputs and batched drain-safe scale-down, through
the real reconcile loop: real Postgres, the fake orchestrator, a fake clock."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import msgspec
import pytest

from roost.controller.clock import SystemClock
from roost.controller.status import status_doc
from roost.store import notify
from roost.store import pools as pools_q
from tests.integration.test_controller_helpers import (
    BIG_NODE,
    Rig,
    enqueue,
    open_db,
    pool_spec,
    worker_rows,
)
from tests.polling import until


@pytest.fixture
async def rig(pg_dsn: str) -> AsyncIterator[Rig]:
    r = Rig(pg_dsn, await open_db(pg_dsn))
    try:
        yield r
    finally:
        await r.close()


def scale_calls(rig: Rig) -> list[tuple[str, str, object]]:
    return [c for c in rig.fake.calls if c[0] != "pool_state"]


def start_up(rig: Rig, born: dict[str, float], now: float, seconds: float) -> None:
    """Each replica of pool "p" turns ready ``seconds`` after ``now`` first saw it
    (``born`` keeps when)."""
    for ref in rig.fake.instances("p"):
        born.setdefault(ref, now)
        if now - born[ref] >= seconds:
            rig.fake.set_ready("p", ref)


async def test_a_burst_grows_the_pool_no_faster_than_the_bound(rig: Rig) -> None:
    """500 tasks land at once on 2 replicas that take 30 s to start: the old rule asked
    for 500 replicas at once; the bound allows max(4, 100 %) more per 15 s, a rate
    (the 10 s tick after the first step grows by two thirds of a period's worth)."""
    c = rig.controller(scale_up_window=0)
    spec = pool_spec(max_replicas=1000, growth_replicas=4, growth_percent=100)
    await pools_q.create_pool(rig.db, spec)
    rig.fake.add_pool("p", replicas=2, nodes=[BIG_NODE], ready_on_start=False)
    for ref in rig.fake.instances("p"):
        rig.fake.set_ready("p", ref)
    await enqueue(rig.db, "p", 500)
    seen: list[tuple[float, int]] = []  # (time, replicas asked for) after each tick
    born: dict[str, float] = {}
    for _ in range(8):
        start_up(rig, born, rig.clock.time() + 10, 30)  # ready 30 s after it was asked
        res = await rig.tick(c)
        assert res.error is None
        seen.append((rig.clock.time(), len(rig.fake.instances("p"))))
    sizes = [n for _, n in seen]
    assert sizes[0] == 6  # 2 + max(4, 100 % of 2), a whole period's worth: not 500
    t0 = seen[0][0]
    for t, n in seen:
        # then no faster than the rate: 100 % (or 4 replicas, if more) per 15 s
        periods = (t - t0) / 15
        assert n <= max(6 + 4 * periods, 6 * 2 ** periods) + 1e-9, sizes
    assert sizes == sorted(sizes) and sizes[1] > 6 and sizes[-1] < 500
    plan = c.last_plan
    assert plan is not None and "growth bound" in plan.pool("p").reason


async def test_the_model_reads_rates_from_postgres_and_shows_its_steps(rig: Rig) -> None:
    c = rig.controller(scale_up_window=0)
    await rig.add_pool(replicas=2, growth_replicas=1000)
    await rig.db.execute(
        "INSERT INTO tasks (pool_id, status, started_at, finished_at) "
        "SELECT 'p', 'done', now() - interval '2 s', now() FROM generate_series(1, 30)")
    await enqueue(rig.db, "p", 3, status="running")
    await rig.tick(c)
    doc = msgspec.to_builtins(status_doc(c))
    text = "\n".join(doc["plan"]["pools"]["p"]["sizing"])
    # 33 tasks created within the 30 s window, 30 of them done in 2 s each, all created
    # within one or two 5 s buckets: the busiest holds at least 30 (2 s tasks read the
    # peak at its 5 s grain)
    assert "arrivals 1.1/s over 30s (busiest 5s: 6" in text, text
    assert ", service 2s" in text, text
    # 3 running where 1.1/s x 2 s predicts 2.2: within the noise, read by their variances
    assert "in service: running 3 is within 2 sd of arrivals x service = 2.2" in text, text
    assert "size for ceil(min(queued + in service, carried + backlog)) = 3 tasks" in text, text
    # the reads before this leadership are the task table's: a read every 10 s over
    # 1,200 s, all empty (no task is older than a few seconds), then this tick's own
    assert "reads from before this leadership: the task table's, read back over 1200s" \
        in text, text
    assert "headroom: burst rates (most arrivals within one service time, read at 5s) " \
        "over 600s: mean 0.11/s" in text, text  # 6.6/s in one read of 60


async def test_a_new_leader_reads_the_arrivals_before_it_from_the_task_table(
        rig: Rig) -> None:
    """A failover in the middle of a rise: the new leader's first tick reads the rise
    that began before it (a read needs three start-ups of history), from the tasks'
    creation times."""
    await rig.add_pool(replicas=2, growth_replicas=1000)
    # 1/s rising to 100/s over the last 300 s, evenly spaced, each task done 0.5 s after
    # it was created (or now)
    await rig.db.execute("""
        INSERT INTO tasks (pool_id, status, created_at, started_at, finished_at)
        SELECT 'p', 'done', now() - make_interval(secs => a), now() - make_interval(secs => a),
               now() - make_interval(secs => greatest(0, a - 0.5))
        FROM (SELECT s + (i + 0.5) / n AS a
              FROM generate_series(0, 299) AS s,
                   LATERAL (SELECT round(1 + 99 * (1 - s / 300.0))::int AS n) AS r,
                   LATERAL generate_series(0, n - 1) AS i) AS x""")

    def sizing(c: object) -> str:
        doc = msgspec.to_builtins(status_doc(c))  # type: ignore[arg-type]
        return "\n".join(doc["plan"]["pools"]["p"]["sizing"])

    a = rig.controller(scale_up_window=0)
    assert (await rig.tick(a)).leader
    await a.leadership.close()
    b = rig.controller(scale_up_window=0)
    res = await rig.tick(b)
    assert res.leader and res.error is None and b.last_plan is not None
    text = sizing(b)
    assert "reads from before this leadership: the task table's" in text, text
    assert "a sustained rise: the rate read at least 30s apart" in text, text
    est = b.last_plan.pool("p").history.estimates
    assert len(est.arrivals) > 4 and est.read_back_at is not None
    assert b.last_plan.pool("p").history.samples[:-1] == ()  # the windows start afresh


async def test_scale_down_drains_k_workers_then_removes_them_at_once(rig: Rig) -> None:
    c = rig.controller(scale_down_window=0)
    await rig.add_pool(replicas=6, disruption_replicas=3, disruption_percent=0)
    refs = rig.fake.instances("p")
    busy = refs[0]
    rig.running = {busy: 2}  # the busiest is drained last
    await rig.tick(c)  # the plan wants 2 replicas (2 running tasks): drain 3 (the budget)
    rows = await worker_rows(rig.db, "p")
    draining = sorted(w for w, r in rows.items() if r["status"] == "draining")
    assert len(draining) == 3 and busy not in draining
    assert scale_calls(rig) == []

    await rig.tick(c)  # all three report empty after the mark: one removal for the three
    calls = scale_calls(rig)
    assert sorted(calls[:3]) == [("set_instance_termination_priority", "p", (w, -1000))
                                 for w in draining]
    assert calls[3:] == [("scale_pool", "p", 3)]
    left = rig.fake.instances("p")
    assert sorted(left) == sorted(set(refs) - set(draining))  # only drained ones went
    rows = await worker_rows(rig.db, "p")
    assert all(rows[w]["status"] == "gone" and rows[w]["removal_target"] == 3
               for w in draining)
    assert c.last_plan is not None and "budget spent" in c.last_plan.pool("p").reason


async def test_a_pools_own_scale_down_window_from_postgres_holds_it(rig: Rig) -> None:
    """The window an operator set on the pool row (`roost pools update
    --scale-down-window`) is the one the real loop waits, not the controller's."""
    c = rig.controller(scale_down_window=0)  # the controller's own: at once
    await rig.add_pool(replicas=4, disruption_replicas=4, scale_down_window=40)
    held_ticks = 0
    for _ in range(6):  # idle: the plan wants 0 of 4
        await rig.tick(c)
        assert c.last_plan is not None
        reason = c.last_plan.pool("p").reason
        if "not yet held for 40s" not in reason:
            break
        held_ticks += 1
    assert held_ticks >= 3, reason  # 40 s of ticks 10 s apart, not the controller's 0 s
    assert reason.startswith("demand below 4 for 40s"), reason
    assert c.last_plan.pool("p").desired_replicas == 0
    # unset, a pool waits the controller's window (0 s here): the first idle tick
    other = await rig.add_pool("q", replicas=2, disruption_replicas=2)
    assert other.scale_down_window is None
    await rig.tick(c)
    assert c.last_plan is not None
    assert c.last_plan.pool("q").reason.startswith("demand below 2 for 0s"), \
        c.last_plan.pool("q").reason


async def test_tasks_for_an_idle_pool_wake_the_controller_at_once(pg_dsn: str) -> None:
    """Scale-from-zero: a 30 s tick interval, and the first task of an idle pool is
    acted on within a second or two (the NOTIFY on insert ends the wait)."""
    rig = Rig(pg_dsn, await open_db(pg_dsn), clock=SystemClock())  # type: ignore[arg-type]
    stop = asyncio.Event()
    try:
        c = rig.controller(interval=30)  # the default 30 s up-window: zero skips it
        await rig.add_pool(replicas=0)
        listener = await notify.listen_tasks(pg_dsn, c.task_created)
        assert listener is not None
        run = asyncio.create_task(c.run(stop))
        # the first tick: leader, the pool idle
        await until("the first tick plans", lambda: c.last_plan is not None, interval=0.05)
        assert c.last_plan is not None and c.last_plan.pool("p").current_replicas == 0
        submitted = time.monotonic()
        await enqueue(rig.db, "p", 1)
        # the fake records calls in a list, with no event to wait on
        while not scale_calls(rig) and time.monotonic() - submitted < 10:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        woke = time.monotonic() - submitted
        assert scale_calls(rig) == [("scale_pool", "p", 1)]
        assert woke < 5, woke  # not the 30 s interval
        print(f"wake: first task submitted -> scale_pool(1) in {woke:.3f}s")
        stop.set()
        await run
        await listener.close()
    finally:
        stop.set()
        await rig.close()


async def test_a_new_leader_starts_from_the_start_up_the_last_one_measured(rig: Rig) -> None:
    """A leader measures a pool's 40 s start-up as it grows and publishes it with the
    plan; the next leadership sizes on it from its first tick (its windows it observes
    afresh), and a pool whose release changed since has it measured again."""
    a = rig.controller(scale_up_window=0)
    spec = await pools_q.create_pool(rig.db, pool_spec(max_replicas=50))
    rig.fake.add_pool("p", replicas=1, nodes=[BIG_NODE], ready_on_start=False)
    for ref in rig.fake.instances("p"):
        rig.fake.set_ready("p", ref)
    await rig.db.execute(  # the model needs a service time: completed tasks give it
        "INSERT INTO tasks (pool_id, status, started_at, finished_at) "
        "SELECT 'p', 'done', now() - interval '2 s', now() FROM generate_series(1, 30)")
    await enqueue(rig.db, "p", 200)
    born: dict[str, float] = {}
    for _ in range(12):
        start_up(rig, born, rig.clock.time() + 10, 40)  # ready 40 s after first seen
        assert (await rig.tick(a)).error is None
        assert a.last_plan is not None
        if a.last_plan.pool("p").history.estimates.startup is not None:
            break
    measured = a.last_plan.pool("p").history.estimates.startup
    assert measured is not None and 30 <= measured <= 50, measured
    row = await rig.db.fetchrow("SELECT startup_seconds, startup_revision "
                                "FROM desired_capacity WHERE pool_id = 'p'")
    assert row["startup_seconds"] == pytest.approx(measured)
    assert row["startup_revision"] == spec.expected_revision

    def startup_line(c: object) -> str:
        doc = msgspec.to_builtins(status_doc(c))  # type: ignore[arg-type]
        return next(x for x in doc["plan"]["pools"]["p"]["sizing"] if "start-up" in x)

    # a new leadership: no window carried over, the start-up remembered
    await a.leadership.close()
    b = rig.controller(scale_up_window=0)
    res = await rig.tick(b)
    assert res.leader and res.error is None and b.last_plan is not None
    est = b.last_plan.pool("p").history.estimates
    assert est.startup == pytest.approx(measured) and est.startup_remembered
    assert b.last_plan.pool("p").history.samples[:-1] == ()  # the windows start afresh
    assert f"start-up {measured:.3g}s (remembered from the previous leadership)" \
        in startup_line(b), startup_line(b)

    # the estimate was published for another release: the next leader measures again
    await rig.db.execute("UPDATE desired_capacity SET startup_revision = 'an older one'")
    await b.leadership.close()
    c = rig.controller(scale_up_window=0)
    assert (await rig.tick(c)).leader and c.last_plan is not None
    assert c.last_plan.pool("p").history.estimates.startup is None
    assert "start-up 30s (default)" in startup_line(c), startup_line(c)


async def test_the_leader_deletes_tasks_finished_past_their_retention(rig: Rig) -> None:
    """Finished tasks are kept for task_retention, then the leader deletes them, once a
    minute; a queued or running task is never deleted, however old."""
    await rig.add_pool(replicas=1)
    rows = (("done", "3 hours", "2 hours"), ("failed", "3 hours", "2 hours"),
            ("done", "20 minutes", "10 minutes"), ("queued", "3 hours", None),
            ("running", "3 hours", None))
    for status, created, finished in rows:
        await rig.db.execute(
            "INSERT INTO tasks (pool_id, status, created_at, started_at, finished_at) "
            "VALUES ('p', $1, now() - $2::text::interval, now() - $2::text::interval, "
            "now() - $3::text::interval)", status, created, finished)

    async def left() -> list[str]:
        return sorted(r["status"] for r in await rig.db.fetch("SELECT status FROM tasks"))

    for kept in (rig.controller(task_retention=0),  # keeps every task
                 rig.controller(task_retention=3600, shadow=True)):  # a dry run
        res = await rig.tick(kept)
        assert res.error is None and res.leader
        assert len(await left()) == 5
        await kept.leadership.close()
    c = rig.controller(task_retention=3600)
    assert (await rig.tick(c)).error is None
    assert await left() == ["done", "queued", "running"]
    assert c.metrics.pruned._value.get() == 2
    await rig.db.execute(  # another one past it: deleted a minute after the last time
        "INSERT INTO tasks (pool_id, status, created_at, finished_at) "
        "VALUES ('p', 'done', now() - interval '3 hours', now() - interval '2 hours')")
    await rig.tick(c, advance=30)
    assert len(await left()) == 4
    await rig.tick(c, advance=30)
    assert await left() == ["done", "queued", "running"]
    for bad in ({"task_retention": 60}, {"task_retention": float("inf")},
                # a new leader reads back two headroom windows: 14,430 s
                {"task_retention": 3600, "headroom_window": 7200}):
        with pytest.raises(ValueError, match="task_retention must be 0"):
            rig.controller(**bad)
    assert rig.controller(task_retention=14430, headroom_window=7200).config


async def test_retention_deletes_a_batch_per_pool_a_statement_until_none_is_full(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backlog (the whole history, when retention is first set) goes a batch of one
    pool a statement, so that no statement grows with the pools, pass after pass while
    a pool's batch was full; none starts past the budget."""
    from roost.controller import loop

    monkeypatch.setattr(loop, "PRUNE_BATCH", 4)
    for p, n in (("p", 10), ("q", 3), ("r", 0)):
        await rig.add_pool(p)
        await rig.db.execute(
            "INSERT INTO tasks (pool_id, status, created_at, finished_at) SELECT $1, "
            "'done', now() - interval '3 hours', now() - interval '2 hours' "
            "FROM generate_series(1, $2)", p, n)
    calls: list[str] = []
    prune = loop.runtime.prune_finished

    async def counted(conn: object, pool: str, *args: object, **kw: object) -> int:
        calls.append(pool)
        return await prune(conn, pool, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(loop.runtime, "prune_finished", counted)
    monkeypatch.setattr(loop, "PRUNE_BUDGET", 0.0)  # spent before the first statement
    c = rig.controller(task_retention=3600)
    await rig.tick(c)
    assert calls == [] and await rig.db.fetchval("SELECT count(*) FROM tasks") == 13
    monkeypatch.setattr(loop, "PRUNE_BUDGET", 60.0)
    await rig.tick(c, advance=60)
    assert sorted(calls) == ["p", "p", "p", "q", "r"]  # 4 + 4 + 2 of p's; q's 3; r none
    assert await rig.db.fetchval("SELECT count(*) FROM tasks") == 0
