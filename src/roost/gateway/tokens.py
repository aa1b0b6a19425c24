"""ClientToken idempotency for RunInstances, in a JetStream KV bucket with a TTL.

boto3 sends a ClientToken with every RunInstances and repeats it on each retry, so a
retry after a lost reply must return the first reservation, not launch a second one.

The bucket holds one entry per (account, token); the gateway that claims a token owns
its entry until it finishes or releases it. Every write is a compare-and-set on the KV
revision, so a gateway whose claim was taken over can neither overwrite the new owner's
result nor delete its claim:

- **claim**: an atomic KV create of a ``pending`` entry naming a fresh ``claimant``.
- **renew**: while the launch runs, the claimant rewrites its entry every
  ``lease / 4`` (update at the revision it last wrote). A live claim's revision moves.
- **finish**: ``pending -> done`` with the instances, at the claim's revision.
- **release** (the launch failed): delete at the claim's revision, so a retry launches
  afresh.
- **takeover**: a repeat that finds a ``pending`` entry watches its revision on its *own*
  monotonic clock. Unchanged for ``lease`` seconds, nobody is renewing it (its gateway
  died, or the request that claimed it ended in an outage), and the repeat takes it over
  with an update at that revision: it keeps the reservation id and launch ids and
  launches with ``reconcile_first``, so instances already placed are found, not launched
  twice. No wall clocks are compared, so two gateways' clock skew cannot matter.
- A claim this gateway knows is abandoned (the claiming request ended without finish or
  release landing, or its create timed out and may still have landed) is taken over at
  once by the next repeat here; finish and release that failed are retried in the
  background until the bucket answers. So a claim abandoned in an outage never blocks a
  fresh request for ``wait_for``, let alone answers it "still in progress".

A timeout on any step is not an answer: the entry may or may not have changed, so the
next step reads it again (by revision) before it acts. A duplicate delivery of a request
is just another repeat: it finds the claim pending (and waits, or takes it over once it
goes quiet) or done (and replays it).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import msgspec
import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from roost.bus.failures import BUS_DOWN
from roost.bus.schemas import InstanceRecord
from roost.domain.errors import IdempotentParameterMismatch, ServiceUnavailable

log = logging.getLogger(__name__)


class TokenEntry(msgspec.Struct, kw_only=True):
    state: Literal["pending", "done"]
    fingerprint: str
    reservation_id: str
    owner_id: str
    claimant: str = ""
    """Who holds a pending claim: fresh for every claim and takeover."""
    started_at: float = 0.0
    """The writer's wall clock, for people reading the bucket; never compared."""
    instances: list[InstanceRecord] = []


@dataclass(eq=False)
class Claim:
    """This request owns the token: launch under ``reservation_id``."""

    key: str
    reservation_id: str
    revision: int
    takeover: bool = False
    claimant: str = ""
    entry: TokenEntry | None = field(default=None, repr=False)
    lost: bool = False
    """Another request took the claim over: finish and release leave the entry alone."""
    renewing: bool = True
    renewer: asyncio.Task[None] | None = field(default=None, repr=False)
    """Cleared when the claim is settled or abandoned: its renewer stops at its next step.
    The renewer is cancelled too, but never awaited: a cancellation that races a reply can
    be lost (Python 3.11's ``wait_for``), and a request must not hang on it."""


def fingerprint(parts: tuple[object, ...]) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def token_key(owner_id: str, token: str) -> str:
    return hashlib.sha256(f"{owner_id}\0{token}".encode()).hexdigest()


_V = TypeVar("_V")
_Step = Callable[[], Awaitable[object]]
_MISSING: tuple[type[BaseException], ...] = (nats.js.errors.KeyNotFoundError,
                                            nats.js.errors.KeyDeletedError)
_WRONG_REVISION = nats.js.errors.KeyWrongLastSequenceError


