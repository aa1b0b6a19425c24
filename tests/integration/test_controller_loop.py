"""The reconcile loop against real Postgres, with the fake orchestrator and a fake clock:
windows, drain-safe scale-down, freezes and shadow mode, tick by tick."""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import AsyncIterator

import pytest

from roost.controller.clock import FakeClock
from roost.controller.orchestrator import (
    OrchestratorUnavailable,
    PoolRef,
    PoolState,
    ScaleResult,
)
from tests.integration.test_controller_helpers import (
    Rig,
    enqueue,
    open_db,
    set_tasks,
    worker_rows,
)


@pytest.fixture
async def rig(pg_dsn: str) -> AsyncIterator[Rig]:
    r = Rig(pg_dsn, await open_db(pg_dsn))
    try:
        yield r
    finally:
        await r.close()


def scale_calls(rig: Rig) -> list[tuple[str, str, object]]:
    return [c for c in rig.fake.calls if c[0] != "pool_state"]


async def test_no_scale_up_before_the_window(rig: Rig) -> None:
    c = rig.controller()
    await rig.add_pool(replicas=1)
    await enqueue(rig.db, "p", 5)
    for _ in range(3):  # t = 10, 20, 30 after the first sample at t = 10
        res = await rig.tick()
        assert res.leader and res.error is None
        assert scale_calls(rig) == []
        assert c.last_plan is not None and c.last_plan.pool("p").desired_replicas == 1
    await rig.tick()  # 30 s of observed demand above current
    assert scale_calls(rig) == [("scale_pool", "p", 5)]
    row = await rig.db.fetchrow("SELECT * FROM desired_capacity WHERE pool_id = 'p'")
    assert (row["desired"], row["current"], row["raw_desired"]) == (5, 1, 5)
    assert row["leader_epoch"] == c.leadership.epoch
    assert row["valid_until"].timestamp() == pytest.approx(rig.clock.time() + 20)


async def test_no_scale_down_before_stabilization_or_with_a_queue(rig: Rig) -> None:
    rig.controller()
    await rig.add_pool(replicas=3)
    await enqueue(rig.db, "p", 1)  # raw 1 < 3 replicas, but a task waits
    for _ in range(10):
        await rig.tick()
    assert await rig.db.fetchval("SELECT count(*) FROM workers WHERE status = 'draining'") == 0
    await set_tasks(rig.db, "p", frm="queued", to="running", n=1)
    await enqueue(rig.db, "p", 2, status="running")  # demand 3 = replicas 3
    await rig.tick()
    await set_tasks(rig.db, "p", frm="running", to="done", n=2)  # demand 1, queue empty
    # 3 replicas, below small_pool_replicas (5): the 60 s window grows to 60 x 5 / 3
    for _ in range(10):  # 0..90 s of the 100 s stabilization window
        await rig.tick()
        assert await rig.db.fetchval(
            "SELECT count(*) FROM workers WHERE status = 'draining'") == 0
    await rig.tick()  # 100 s below current with an empty queue: one worker drains
    assert await rig.db.fetchval("SELECT count(*) FROM workers WHERE status = 'draining'") == 1


async def test_drain_then_priority_then_one_replica_fewer(rig: Rig) -> None:
    rig.controller(scale_down_window=0)
    await rig.add_pool(replicas=3)
    first, second, third = rig.fake.instances("p")
    rig.running = {first: 2, second: 1, third: 3}
    await rig.tick()  # plan: 0 replicas wanted; drain the least busy worker only
    rows = await worker_rows(rig.db, "p")
    assert [w for w, r in rows.items() if r["status"] == "draining"] == [second]
    assert scale_calls(rig) == []

    await rig.tick()  # still a running task: wait
    assert scale_calls(rig) == []

    rig.running[second] = 0
    await rig.tick()  # reported empty after the mark: priority, then one replica fewer
    assert scale_calls(rig) == [
        ("set_instance_termination_priority", "p", (second, -1000)),
        ("scale_pool", "p", 2),
    ]
    assert rig.fake.instances("p") == [first, third]  # the drained one went, no other
    rows = await worker_rows(rig.db, "p")
    assert rows[second]["status"] == "gone"
    assert rows[second]["removal_target"] == 2
    assert {rows[first]["status"], rows[third]["status"]} == {"active"}


