"""The one place NATS's exceptions are sorted. Both tuples are transient failures of
the bus, which callers turn into `roost.domain.errors.ServiceUnavailable` (or retry):
never a capacity answer, never a 500."""

from __future__ import annotations

import nats.errors

BUS_DOWN: tuple[type[BaseException], ...] = (nats.errors.Error, TimeoutError)
"""Any failure of a KV or request call on the bus: disconnected, timed out, no stream
responded. (asyncio's TimeoutError is the builtin since Python 3.11.)"""

UNREACHABLE: tuple[type[BaseException], ...] = (
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.ConnectionDrainingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    nats.errors.NoServersError,
)
"""The connection itself is down, so a request was not sent: unlike a timeout, which
may follow a request that was delivered and carried out."""
