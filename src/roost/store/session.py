"""How every controller connection to Postgres is configured: nothing it runs, and
nothing it leaves open, outlives a bound the *server* enforces.

A client-side timeout is not enough. A controller that is frozen (SIGSTOP, a stalled VM,
a GC pause) or cut off keeps its sessions open on the server, and whatever those
sessions hold (the leader lock, a share lock on the lease row) stays held until the
server drops them. So each session carries its own limits:

- ``statement_timeout``: no single query runs longer than the caller would wait for it;
- ``idle_in_transaction_session_timeout`` and ``transaction_timeout`` (Postgres 17+):
  no transaction, and so no row lock, outlives ``transaction_bound``. Ours never idle
  between statements, so an idle transaction means a frozen or broken client;
- ``idle_session_timeout`` (the lock session only): a leader that stops renewing loses
  its session, and with it the advisory lock, after ``lease_duration``;
- TCP keepalives and ``tcp_user_timeout``: a peer that vanished off the network is
  noticed in seconds, not after the kernel's two hours.

(And ``jit`` off, which is no bound: see `SessionBounds.server_settings`.)

Settings Postgres does not know (``transaction_timeout`` before 17) are left out after
one failed connect rather than failing the controller: the other bounds still hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import asyncpg


@dataclass(frozen=True, slots=True)
class SessionBounds:
    """The limits of one kind of controller session, in seconds."""

    statement_timeout: float
    transaction_bound: float
    idle_session_timeout: float | None = None
    keepalive_idle: float = 2.0
    application_name: str = "roost-controller"

    def server_settings(self, *, transaction_timeout: bool = True) -> dict[str, str]:
        def ms(seconds: float) -> str:
            return str(max(1, math.ceil(seconds * 1000)))

        idle = max(1, round(self.keepalive_idle))
        out = {
            "application_name": self.application_name[:63],
            "statement_timeout": ms(self.statement_timeout),
            "idle_in_transaction_session_timeout": ms(self.transaction_bound),
            # Probe after `idle` quiet seconds, every second, give up after three: a dead
            # peer is dropped within idle + 3 s. tcp_user_timeout bounds unacknowledged
            # data the same way while something is being sent.
            "tcp_keepalives_idle": str(idle),
            "tcp_keepalives_interval": "1",
            "tcp_keepalives_count": "3",
            "tcp_user_timeout": ms(idle + 3),
            # the controller's queries are small index reads, run every tick: compiling
            # one (tens of milliseconds, when a pool count makes its estimate large)
            # would cost more than running it
            "jit": "off",
        }
        if transaction_timeout:
            out["transaction_timeout"] = ms(self.transaction_bound)
        if self.idle_session_timeout is not None:
            out["idle_session_timeout"] = ms(self.idle_session_timeout)
        return out


CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError,
    # A query sent while asyncpg is still consuming the error that ended its session
    # (pg_terminate_backend, a server restart) fails with "cannot switch to state ...;
    # another operation is in progress": the connection is as dead as the others say.
    asyncpg.InternalClientError,
)
"""What a controller query can fail with when its connection or server goes."""

DATA_ERRORS: tuple[type[BaseException], ...] = (asyncpg.DataError,)
"""What a query fails with when Postgres refuses a value as data (SQLSTATE class 22: a
NUL in text or jsonb, a number out of range, ...). They are `CONNECTION_ERRORS` too, being
Postgres errors, but the fault is the input's, not the database's: an API that passes
input through answers them as the client's error, before it tries the others."""

_UNKNOWN_SETTING = "42704"  # undefined_object: "unrecognized configuration parameter"


def _is_unknown_transaction_timeout(exc: BaseException) -> bool:
    return (isinstance(exc, asyncpg.PostgresError)
            and getattr(exc, "sqlstate", None) == _UNKNOWN_SETTING
            and "transaction_timeout" in str(exc))


async def connect(dsn: str, bounds: SessionBounds, *, timeout: float, **kw: Any) -> Any:
    """One connection with ``bounds`` (the leader's lock session)."""
    try:
        return await asyncpg.connect(dsn, timeout=timeout, command_timeout=bounds.statement_timeout,
                                     server_settings=bounds.server_settings(), **kw)
    except asyncpg.PostgresError as exc:
        if not _is_unknown_transaction_timeout(exc):
            raise
    return await asyncpg.connect(
        dsn, timeout=timeout, command_timeout=bounds.statement_timeout,
        server_settings=bounds.server_settings(transaction_timeout=False), **kw)


async def create_pool(dsn: str, bounds: SessionBounds, *, connect_timeout: float,
                      min_size: int = 1, max_size: int = 4) -> Any:
    """A pool whose every connection carries ``bounds``; queries default to the
    statement timeout on the client side too (asyncpg's ``command_timeout``)."""
    async def make(settings: dict[str, str]) -> Any:
        return await asyncpg.create_pool(
            dsn, min_size=min_size, max_size=max_size, timeout=connect_timeout,
            command_timeout=bounds.statement_timeout, server_settings=settings,
        )

    try:
        return await make(bounds.server_settings())
    except asyncpg.PostgresError as exc:
        if not _is_unknown_transaction_timeout(exc):
            raise
    return await make(bounds.server_settings(transaction_timeout=False))
