"""Failover that nothing can block, on real Postgres and real controller processes:

- a leader frozen with SIGSTOP (its kernel still answers TCP) is replaced within the
  lease, 15 s with the default settings;
- a transaction left open on the lease row (the share lock every fenced write takes)
  cannot hold the lead past the bound, whoever opened it;
- every controller session is bounded by the server: a pooled transaction left idle, or
  kept busy, ends within half a lease;
- a follower that cannot take the lead says why on /readyz and /status.

The measured times are printed (``pytest -s``) and recorded in docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import httpx
import pytest

from roost.controller.clock import SystemClock
from roost.controller.config import ControllerConfig
from roost.controller.service import pool_bounds, serve
from roost.embedded.proc import free_port
from roost.store import lease
from roost.store.migrations import migrate
from roost.store.session import create_pool
from tests.polling import until

DEFAULT_BOUND = 15.0  # a Kubernetes Lease's default leaseDuration


class ControllerProcess:
    """`roost controller` as a child process, stopped by its own pid."""

    def __init__(self, dsn: str, holder: str, *args: str) -> None:
        self.dsn, self.holder, self.args = dsn, holder, args
        self.port = free_port()
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> ControllerProcess:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "roost.controller", "--dsn", self.dsn, "--holder",
            self.holder, "--http-port", str(self.port), "--log-level", "warning", *self.args,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )
        return self

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGCONT)
            os.kill(self.proc.pid, signal.SIGKILL)
        await asyncio.wait_for(self.proc.wait(), 10)

    async def status(self) -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=2) as http:
            return dict((await http.get(f"{self.url}/status")).json())


@pytest.fixture
async def db(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=3)
    async with pool.acquire() as conn:
        await migrate(conn)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
async def procs() -> AsyncIterator[list[ControllerProcess]]:
    started: list[ControllerProcess] = []
    try:
        yield started
    finally:
        for p in started:
            await p.stop()


async def _holder(db: asyncpg.Pool) -> str:
    return (await lease.current(db) or (0, ""))[1]


async def _wait_for(what: str, cond: Callable[[], object], timeout: float) -> float:
    """``until`` ``cond`` holds, checked every 0.05 s; how long that took."""
    start = time.monotonic()
    await until(what, cond, timeout=timeout, interval=0.05)
    return time.monotonic() - start


async def _leader_and_follower(pg_dsn: str, db: asyncpg.Pool,
                               procs: list[ControllerProcess]) -> tuple[ControllerProcess,
                                                                        ControllerProcess]:
    """Two controllers with the default lease settings: ``a`` leads, ``b`` follows it."""
    a = await ControllerProcess(pg_dsn, "a").start()
    procs.append(a)
    await _wait_for("a leads", lambda: _is(db, "a"), 30)
    b = await ControllerProcess(pg_dsn, "b").start()
    procs.append(b)

    async def b_follows() -> bool:
        try:
            doc = await b.status()
        except httpx.HTTPError:
            return False
        return bool(doc["ready"]) and not doc["leader"] and "a" in doc["following"]

    await _wait_for("b follows a", b_follows, 30)
    return a, b


async def _is(db: asyncpg.Pool, holder: str) -> bool:
    return await _holder(db) == holder


async def test_a_frozen_leader_is_replaced_within_the_default_lease(
    pg_dsn: str, db: asyncpg.Pool, procs: list[ControllerProcess]
) -> None:
    a, b = await _leader_and_follower(pg_dsn, db, procs)
    epoch = (await lease.current(db) or (0, ""))[0]
    a.signal(signal.SIGSTOP)  # frozen: its sockets stay open, its kernel answers TCP
    took = await _wait_for("b takes over", lambda: _is(db, "b"), DEFAULT_BOUND + 5)
    print(f"\nfrozen leader replaced after {took:.1f}s (bound {DEFAULT_BOUND:g}s)")
    assert took <= DEFAULT_BOUND
    doc = await b.status()
    assert doc["epoch"] == epoch + 1
    await _wait_for("b is leader and ready", _ready_leader(b), 10)

    a.signal(signal.SIGCONT)  # thawed, it finds its session gone and steps down

    async def a_follows() -> bool:
        doc = await a.status()
        return not doc["leader"] and bool(doc["lostLeadershipReason"])

    await _wait_for("a steps down once thawed", a_follows, 10)
    assert await _is(db, "b")


def _ready_leader(c: ControllerProcess) -> Any:
    async def check() -> bool:
        doc = await c.status()
        return bool(doc["leader"]) and bool(doc["ready"]) and doc["plan"] is not None
    return check


@contextlib.asynccontextmanager
async def _lease_row_held(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A session with no limits of its own (psql, a script, an older controller) holding
    the share lock a fenced write takes, in a transaction it never ends."""
    conn = await asyncpg.connect(dsn)
    tx = conn.transaction()
    await tx.start()
    await conn.fetchval("SELECT epoch FROM leader_lease WHERE name = $1 FOR SHARE",
                        lease.LEASE_NAME)
    try:
        yield conn
    finally:
        conn.terminate()


