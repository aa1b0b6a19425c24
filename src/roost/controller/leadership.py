"""Leader election on a Postgres advisory lock, with a fencing epoch.

The rules, each learned from a system that got it wrong:

- One dedicated connection (never a pool, never a transaction-mode pooler) holds the
  session-scoped lock; asyncpg connections are autocommit outside a transaction.
- The lock is taken once. Taking it again succeeds and *stacks*: one unlock would then
  leave it held. So a leader never calls ``pg_try_advisory_lock`` again.
- Each new leadership bumps the epoch in ``leader_lease``; every controller write checks
  it (`roost.store.fenced`), so a deposed leader cannot write.
- Each tick the leader runs a keep-alive with a timeout: is the lock still ours and the
  epoch still ours? Any failure steps down at once.
- A connection termination listener steps down the moment the session dies, without
  waiting for the next tick.
- The session asks the server to drop it when it goes quiet (``idle_session_timeout``,
  TCP keepalives), so a leader that hangs or vanishes off the network releases the lock
  in seconds rather than after the kernel's two-hour TCP timeout.

Followers keep their connection and retry the lock every ``retry_interval`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import asyncpg

from roost.controller.clock import Clock
from roost.store import lease

log = logging.getLogger("roost.controller.leadership")


class LeadershipError(RuntimeError):
    """The controller could not reach Postgres to lead or follow."""


class Leadership:
    def __init__(
        self,
        dsn: str,
        *,
        holder: str,
        clock: Clock,
        retry_interval: float = 2.0,
        keepalive_timeout: float = 2.0,
        connect_timeout: float = 5.0,
        idle_session_timeout: float = 30.0,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.dsn = dsn
        self.holder = holder
        self.clock = clock
        self.retry_interval = retry_interval
        self.keepalive_timeout = keepalive_timeout
        self.connect_timeout = connect_timeout
        self.idle_session_timeout = idle_session_timeout
        self.on_change = on_change
        self.epoch: int | None = None
        self.lost_reason = ""
        self._conn: Any = None
        self._next_try = float("-inf")

    @property
    def is_leader(self) -> bool:
        return self.epoch is not None and self._conn is not None and not self._conn.is_closed()

    @property
    def backend_pid(self) -> int | None:
        """The server pid of the leader session (what ``pg_terminate_backend`` takes)."""
        return None if self._conn is None else int(self._conn.get_server_pid())

    async def ensure(self) -> bool:
        """Once per tick: keep leadership alive, or try to gain it when due.

        Raises `LeadershipError` when Postgres cannot be reached at all, which the loop
        reports (and /readyz turns into a 503).
        """
        if self.is_leader:
            return await self._keepalive()
        if self.epoch is not None:
            self._lost("the leader connection closed")
        if self.clock.monotonic() < self._next_try:
            return False
        self._next_try = self.clock.monotonic() + self.retry_interval
        return await self._try_acquire()

    async def _connect(self) -> Any:
        idle_ms = int(self.idle_session_timeout * 1000)
        try:
            conn = await asyncpg.connect(
                self.dsn,
                timeout=self.connect_timeout,
                statement_cache_size=0,
                server_settings={
                    "application_name": f"roost-controller {self.holder}"[:63],
                    "idle_session_timeout": str(idle_ms),
                    "tcp_keepalives_idle": "5",
                    "tcp_keepalives_interval": "2",
                    "tcp_keepalives_count": "3",
                },
            )
        except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
            raise LeadershipError(f"cannot connect to Postgres: {exc}") from exc
        conn.add_termination_listener(self._on_terminated)
        return conn

    async def _try_acquire(self) -> bool:
        if self._conn is None or self._conn.is_closed():
            self._conn = await self._connect()
        conn = self._conn
        try:
            got = await asyncio.wait_for(lease.try_lock(conn), self.keepalive_timeout)
            if not got:
                return False
            # Holding the lock from here on: any failure must drop the session, or the
            # lock would stay taken by a controller that does not know it leads.
            self.epoch = await asyncio.wait_for(
                lease.bump_epoch(conn, self.holder), self.keepalive_timeout
            )
        except (OSError, TimeoutError, asyncpg.PostgresError,
                asyncpg.InterfaceError) as exc:
            self._drop()
            raise LeadershipError(f"leader election failed: {exc}") from exc
        self.lost_reason = ""
        log.info("leading with epoch %s as %s", self.epoch, self.holder)
        if self.on_change:
            self.on_change(True)
        return True

    async def _keepalive(self) -> bool:
        try:
            held = await lease.holds_lock(self._conn, timeout=self.keepalive_timeout)
            cur = await lease.current(self._conn, timeout=self.keepalive_timeout)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            await self.step_down(f"keep-alive failed: {exc or type(exc).__name__}")
            return False
        if not held:
            await self.step_down("the advisory lock is no longer held")
            return False
        if cur is None or cur[0] != self.epoch:
            await self.step_down(f"the lease moved on to epoch {cur and cur[0]}")
            return False
        return True

    def _on_terminated(self, conn: Any) -> None:
        if conn is self._conn:
            self._conn = None
            if self.epoch is not None:
                self._lost("the leader connection was terminated")

    def _lost(self, reason: str) -> None:
        log.warning("stepping down from epoch %s: %s", self.epoch, reason)
        self.epoch = None
        self.lost_reason = reason
        if self.on_change:
            self.on_change(False)

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            # terminate(), not close(): close() waits on a server that may be gone.
            # Dropping the session is what releases the lock.
            conn.terminate()

    async def step_down(self, reason: str) -> None:
        was = self.epoch is not None
        self._drop()
        if was:
            self._lost(reason)
        await asyncio.sleep(0)

    async def close(self) -> None:
        """Release leadership at shutdown, so a follower takes over at its next retry."""
        await self.step_down("shutting down")