async def test_a_removal_cut_short_is_finished_by_the_next_tick_not_repeated(rig: Rig) -> None:
    rig.controller(scale_down_window=0)
    await rig.add_pool(replicas=2, min_replicas=1)
    a, b = rig.fake.instances("p")
    rig.running = {a: 1}
    await rig.tick()  # drains b
    rig.fake.fail("scale_pool", OrchestratorUnavailable("api down"))
    res = await rig.tick()  # commits the removal, sets the priority, scale_pool fails
    assert [r.outcome for r in res.actions] == ["failed"]
    assert (await worker_rows(rig.db, "p"))[b]["removal_target"] == 1
    res = await rig.tick()  # finishes the same removal: same absolute count
    assert [(r.kind, r.outcome, r.replicas) for r in res.actions] == [("remove", "ok", 1)]
    assert rig.fake.instances("p") == [a]
    await rig.tick()
    assert rig.fake.instances("p") == [a]  # min_replicas 1: nothing more goes


async def test_drain_timeout_reactivates(rig: Rig) -> None:
    rig.controller(scale_down_window=0, drain_timeout=60)
    await rig.add_pool(replicas=1)
    (only,) = rig.fake.instances("p")
    rig.running = {only: 1}  # a long task that never ends
    await rig.tick()
    assert (await worker_rows(rig.db, "p"))[only]["status"] == "draining"
    for _ in range(6):  # 60 s: not yet past the timeout
        res = await rig.tick()
        assert res.actions == []
    res = await rig.tick()
    assert [(r.kind, r.detail) for r in res.actions] == [("reactivate", "drain_timeout")]
    assert (await worker_rows(rig.db, "p"))[only]["status"] == "active"
    assert rig.fake.instances("p") == [only]


async def test_revision_mismatch_freezes(rig: Rig) -> None:
    c = rig.controller(scale_up_window=0, scale_down_window=0)
    await rig.add_pool(replicas=2, expected_revision="r2")  # workers run r1
    await enqueue(rig.db, "p", 10)
    await rig.tick()
    p = c.last_plan.pool("p")  # type: ignore[union-attr]
    assert p.frozen_reason and p.frozen_reason.startswith("revision_mismatch")
    assert scale_calls(rig) == []
    row = await rig.db.fetchrow("SELECT * FROM desired_capacity WHERE pool_id = 'p'")
    assert row["frozen_reason"].startswith("revision_mismatch") and row["desired"] == 2


async def test_no_scale_down_on_read_errors(rig: Rig) -> None:
    c = rig.controller(scale_down_window=0)
    await rig.add_pool(replicas=2)
    await rig.add_pool("q", replicas=2)
    rig.fake.fail("pool_state", OrchestratorUnavailable("timeout"), times=2)
    await rig.tick()  # p's and q's orchestrator reads fail: both frozen
    assert all(x.frozen_reason for x in c.last_plan.pools)  # type: ignore[union-attr]
    assert await rig.db.fetchval("SELECT count(*) FROM workers WHERE status = 'draining'") == 0
    # Now the demand query fails: every pool freezes, nothing drains.
    await rig.db.execute("ALTER VIEW pool_queue RENAME TO pool_queue_away")
    res = await rig.tick()
    assert res.error is None and res.actions == []
    assert all(x.frozen_reason and x.frozen_reason.startswith("inputs_missing")
               for x in c.last_plan.pools)  # type: ignore[union-attr]
    await rig.db.execute("ALTER VIEW pool_queue_away RENAME TO pool_queue")
    res = await rig.tick()  # data is back: the history restarted, window 0 acts at once
    assert {r.kind for r in res.actions} == {"drain"}


async def test_shadow_mode_takes_no_action(rig: Rig) -> None:
    c = rig.controller(shadow=True, scale_up_window=0, scale_down_window=0)
    await rig.add_pool(replicas=3)
    await rig.add_pool("up", replicas=0)
    await enqueue(rig.db, "up", 4)
    res = await rig.tick()
    assert {(r.pool_id, r.kind, r.outcome) for r in res.actions} == {
        ("p", "drain", "shadow"), ("up", "scale_up", "shadow")}
    assert scale_calls(rig) == []
    assert await rig.db.fetchval("SELECT count(*) FROM workers WHERE status = 'draining'") == 0
    published = await rig.db.fetch("SELECT pool_id, desired FROM desired_capacity")
    assert {r["pool_id"]: r["desired"] for r in published} == {"p": 0, "up": 4}
    assert c.last_plan is not None


