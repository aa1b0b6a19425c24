"""Leader election on a Postgres advisory lock, with a fencing epoch.

The rules, each learned from a system that got it wrong:

- One dedicated connection (never a pool, never a transaction-mode pooler) holds the
  session-scoped lock; asyncpg connections are autocommit outside a transaction.
- The lock is taken once. Taking it again succeeds and *stacks*: one unlock would then
  leave it held. So a leader never calls ``pg_try_advisory_lock`` again.
- Each new leadership bumps the epoch in ``leader_lease``; every controller write checks
  it (`roost.store.fenced`), so a deposed leader cannot write.
- Each tick, and every ``retry_interval`` in between, the leader runs a keep-alive with
  a timeout: is the lock still ours and the epoch still ours? Any failure steps down at
  once.
- A connection termination listener steps down the moment the session dies, without
  waiting for the next tick.
- Nothing the old leader left behind can block the new one, as with a Kubernetes Lease
  (`roost.store.session`): the lock session carries ``idle_session_timeout`` =
  ``lease_duration``, and the leader renews it every ``retry_interval`` from a task of
  its own (`keep`), not once per tick; so a frozen leader (SIGSTOP, a stalled VM) loses
  the lock ``lease_duration`` after its last renewal, whatever its kernel still answers
  on TCP. A fenced write it left open on the lease row ends within half a lease
  (``transaction_timeout``), and the new leader terminates any session still holding the
  row after a lock wait of a quarter of ``keepalive_timeout`` (`lease.bump_epoch`).
  With the defaults (10 s lease, 2 s retry) a frozen leader is replaced within 13 s.
- A follower that cannot take the lead says why (`problem`): a lock holder silent past
  the lease, a lease row it may not free, Postgres out of reach. /readyz and /status show
  it, instead of reporting a healthy follower of a leader that is gone.

Followers keep their connection and retry the lock every ``retry_interval`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from roost.controller.clock import Clock
from roost.store import lease
from roost.store.session import CONNECTION_ERRORS, SessionBounds, connect

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
        lease_duration: float = 10.0,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.dsn = dsn
        self.holder = holder
        self.clock = clock
        self.retry_interval = retry_interval
        self.keepalive_timeout = keepalive_timeout
        self.connect_timeout = connect_timeout
        self.lease_duration = lease_duration
        self.on_change = on_change
        self.epoch: int | None = None
        self.lost_reason = ""
        self.problem = ""
        """Why this follower cannot take the lead ("" while it follows a live leader)."""
        self.following = ""
        """The lock holder a follower last saw, as ``pg_stat_activity`` shows it."""
        self._conn: Any = None
        self._next_try = float("-inf")
        self._busy = asyncio.Lock()  # one query at a time on the lock session
        self._closed = False

    @property
    def is_leader(self) -> bool:
        return self.epoch is not None and self._conn is not None and not self._conn.is_closed()

    @property
    def backend_pid(self) -> int | None:
        """The server pid of the leader session (what ``pg_terminate_backend`` takes)."""
        return None if self._conn is None else int(self._conn.get_server_pid())

    @property
    def bounds(self) -> SessionBounds:
        return SessionBounds(
            statement_timeout=self.keepalive_timeout,
            transaction_bound=self.lease_duration / 2,
            idle_session_timeout=self.lease_duration,
            application_name=f"roost-controller {self.holder}",
        )

    async def ensure(self) -> bool:
        """Keep leadership alive, or try to gain it when due: each tick, and every
        ``retry_interval`` from `keep`.

        Raises `LeadershipError` when Postgres cannot be reached at all, which the loop
        reports (and /readyz turns into a 503).
        """
        async with self._busy:
            if self._closed:
                return False
            try:
                return await self._ensure()
            except LeadershipError as exc:
                self.problem = str(exc)
                raise

    async def keep(self, stop: asyncio.Event) -> None:
        """Renew the lease (leader) or try for it (follower) every ``retry_interval``,
        apart from the reconcile loop, whose ticks are too far apart to keep a lease."""
        while not stop.is_set():
            try:
                await self.ensure()
            except LeadershipError as exc:
                log.warning("%s", exc)
            await self.clock.sleep(self.retry_interval, wake=stop)

    async def _ensure(self) -> bool:
        if self.is_leader:
            return await self._keepalive()
        if self.epoch is not None:
            self._lost("the leader connection closed")
        if self.clock.monotonic() < self._next_try:
            return False
        self._next_try = self.clock.monotonic() + self.retry_interval
        return await self._try_acquire()

    async def _connect(self) -> Any:
        try:
            conn = await connect(self.dsn, self.bounds, timeout=self.connect_timeout,
                                 statement_cache_size=0)
        except CONNECTION_ERRORS as exc:
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
                await self._observe_holder(conn)
                return False
            # Holding the lock from here on: any failure must drop the session, or the
            # lock would stay taken by a controller that does not know it leads.
            lock_wait = min(1.0, self.keepalive_timeout / 4)
            self.epoch = await asyncio.wait_for(
                lease.bump_epoch(conn, self.holder, lock_wait=lock_wait),
                4 * self.keepalive_timeout,  # up to three waits and a termination
            )
        except lease.LeaseRowBlocked as exc:
            self._drop()
            raise LeadershipError(f"cannot take the lead: {exc}") from exc
        except CONNECTION_ERRORS as exc:
            self._drop()
            raise LeadershipError(f"leader election failed: {exc or type(exc).__name__}"
                                  ) from exc
        self.lost_reason = self.problem = self.following = ""
        log.info("leading with epoch %s as %s", self.epoch, self.holder)
        if self.on_change:
            self.on_change(True)
        return True

    async def _observe_holder(self, conn: Any) -> None:
        """Follow the lock holder, or say why not: a holder silent past the lease is a
        session Postgres should have ended (one without our ``idle_session_timeout``,
        say), and while it lasts nobody leads."""
        holder = await lease.lock_holder(conn, timeout=self.keepalive_timeout)
        if holder is None:  # released since: the next retry takes it
            self.problem = self.following = ""
            return
        self.following = holder.application_name or f"pid {holder.pid}"
        silent_for = self.lease_duration + 2 * self.retry_interval
        if holder.quiet > silent_for:
            self.problem = (
                f"cannot take the lead: the leader lock is held by {holder.describe()}, "
                f"silent past the {self.lease_duration:g}s lease, and Postgres is not "
                "ending that session (was it opened without idle_session_timeout?)")
        else:
            self.problem = ""

    async def _keepalive(self) -> bool:
        # `_ensure` came here only with the session open (`is_leader`); the termination
        # listener may clear the attribute between the two queries.
        conn = self._conn
        try:
            held = await lease.holds_lock(conn, timeout=self.keepalive_timeout)
            cur = await lease.current(conn, timeout=self.keepalive_timeout)
        except CONNECTION_ERRORS as exc:
            await self._step_down(f"keep-alive failed: {exc or type(exc).__name__}")
            return False
        if not held:
            await self._step_down("the advisory lock is no longer held")
            return False
        if cur is None or cur[0] != self.epoch:
            await self._step_down(f"the lease moved on to epoch {cur and cur[0]}")
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
        """Give up the lead (and the lock session). Waits for a keep-alive or election
        under way: dropping the session under a query breaks that query inside asyncpg
        (an AttributeError, not a connection error), which ended a shutdown with it."""
        async with self._busy:
            await self._step_down(reason)

    async def _step_down(self, reason: str) -> None:
        was = self.epoch is not None
        self._drop()
        if was:
            self._lost(reason)
        await asyncio.sleep(0)

    async def close(self) -> None:
        """Release leadership at shutdown, so a follower takes over at its next retry;
        an `ensure` after this (the lease task's last round) takes nothing."""
        async with self._busy:
            self._closed = True
            await self._step_down("shutting down")
