"""Connecting to NATS, and the JetStream KV buckets roost uses."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import KeyValueConfig
from nats.js.errors import APIError, BucketNotFoundError
from nats.js.kv import KeyValue

from roost.bus.auth import NatsAuth
from roost.bus.contents import Contents, delivered_seq

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
    nc: Client, bucket: str, *, ttl: float | None = None, history: int = 1, attempts: int = 50,
    direct: bool = False,
) -> KeyValue:
    """Open ``bucket``, creating it if it does not exist yet (``direct``: answering
    direct gets, which `last_values` needs; a bucket made before keeps what it has).

    In a fresh cluster, JetStream may still be electing its meta leader: retry briefly
    rather than fail a start that would succeed a second later. A bucket made on a
    cluster gets three copies, so losing one server loses no bucket and blocks no write;
    one server keeps it on itself. Three is asked for whatever the connected server
    named on connecting (one that had not met all its routes yet named fewer, and a
    bucket of two copies on three servers is lost with either of its two). Only when
    JetStream goes on refusing to place them (`PLACEMENT_REFUSALS`) is one fewer asked
    for: a cluster of two servers, or one whose third server has not joined yet.
    """
    js = nc.jetstream()
    replicas = 3 if _clustered(nc) else 1
    refused = 0  # refusals in a row to place `replicas` copies
    last: Exception | None = None
    for attempt in range(attempts):
        if attempt and attempt % 10 == 0:  # a start waiting on JetStream says so
            log.warning("JetStream KV bucket %s not available yet (%d attempts of %d): %r",
                        bucket, attempt, attempts, last)
        try:
            try:
                kv = await js.key_value(bucket)
                await _check_copies(nc, bucket)
                return kv
            except BucketNotFoundError:
                return await js.create_key_value(KeyValueConfig(
                    bucket=bucket, history=history, ttl=ttl, replicas=replicas,
                    direct=direct or None))
        except APIError as exc:
            last = exc
            if exc.err_code == NO_SUITABLE_PEERS and replicas > 1:
                refused += 1
                if refused >= PLACEMENT_REFUSALS:
                    replicas, refused = replicas - 1, 0
                    log.warning("JetStream places no %d copies of bucket %s (%s): asking "
                                "for %d", replicas + 1, bucket, exc.description, replicas)
            await asyncio.sleep(0.2)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
            last = exc
            await asyncio.sleep(0.2)
    raise RuntimeError(f"JetStream KV bucket {bucket!r} unavailable: {last}")


NO_SUITABLE_PEERS = 10005
"""JetStream's error code for a stream it cannot place ("no suitable peers for
placement"): more copies than the servers it knows of (one that is down still counts:
the meta group remembers every server that ever joined it), or none with room."""

PLACEMENT_REFUSALS = 10
"""Refusals in a row (0.2 s apart, so at least 2 s) before `key_value` asks for one
copy fewer: a cluster still forming may not have met its last server yet. Each bucket
waits this out on its own, once, when it is made: a bucket is made once in a
cluster's life."""


async def _check_copies(nc: Client, bucket: str) -> None:
    """Warn of a bucket found on a cluster with fewer copies than its servers could
    hold: made while a server had not joined yet, or by an earlier roost that counted
    the servers the connected one named. It is not scaled up here: JetStream would
    place a copy on a server that is down, and the bucket would then need every server
    that is up to take a write. Opening the bucket never fails for this."""
    if not _clustered(nc):
        return
    servers = len(nc._server_info.get("connect_urls") or ())
    try:
        info = await nc.jetstream().stream_info(f"KV_{bucket}")
    except (APIError, nats.errors.TimeoutError, nats.errors.NoRespondersError):
        return  # the bucket's own reads and writes will say what is wrong
    have = info.config.num_replicas or 1
    if have < min(3, servers):
        log.warning("bucket %s has %d copies on a NATS cluster of %d servers: losing a "
                    "server that holds one can stop its writes. With every server up, "
                    "give it %d: nats stream edit KV_%s --replicas %d", bucket, have,
                    servers, min(3, servers), bucket, min(3, servers))


def _clustered(nc: Client) -> bool:
    return bool(nc._server_info.get("cluster"))  # nats-py keeps the server's INFO private


class NoDirectGet(Exception):
    """The bucket does not answer a batched direct get (made without ``direct``, or a
    server older than 2.11): read it through a watch instead."""


_DIRECT_BATCH = 1024


async def last_values(nc: Client, bucket: str, keys: str, *, timeout: float
                      ) -> dict[str, bytes]:
    """The current value of every key of ``bucket`` matching ``keys`` (a subject filter
    such as ``node-1.>``), deleted ones left out: one batched direct get, so no
    JetStream consumer is made (a watch makes one, and a stream takes about a thousand).

    Hand-written because nats-py has no batched direct get: the request is JetStream's
    ``multi_last`` (nats-server 2.11+), answered by one message per key and an
    end-of-batch status (204), or 404 when no key matches."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    prefix = f"$KV.{bucket}."
    out: dict[str, bytes] = {}
    try:
        await nc.publish(f"$JS.API.DIRECT.GET.KV_{bucket}", reply=inbox,
                         payload=b'{"multi_last":["%s"],"batch":%d}' % (
                             (prefix + keys).encode(), _DIRECT_BATCH))
        async with asyncio.timeout(timeout):
            while True:
                msg = await sub.next_msg(timeout=None)  # the whole read is bounded above
                headers = msg.headers or {}
                status = headers.get("Status")
                if status == "404":
                    return out
                if status == "204":
                    if headers.get("Nats-Num-Pending", "0") != "0":
                        raise NoDirectGet(f"more than {_DIRECT_BATCH} keys")
                    return out
                if status is not None:  # 503: no direct get here; 408 and others
                    raise NoDirectGet(f"status {status} {headers.get('Description', '')}")
                if headers.get("KV-Operation") in ("DEL", "PURGE"):
                    continue
                out[headers.get("Nats-Subject", "").removeprefix(prefix)] = msg.data
    finally:
        await sub.unsubscribe()


WATCH_IDLE = 30.0
"""Seconds a watch's consumer outlives its subscriber (a client cut off longer gets a
new one: nats-py's ordered consumer makes it again from where it was)."""

