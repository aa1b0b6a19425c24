"""Leader election on real Postgres: one leader, fast failover when the leader's session
is terminated or its process is killed, and fenced writes from a deposed leader."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest

from roost.controller.clock import SystemClock
from roost.controller.leadership import Leadership
from roost.embedded.proc import free_port
from roost.store import fenced, lease
from roost.store.errors import StaleEpoch
from roost.store.migrations import migrate
from tests.polling import until


@pytest.fixture
async def db(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=3)
    async with pool.acquire() as conn:
        await migrate(conn)
    try:
        yield pool
    finally:
        await pool.close()


def _leadership(dsn: str, holder: str) -> Leadership:
    return Leadership(dsn, holder=holder, clock=SystemClock(), retry_interval=0.1,
                      keepalive_timeout=2.0)


async def _lead_within(candidate: Leadership, seconds: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if await candidate.ensure():
            return time.monotonic() - start
        await asyncio.sleep(0.05)
    raise AssertionError(f"{candidate.holder} did not lead within {seconds}s")


async def _publish(db: asyncpg.Pool, epoch: int) -> None:
    await fenced.publish_desired(db, epoch, [], now=time.time(), valid_until=time.time() + 20)


async def test_two_controllers_give_exactly_one_leader(pg_dsn: str, db: asyncpg.Pool) -> None:
    a, b = _leadership(pg_dsn, "a"), _leadership(pg_dsn, "b")
    try:
        results = await asyncio.gather(a.ensure(), b.ensure())
        assert sorted(results) == [False, True]
        for _ in range(5):  # keep-alives and retries change nothing
            await asyncio.sleep(0.12)
            assert sorted(await asyncio.gather(a.ensure(), b.ensure())) == [False, True]
        leader = a if a.is_leader else b
        assert leader.epoch == 1
        assert await lease.current(db) == (1, leader.holder)
    finally:
        await a.close()
        await b.close()


async def test_the_lock_is_taken_once_not_stacked(pg_dsn: str, db: asyncpg.Pool) -> None:
    a, b = _leadership(pg_dsn, "a"), _leadership(pg_dsn, "b")
    try:
        assert await a.ensure()
        for _ in range(5):
            assert await a.ensure()  # keep-alives, not new lock calls
        # One unlock on the leader's session releases it: had every tick re-taken the
        # lock, it would still be held.
        assert await a._conn.fetchval("SELECT pg_advisory_unlock($1, $2)", *lease.LOCK_KEY)
        assert await b.ensure()  # free at once
        assert not await a.ensure()  # and the keep-alive sees it has lost the lock
        assert "no longer held" in a.lost_reason
    finally:
        await a.close()
        await b.close()


async def test_a_shutdown_during_a_keep_alive_waits_for_it_and_takes_nothing_after(
        pg_dsn: str, db: asyncpg.Pool) -> None:
    """The lease task's keep-alive and the loop's close at shutdown run side by side: a
    session dropped under the keep-alive's queries failed them (once inside asyncpg, an
    AttributeError that ended the shutdown), and a round after the close could lead
    again from a process on its way out."""
    a = _leadership(pg_dsn, "a")
    assert await a.ensure()
    keeping = asyncio.create_task(a.ensure())
    await asyncio.sleep(0)  # the keep-alive is under way, holding the session
    await a.close()
    assert await keeping is True  # the keep-alive ended whole; the close came after
    assert not a.is_leader and a.lost_reason == "shutting down"
    assert not await a.ensure()  # closed: not a new election
    assert a._conn is None
    async with db.acquire() as conn:  # the dropped session ends on the server's time

        async def released() -> bool:
            return await lease.lock_holder(conn, timeout=2.0) is None

        await until("the server ends the dropped session and its lock", released,
                    timeout=5, interval=0.05)


async def test_terminated_leader_session_fails_over_and_old_writes_fail(
    pg_dsn: str, db: asyncpg.Pool
) -> None:
    a, b = _leadership(pg_dsn, "a"), _leadership(pg_dsn, "b")
    try:
        assert await a.ensure() and not await b.ensure()
        old_epoch = a.epoch
        assert old_epoch is not None
        await _publish(db, old_epoch)  # the leader's writes go through
        await db.execute("SELECT pg_terminate_backend($1)", a.backend_pid)
        # The termination listener steps down without a tick. asyncpg marks the session
        # closed first and calls its listeners a loop turn later: wait for both.
        await until("a steps down", lambda: not a.is_leader and a.lost_reason, timeout=5,
                    interval=0.01)
        assert not a.is_leader and "terminated" in a.lost_reason
        took = await _lead_within(b, 5.0)
        assert took < 5.0 and b.epoch == old_epoch + 1
        with pytest.raises(StaleEpoch):
            await _publish(db, old_epoch)  # the old leader's next write fails
        await _publish(db, b.epoch)
        assert not await a.ensure()  # a reconnects as a follower
    finally:
        await a.close()
        await b.close()


async def test_kill_9_of_the_leaders_process_fails_over(
    pg_dsn: str, db: asyncpg.Pool
) -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "roost.controller", "--dsn", pg_dsn, "--interval", "0.2",
        "--follower-retry", "0.2", "--http-port", str(port), "--holder", "child",
        "--log-level", "warning",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    b = _leadership(pg_dsn, "b")
    try:
        deadline = time.monotonic() + 20
        while (await lease.current(db) or (0, ""))[1] != "child":
            if proc.returncode is not None:
                err = await proc.stderr.read() if proc.stderr else b""
                raise AssertionError(f"the child controller exited: {err.decode()}")
            assert time.monotonic() < deadline, "the child controller never led"
            await asyncio.sleep(0.05)
        child_epoch = (await lease.current(db) or (0, ""))[0]
        assert not await b.ensure()
        os.kill(proc.pid, signal.SIGKILL)  # by its own pid
        await asyncio.wait_for(proc.wait(), 5)
        await _lead_within(b, 5.0)
        assert b.epoch == child_epoch + 1
        with pytest.raises(StaleEpoch):
            await _publish(db, child_epoch)
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGKILL)
            await asyncio.wait_for(proc.wait(), 5)
        await b.close()


async def test_a_leader_that_cannot_reach_postgres_is_not_leader() -> None:
    port = free_port()  # nothing listens here
    a = Leadership(f"postgresql://postgres@127.0.0.1:{port}/x", holder="a",
                   clock=SystemClock(), connect_timeout=1.0)
    with pytest.raises(Exception, match="cannot connect"):
        await a.ensure()
    assert not a.is_leader
