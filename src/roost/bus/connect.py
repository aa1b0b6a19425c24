"""Connecting to NATS, and the JetStream KV buckets roost uses."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import nats
from nats.aio.client import Client
from nats.js.errors import APIError, BucketNotFoundError
from nats.js.kv import KeyValue

from roost.bus.auth import NatsAuth

log = logging.getLogger(__name__)


async def connect(
    servers: Sequence[str], *, name: str, connect_timeout: float = 5.0,
    auth: NatsAuth | None = None,
) -> Client:
    """A connection that reconnects forever: a node or gateway outlives a NATS restart.
    ``auth`` carries the user's credentials and TLS (`roost.bus.auth`); without it the
    connection is anonymous, which a server with users configured refuses."""

    async def on_error(exc: Exception) -> None:
        log.warning("nats error (%s): %s", name, exc)

    return await nats.connect(
        servers=list(servers),
        name=name,
        connect_timeout=connect_timeout,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        error_cb=on_error,
        allow_reconnect=True,
        **(auth.options() if auth is not None else {}),
    )


async def key_value(
    nc: Client, bucket: str, *, ttl: float | None = None, history: int = 1, attempts: int = 50
) -> KeyValue:
    """Open ``bucket``, creating it if it does not exist yet.

    In a fresh cluster, JetStream may still be electing its meta leader: retry briefly
    rather than fail a start that would succeed a second later.
    """
    js = nc.jetstream()
    last: Exception | None = None
    for _ in range(attempts):
        try:
            try:
                return await js.key_value(bucket)
            except BucketNotFoundError:
                return await js.create_key_value(bucket=bucket, history=history, ttl=ttl)
        except (nats.errors.TimeoutError, APIError, nats.errors.NoRespondersError) as exc:
            last = exc
            await asyncio.sleep(0.2)
    raise RuntimeError(f"JetStream KV bucket {bucket!r} unavailable: {last}")


async def follow_bucket(kv: KeyValue, what: str, *, on_entry: Callable[[KeyValue.Entry], None],
                        synced: asyncio.Event, meta_only: bool = False) -> None:
    """Follow ``kv`` for good, handing each entry to ``on_entry``; ``synced`` is set once
    the current contents have been delivered. Re-watches after any failure, with a short
    backoff, so a mirror outlives a NATS restart. Runs until cancelled."""
    while True:
        try:
            watcher = await kv.watchall(meta_only=meta_only)
            try:
                async for entry in watcher:
                    if entry is None:
                        synced.set()
                        continue
                    on_entry(entry)
            finally:
                await watcher.stop()  # type: ignore[no-untyped-call]
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("watch of the %s bucket failed (%r); re-watching", what, exc)
            await asyncio.sleep(1.0)