async def test_a_follower_reports_the_leaders_published_plan(rig: Rig) -> None:
    leader, follower = rig.controller(), rig.controller()
    await rig.add_pool(replicas=1)
    assert (await rig.tick(leader)).leader
    res = await rig.tick(follower, advance=0)
    assert not res.leader and res.error is None
    assert [p.pool_id for p in follower.published] == ["p"]
    assert follower.readiness() == (True, "follower")
    assert leader.readiness() == (True, "leader")


async def test_the_keepalive_notices_a_lease_that_moved_on(rig: Rig) -> None:
    c = rig.controller(scale_down_window=0)
    await rig.add_pool(replicas=2)
    assert (await rig.tick()).leader
    # Another leadership begins behind this one's back (as after a split brain).
    await rig.db.execute("UPDATE leader_lease SET epoch = epoch + 1")
    res = await rig.tick()
    assert not res.leader and not c.leadership.is_leader
    assert "epoch 2" in c.leadership.lost_reason
    assert scale_calls(rig) == []


class _DeposeDuringRead:
    """Delegates to the fake, but a new leadership begins while the tick reads."""

    name = "fake"

    def __init__(self, rig: Rig) -> None:
        self.rig = rig

    async def pool_state(self, pool: PoolRef) -> PoolState:
        await self.rig.db.execute("UPDATE leader_lease SET epoch = epoch + 1")
        return await self.rig.fake.pool_state(pool)

    async def scale_pool(self, pool: PoolRef, replicas: int, *, request_id: str) -> ScaleResult:
        return await self.rig.fake.scale_pool(pool, replicas, request_id=request_id)

    async def set_instance_termination_priority(self, pool: PoolRef, instance_ref: str, *,
                                                priority: int) -> None:
        await self.rig.fake.set_instance_termination_priority(pool, instance_ref,
                                                              priority=priority)

    async def close(self) -> None:
        return None


async def test_a_deposed_leaders_write_fails_on_the_epoch_and_aborts_the_tick(rig: Rig) -> None:
    c = rig.controller(scale_down_window=0, scale_up_window=0)
    await rig.add_pool(replicas=2)
    await enqueue(rig.db, "p", 5)  # the plan wants a scale-up, and would act on it
    c.orchestrators = c.actuator.orchestrators = {"fake": _DeposeDuringRead(rig)}
    res = await rig.tick()
    assert res.error is not None and res.error.startswith("deposed")
    assert not c.leadership.is_leader
    assert scale_calls(rig) == []  # the write failed before any orchestrator call
    assert await rig.db.fetchval("SELECT count(*) FROM desired_capacity") == 0
    ready, why = c.readiness()
    assert not ready and why.startswith("deposed")


async def test_a_database_clock_far_from_the_controllers_is_reported(
        pg_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="roost.controller")
    rig = Rig(pg_dsn, await open_db(pg_dsn), clock=FakeClock(start=time.time()))
    try:
        c = rig.controller()

        def offset() -> float | None:
            return c.metrics.registry.get_sample_value(
                "roost_controller_db_clock_offset_seconds")

        await rig.tick(advance=0)
        assert offset() == pytest.approx(0, abs=5)
        assert "clock" not in caplog.text
        await rig.tick(advance=60)  # this controller's clock now runs 60 s ahead
        assert offset() == pytest.approx(-60, abs=5)
        # -60.0, or -59.9 when the read lands a few tenths of a second later (a busy host)
        assert re.search(r"the database's clock is -(59|60)\.\d", caplog.text), caplog.text
        assert caplog.text.count("the database's clock is -") == 1
        await rig.tick(advance=0)
        assert caplog.text.count("the database's clock is -") == 1  # said once
        rig.clock.now = time.time()
        await rig.tick(advance=0)
        assert "back within 10.0s" in caplog.text

        follower = rig.controller()
        await rig.tick(follower, advance=0)
        assert not follower.leadership.is_leader
        assert math.isnan(follower.metrics.registry.get_sample_value(
            "roost_controller_db_clock_offset_seconds") or 0.0)
    finally:
        await rig.close()