class TokenStore:
    def __init__(
        self,
        kv: KeyValue,
        *,
        lease: float = 10.0,
        wait_for: float = 30.0,
        poll: float = 0.1,
        retry_every: float = 2.0,
        give_up_after: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        max_watched: int = 10_000,
    ) -> None:
        self._kv = kv
        self._lease = lease
        self._wait_for = wait_for
        self._poll = poll
        self._retry_every = retry_every
        self._give_up_after = give_up_after
        self._clock = clock
        self._max_watched = max_watched
        self._renewers: set[asyncio.Task[None]] = set()
        self._background: set[asyncio.Task[None]] = set()
        self._abandoned: OrderedDict[str, str] = OrderedDict()
        """key -> claimant of a pending entry nobody here works on any more."""
        self._watched: OrderedDict[str, tuple[int, float, float]] = OrderedDict()
        """key -> (revision, first and last time this gateway saw it) of pending entries."""

    # ---- claim ------------------------------------------------------------------------

    async def claim(
        self, *, owner_id: str, token: str, fingerprint: str, reservation_id: str
    ) -> Claim | TokenEntry:
        """A `Claim` to go ahead, or the finished entry of an earlier identical request.

        Raises IdempotentParameterMismatch if the token was used with other parameters,
        ServiceUnavailable if the bucket is unreachable or another live request still
        holds the token after ``wait_for``.
        """
        key = token_key(owner_id, token)
        deadline = self._clock() + self._wait_for
        while True:
            try:
                found = await self._try_claim(key, owner_id, fingerprint, reservation_id)
            except _Pending:
                if self._clock() >= deadline:
                    raise ServiceUnavailable(
                        "A request with this ClientToken is still in progress; retry later."
                    ) from None
                await asyncio.sleep(self._poll)
                continue
            if isinstance(found, Claim):
                self._hold(found)
            return found

    async def _try_claim(self, key: str, owner_id: str, fp: str, rid: str) -> Claim | TokenEntry:
        claimant = secrets.token_hex(8)
        entry = TokenEntry(state="pending", fingerprint=fp, reservation_id=rid,
                           owner_id=owner_id, claimant=claimant, started_at=time.time())
        try:
            rev = await self._kv.create(key, msgspec.json.encode(entry))
            return Claim(key, rid, rev, claimant=claimant, entry=entry)
        except _WRONG_REVISION:
            pass
        except BUS_DOWN as exc:
            # The create may still land (a reconnecting client sends what it buffered):
            # a claim nobody works on, which the next repeat here takes over at once.
            self._remember(self._abandoned, key, claimant)
            self._outage()
            raise ServiceUnavailable(f"The idempotency store is unreachable: {exc!r}") from None
        try:
            found = await self._kv.get(key)
        except _MISSING:
            raise _Pending from None  # deleted between create and get: go round again
        except BUS_DOWN as exc:
            self._outage()
            raise ServiceUnavailable(f"The idempotency store is unreachable: {exc!r}") from None
        cur = msgspec.json.decode(found.value or b"", type=TokenEntry)
        if cur.fingerprint != fp:
            raise IdempotentParameterMismatch(
                "The client token was already used with different parameters."
            )
        if cur.state == "done":
            self._forget(key)
            return cur
        rev = int(found.revision or 0)
        abandoned = self._abandoned.get(key) == cur.claimant
        if not abandoned and not self._quiet_for_a_lease(key, rev):
            raise _Pending
        taken = msgspec.structs.replace(cur, claimant=claimant, started_at=time.time())
        try:
            new_rev = await self._kv.update(key, msgspec.json.encode(taken), last=rev)
        except _WRONG_REVISION:
            raise _Pending from None  # renewed, finished or taken by another meanwhile
        except BUS_DOWN as exc:
            self._remember(self._abandoned, key, claimant)  # it may have landed
            raise ServiceUnavailable(f"The idempotency store is unreachable: {exc!r}") from None
        self._forget(key)
        log.warning("taking over ClientToken claim for reservation %s (%s)", cur.reservation_id,
                    "abandoned here" if abandoned else f"not renewed for {self._lease:g}s")
        return Claim(key, cur.reservation_id, new_rev, takeover=True, claimant=claimant,
                     entry=taken)

    def _quiet_for_a_lease(self, key: str, revision: int) -> bool:
        """Whether this pending entry has stayed at ``revision`` for a whole lease, by
        this gateway's monotonic clock: the only clock it can trust."""
        now = self._clock()
        seen = self._watched.get(key)
        # A gap in the watching (no repeat asked for a while) may hide an outage during
        # which nobody could renew: the watch starts again.
        gap = max(self._lease / 2, 3 * self._poll)
        if seen is None or seen[0] != revision or now - seen[2] > gap:
            self._remember(self._watched, key, (revision, now, now))
            return False
        self._watched[key] = (revision, seen[1], now)
        return now - seen[1] >= self._lease

    def _outage(self) -> None:
        """While the bucket is unreachable nobody can renew a claim: a quiet spell that
        spans an outage proves nothing, so every watch starts again."""
        self._watched.clear()

    def _remember(self, table: OrderedDict[str, _V], key: str, value: _V) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > self._max_watched:
            table.popitem(last=False)

    def _forget(self, key: str) -> None:
        self._watched.pop(key, None)
        self._abandoned.pop(key, None)

    # ---- holding a claim ------------------------------------------------------------------

    def _hold(self, claim: Claim) -> None:
        """Renew ``claim`` while the request that made it runs."""
        claim.renewer = renewer = asyncio.create_task(
            self._renew(claim), name=f"client-token-renew {claim.reservation_id}")
        self._renewers.add(renewer)
        renewer.add_done_callback(self._renewers.discard)
        owner = asyncio.current_task()
        if owner is not None:
            owner.add_done_callback(lambda _t: self._request_ended(claim))

    def _request_ended(self, claim: Claim) -> None:
        """The request ended holding the claim (neither finished nor released it): stop
        renewing, and let the next repeat here take it over at once."""
        if claim.renewing:
            self._stop_renewing(claim)
            if not claim.lost:
                self._remember(self._abandoned, claim.key, claim.claimant)

    async def _renew(self, claim: Claim) -> None:
        period = self._lease / 4
        assert claim.entry is not None
        value = msgspec.json.encode(claim.entry)
        started = self._clock()
        while claim.renewing and self._clock() - started < self._give_up_after:
            await asyncio.sleep(period)
            if not claim.renewing:
                return
            try:
                rev = await self._kv.update(claim.key, value, last=claim.revision)
            except _WRONG_REVISION:
                # A finish or release of ours, or our own update that timed out, may
                # have landed first: only a claim still pending for us goes on.
                if not claim.renewing or await self._still_ours(claim):
                    continue
                claim.lost = True
                log.warning("ClientToken claim for reservation %s was taken over",
                            claim.reservation_id)
                return
            except BUS_DOWN as exc:
                self._outage()
                log.info("could not renew ClientToken claim %s: %r", claim.reservation_id, exc)
                continue
            if claim.renewing:
                claim.revision = rev

    async def _still_ours(self, claim: Claim) -> bool:
        """After a revision mismatch: a write of ours that timed out may have landed
        after all. If the entry still names this claim pending, go on from its revision."""
        try:
            found = await self._kv.get(claim.key)
        except (*_MISSING, *BUS_DOWN):
            return False
        cur = msgspec.json.decode(found.value or b"", type=TokenEntry)
        if cur.state == "pending" and cur.claimant == claim.claimant:
            claim.revision = int(found.revision or 0)
            return True
        return False

    def _stop_renewing(self, claim: Claim) -> None:
        claim.renewing = False
        if claim.renewer is not None:
            claim.renewer.cancel()

    # ---- finishing ------------------------------------------------------------------------

    async def known(self, *, owner_id: str, token: str) -> bool:
        """Whether a request has used this token (an unreachable store counts as yes,
        so the caller takes the path that reports it)."""
        try:
            await self._kv.get(token_key(owner_id, token))
        except _MISSING:
            return False
        except BUS_DOWN:
            return True
        return True

    async def finish(self, claim: Claim, *, fingerprint: str, owner_id: str,
                     instances: list[InstanceRecord]) -> None:
        """Record the result at the claim's revision; retried in the background while
        the bucket is unreachable (a repeat meanwhile takes the claim over and finds the
        same instances by launch id)."""
        self._stop_renewing(claim)
        entry = TokenEntry(state="done", fingerprint=fingerprint,
                           reservation_id=claim.reservation_id, owner_id=owner_id,
                           claimant=claim.claimant, started_at=time.time(),
                           instances=instances)
        value = msgspec.json.encode(entry)
        async def step() -> object:
            return await self._kv.update(claim.key, value, last=claim.revision)

        await self._settle(claim, "record the result of", step)

    async def release(self, claim: Claim) -> None:
        """Forget a claim whose launch failed, so that a retry launches afresh; only the
        claim this request holds, never one taken over since."""
        self._stop_renewing(claim)
        async def step() -> object:
            return await self._kv.delete(claim.key, last=claim.revision)

        await self._settle(claim, "release", step)

    async def _settle(self, claim: Claim, what: str, step: _Step) -> None:
        if claim.lost:
            return
        try:
            try:
                await step()
            except _WRONG_REVISION:
                if not await self._still_ours(claim):
                    raise
                await step()
        except _WRONG_REVISION:
            claim.lost = True
            log.warning("ClientToken claim for reservation %s was taken over; its new "
                        "owner will %s it", claim.reservation_id, what)
            return
        except BUS_DOWN as exc:
            log.error("could not %s ClientToken claim %s: %r; retrying in the background",
                      what, claim.reservation_id, exc)
            self._remember(self._abandoned, claim.key, claim.claimant)
            task = asyncio.create_task(self._settle_later(claim, what, step))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            return
        self._forget(claim.key)

    async def _settle_later(self, claim: Claim, what: str, step: _Step) -> None:
        started = self._clock()
        while self._clock() - started < self._give_up_after:
            await asyncio.sleep(self._retry_every)
            if self._abandoned.get(claim.key) != claim.claimant:
                return  # taken over here meanwhile
            try:
                await step()
            except _WRONG_REVISION:
                if await self._still_ours(claim):
                    continue
                return  # done after all, or taken over elsewhere
            except BUS_DOWN:
                continue
            self._forget(claim.key)
            log.info("ClientToken claim %s: %s done after the outage", claim.reservation_id,
                     what)
            return

    async def close(self) -> None:
        """Stop renewing and retrying (a gateway shutting down): its claims go quiet and
        are taken over after a lease."""
        tasks = [*self._renewers, *self._background]
        for t in tasks:
            t.cancel()
        if tasks:  # bounded: a cancellation lost in a race must not hang a shutdown
            await asyncio.wait(tasks, timeout=2.0)


class _Pending(Exception):
    """Another request holds the token and is still working on it."""