async def test_an_open_transaction_on_the_lease_row_cannot_block_failover(
    pg_dsn: str, db: asyncpg.Pool, procs: list[ControllerProcess]
) -> None:
    a, b = await _leader_and_follower(pg_dsn, db, procs)
    async with _lease_row_held(pg_dsn) as blocker:
        blocker_pid = blocker.get_server_pid()
        a.signal(signal.SIGSTOP)
        took = await _wait_for("b takes over", lambda: _is(db, "b"), DEFAULT_BOUND + 5)
        print(f"\nleader frozen with the lease row share-locked: replaced after {took:.1f}s")
        assert took <= DEFAULT_BOUND
        gone = await db.fetchval("SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $1",
                                 blocker_pid)
        assert gone, "the session holding the lease row should have been terminated"
        await _wait_for("b is leader and ready", _ready_leader(b), 10)


async def test_the_lease_row_held_while_the_leader_runs_passes_at_once(
    pg_dsn: str, db: asyncpg.Pool, procs: list[ControllerProcess]
) -> None:
    """The leader process killed outright, while a transaction holds the row: the lock is
    free at once, and the row within a second."""
    a, _ = await _leader_and_follower(pg_dsn, db, procs)
    async with _lease_row_held(pg_dsn):
        a.signal(signal.SIGKILL)
        took = await _wait_for("b takes over", lambda: _is(db, "b"), DEFAULT_BOUND)
        print(f"\nleader killed with the lease row share-locked: replaced after {took:.1f}s")
        assert took <= 2 + 1 + 1.5  # follower_retry + the lock wait + the termination


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
async def test_no_pooled_controller_transaction_outlives_half_a_lease(
    pg_dsn: str, db: asyncpg.Pool, busy: bool
) -> None:
    """The server ends it even if the controller is frozen: nothing on the client side
    has to run for the share lock on the lease row to go."""
    config = ControllerConfig(dsn=pg_dsn, lease_duration=2.0, follower_retry=0.5,
                              keepalive_timeout=0.5, io_timeout=5).validate()
    pool = await create_pool(pg_dsn, pool_bounds(config), connect_timeout=5)
    try:
        conn = await pool.acquire()
        settings = {r["name"]: r["setting"] for r in await conn.fetch(
            "SELECT name, setting FROM pg_settings WHERE name IN ('statement_timeout', "
            "'idle_in_transaction_session_timeout', 'transaction_timeout', "
            "'tcp_keepalives_idle', 'tcp_user_timeout', 'jit')")}
        assert settings == {"statement_timeout": "5000",
                            "idle_in_transaction_session_timeout": "1000",
                            "transaction_timeout": "1000", "tcp_keepalives_idle": "2",
                            "tcp_user_timeout": "5000", "jit": "off"}
        pid = conn.get_server_pid()
        tx = conn.transaction()
        await tx.start()
        await conn.fetchval("SELECT epoch FROM leader_lease WHERE name = $1 FOR SHARE",
                            lease.LEASE_NAME)
        start = time.monotonic()
        with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, OSError)):
            while time.monotonic() - start < 5:
                if busy:  # statements one after another, none of them long
                    await conn.fetchval("SELECT pg_sleep(0.1)")
                else:
                    await asyncio.sleep(0.1)
                    await conn.fetchval("SELECT 1")

        async def gone() -> bool:
            return bool(await db.fetchval(
                "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $1", pid))

        took = await _wait_for("the server ends the session", gone, 5)
        assert time.monotonic() - start <= 1.0 + 0.5 + took
        with contextlib.suppress(Exception):
            await pool.release(conn)
    finally:
        pool.terminate()


@pytest.fixture
async def follower(pg_dsn: str, db: asyncpg.Pool) -> AsyncIterator[str]:
    """An in-process controller with a short lease; yields its URL."""
    port = free_port()
    config = ControllerConfig(dsn=pg_dsn, interval=0.5, lease_duration=2.0,
                              follower_retry=0.5, keepalive_timeout=0.5, http_port=port,
                              holder="follower").validate()
    stop, started = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve(config, orchestrators={}, clock=SystemClock(),
                                     stop=stop, started=started))
    await asyncio.wait_for(started.wait(), 20)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)