STREAM_CREATED = "$JS.EVENT.ADVISORY.STREAM.CREATED.{stream}"
"""The advisory JetStream publishes when a stream (a KV bucket is stream ``KV_<name>``)
is created: the cue that a bucket was deleted and made again."""


async def follow_bucket(kv: KeyValue, what: str, *, on_entry: Callable[[KeyValue.Entry], None],
                        synced: asyncio.Event, meta_only: bool = False,
                        keys: str = ">") -> None:
    """Follow ``kv`` (its ``keys``, all by default) for good, handing each entry to
    ``on_entry``; ``synced`` is set once the current contents have been delivered.
    Re-watches after any failure, with a short
    backoff, so a mirror outlives a NATS restart. Runs until cancelled.

    A bucket deleted and created again is re-watched as soon as JetStream announces the
    new stream. nats-py's watch is an ordered consumer: with the stream gone it hears no
    heartbeats, resets itself only after two missed ones (10 s), fails while the stream
    is absent and tries again 10 s later, and then resumes at the *old* stream's next
    sequence, skipping the new stream's first entries. Left to itself a mirror came back
    after about 20 s, and could miss records.
    """
    recreated = asyncio.Event()

    async def on_created(_msg: Msg) -> None:
        recreated.set()

    # nats-py keeps the context's connection and the bucket's stream name private.
    nc: Client = kv._js._nc
    advisory = await nc.subscribe(STREAM_CREATED.format(stream=kv._stream),
                                  cb=on_created)
    try:
        while True:
            try:
                recreated.clear()
                # The server drops a watch's consumer WATCH_IDLE seconds after its
                # subscriber goes (nats-py's default is 5 minutes): each re-watch leaves
                # one behind, and a stream takes about a thousand.
                watcher = await kv.watch(keys, meta_only=meta_only,
                                         inactive_threshold=WATCH_IDLE)
                try:
                    if await _deliver_until(watcher, on_entry, synced, recreated):
                        log.warning("the %s bucket was created anew; re-watching", what)
                        continue
                finally:
                    await watcher.stop()  # type: ignore[no-untyped-call]
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("watch of the %s bucket failed (%r); re-watching", what, exc)
            await asyncio.sleep(1.0)
    finally:
        with contextlib.suppress(Exception):
            await advisory.unsubscribe()


class _Progress:
    delivered = 0
    """Bucket entries handed on by every `follow_bucket` of this process."""


_PROGRESS = _Progress()


def entries_delivered() -> int:
    """How many bucket entries this process's mirrors have taken in so far."""
    return _PROGRESS.delivered


async def until_synced(wait: Awaitable[object], *, stall: float, what: str) -> None:
    """Await ``wait`` (mirrors catching up with their buckets) for as long as entries
    keep coming: fail with TimeoutError only after ``stall`` seconds in which none came.

    A fixed deadline failed a gateway restarted beside 100,000 instances, whose mirrors
    take in several hundred thousand entries at start on a busy host; a bus that says
    nothing still fails as fast as before. Logs progress while it waits."""
    task = asyncio.ensure_future(wait)
    seen = entries_delivered()
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=stall)
            if done:
                task.result()
                return
            now = entries_delivered()
            if now == seen:
                raise TimeoutError(f"{what}: no bucket entry came for {stall:g} s "
                                   f"({now} taken in so far)")
            log.info("%s: still catching up (%d bucket entries so far)", what, now)
            seen = now
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _deliver_until(watcher: KeyValue.KeyWatcher,
                         on_entry: Callable[[KeyValue.Entry], None], synced: asyncio.Event,
                         recreated: asyncio.Event) -> bool:
    """Hand the watch's entries on until it ends (False) or ``recreated`` is set (True).

    ``synced`` is set once the contents the server had sent by the watch's
    end-of-contents mark have been handed on (`roost.bus.contents`: the mark alone can
    come before them)."""
    contents = Contents(lambda: delivered_seq(watcher))

    async def pump() -> None:
        async for entry in watcher:
            if entry is not None:
                _PROGRESS.delivered += 1
                on_entry(entry)
            if not synced.is_set() and await contents.see(entry):
                synced.set()

    pumping = asyncio.ensure_future(pump())
    waiting = asyncio.ensure_future(recreated.wait())
    try:
        await asyncio.wait({pumping, waiting}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (pumping, waiting):
            task.cancel()
        await asyncio.gather(pumping, waiting, return_exceptions=True)
    failed = pumping.exception() if pumping.done() and not pumping.cancelled() else None
    if failed is not None:
        raise failed
    return recreated.is_set()


class BucketMirror:
    """A mirror of one bucket: `follow_bucket` as a background task that the mirror
    starts, waits on until the bucket's contents are in, and stops. Subclasses take each
    entry in `_on_entry`."""

    def __init__(self, kv: KeyValue, what: str) -> None:
        self._kv, self._what = kv, what
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _on_entry(self, entry: KeyValue.Entry) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._task = asyncio.create_task(
            follow_bucket(self._kv, self._what, on_entry=self._on_entry,
                          synced=self._synced), name=f"watch-{self._what}")

    async def wait_synced(self, timeout: float | None) -> None:
        await asyncio.wait_for(self._synced.wait(), timeout)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