async def _readyz(url: str) -> tuple[int, dict[str, Any]]:
    async with httpx.AsyncClient(timeout=2) as http:
        res = await http.get(f"{url}/readyz")
        return res.status_code, dict(res.json())


async def test_a_follower_behind_a_silent_lock_holder_says_why(
    pg_dsn: str, db: asyncpg.Pool, follower: str
) -> None:
    """The leader lock held by a session Postgres never ends (no idle_session_timeout):
    the follower cannot lead, and says so rather than reporting ready."""
    squatter = await asyncpg.connect(pg_dsn, server_settings={"application_name": "squatter"})
    try:
        async with httpx.AsyncClient(timeout=2) as http:
            # The follower may take the lock first: wait for it to lead, then take it.
            async def leads() -> bool:
                code, body = await _readyz(follower)
                return code == 200 and body["leader"] is True

            await _wait_for("the follower leads", leads, 20)
            await db.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'roost-controller follower'")
            await _wait_for("the squatter takes the lock",
                            lambda: squatter.fetchval("SELECT pg_try_advisory_lock($1, $2)",
                                                      *lease.LOCK_KEY), 10)

            async def not_ready() -> bool:
                code, body = await _readyz(follower)
                return code == 503 and "cannot take the lead" in body.get("detail", "")

            took = await _wait_for("the follower says it cannot lead", not_ready, 10)
            print(f"\nfollower not ready {took:.1f}s after the lock holder went silent")
            code, body = await _readyz(follower)
            assert code == 503
            assert "cannot take the lead" in body["detail"]
            assert "squatter" in body["detail"] and "silent past the 2s lease" in body["detail"]
            async def tick_saw_it() -> bool:  # the next follower tick records it too
                doc = (await http.get(f"{follower}/status")).json()
                return "cannot take the lead" in (doc["lastError"] or "")

            await _wait_for("a tick reports it", tick_saw_it, 15)
            doc = (await http.get(f"{follower}/status")).json()
            assert doc["ready"] is False and doc["leader"] is False
            assert "cannot take the lead" in doc["leadershipProblem"]
            assert doc["following"] == "squatter"
        await squatter.close()  # the lock goes with the session

        await _wait_for("the follower leads once the holder is gone", leads, 10)
    finally:
        squatter.terminate()


@pytest.fixture
async def unprivileged_dsn(pg_dsn: str, db: asyncpg.Pool) -> AsyncIterator[str]:
    """A role that may use the schema but may not terminate a superuser's session."""
    role = f"ctl_{uuid.uuid4().hex[:8]}"
    await db.execute(f'CREATE ROLE "{role}" LOGIN')
    await db.execute(f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{role}"')
    try:
        yield pg_dsn.replace("postgresql://postgres@", f"postgresql://{role}@")
    finally:
        await db.execute(f'DROP OWNED BY "{role}"')
        await db.execute(f'DROP ROLE "{role}"')


async def test_a_follower_that_may_not_free_the_lease_row_says_why(
    pg_dsn: str, db: asyncpg.Pool, unprivileged_dsn: str
) -> None:
    await db.execute("INSERT INTO leader_lease (name, epoch, holder) VALUES ($1, 1, 'gone')",
                     lease.LEASE_NAME)
    port = free_port()
    config = ControllerConfig(dsn=unprivileged_dsn, interval=0.5, lease_duration=2.0,
                              follower_retry=0.5, keepalive_timeout=0.5, http_port=port,
                              holder="weak", migrate=False).validate()
    url = f"http://127.0.0.1:{port}"
    async with _lease_row_held(pg_dsn):  # a superuser's session: not ours to end
        stop, started = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(serve(config, orchestrators={}, clock=SystemClock(),
                                         stop=stop, started=started))
        try:
            await asyncio.wait_for(started.wait(), 20)

            async def says_why() -> bool:
                code, body = await _readyz(url)
                return code == 503 and "may not terminate" in body.get("detail", "")

            await _wait_for("the follower says the lease row is held", says_why, 15)
            _, body = await _readyz(url)
            assert "cannot take the lead: the lease row is locked by pid" in body["detail"]
            assert await _holder(db) != "weak"
        finally:
            stop.set()
            await asyncio.wait_for(task, 20)
