"""ClientToken idempotency for RunInstances, in a JetStream KV bucket with a TTL.

boto3 sends a ClientToken with every RunInstances and repeats it on each retry, so a
retry after a lost reply must return the first reservation, not launch a second one.

A token's entry moves ``pending -> done`` (or is deleted if the launch failed, so a
retry may try again). The first request claims the token with an atomic KV create. A
repeat that finds it pending waits for it; if the pending entry outlives
``takeover_after`` (its gateway died mid-launch), the repeat takes the claim over, keeps
the reservation id and launch ids, and launches with ``reconcile_first`` so instances the
dead gateway already placed are found, not launched twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import msgspec
import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from roost.bus.schemas import InstanceRecord
from roost.domain.errors import IdempotentParameterMismatch, ServiceUnavailable

log = logging.getLogger(__name__)


class TokenEntry(msgspec.Struct, kw_only=True):
    state: Literal["pending", "done"]
    fingerprint: str
    reservation_id: str
    owner_id: str
    started_at: float
    instances: list[InstanceRecord] = []


@dataclass(frozen=True, slots=True)
class Claim:
    """This request owns the token: launch under ``reservation_id``."""

    key: str
    reservation_id: str
    revision: int
    takeover: bool = False


def fingerprint(parts: tuple[object, ...]) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def token_key(owner_id: str, token: str) -> str:
    return hashlib.sha256(f"{owner_id}\0{token}".encode()).hexdigest()


_KV_DOWN = (nats.errors.Error, asyncio.TimeoutError)


class TokenStore:
    def __init__(
        self,
        kv: KeyValue,
        *,
        takeover_after: float = 60.0,
        wait_for: float = 30.0,
        poll: float = 0.1,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._kv = kv
        self._takeover_after = takeover_after
        self._wait_for = wait_for
        self._poll = poll
        self._wall = wall

    async def claim(
        self, *, owner_id: str, token: str, fingerprint: str, reservation_id: str
    ) -> Claim | TokenEntry:
        """A `Claim` to go ahead, or the finished entry of an earlier identical request.

        Raises IdempotentParameterMismatch if the token was used with other parameters.
        """
        key = token_key(owner_id, token)
        waited = 0.0
        while True:
            try:
                return await self._try_claim(key, owner_id, fingerprint, reservation_id)
            except _Pending:
                if waited >= self._wait_for:
                    raise ServiceUnavailable(
                        "A request with this ClientToken is still in progress; retry later."
                    ) from None
                await asyncio.sleep(self._poll)
                waited += self._poll

    async def _try_claim(self, key: str, owner_id: str, fp: str, rid: str) -> Claim | TokenEntry:
        entry = TokenEntry(state="pending", fingerprint=fp, reservation_id=rid,
                           owner_id=owner_id, started_at=self._wall())
        try:
            rev = await self._kv.create(key, msgspec.json.encode(entry))
            return Claim(key, rid, rev)
        except nats.js.errors.KeyWrongLastSequenceError:
            pass
        except _KV_DOWN as exc:
            raise ServiceUnavailable(f"The idempotency store is unreachable: {exc!r}") from None
        try:
            found = await self._kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            raise _Pending from None  # deleted between create and get: go round again
        except _KV_DOWN as exc:
            raise ServiceUnavailable(f"The idempotency store is unreachable: {exc!r}") from None
        cur = msgspec.json.decode(found.value or b"", type=TokenEntry)
        if cur.fingerprint != fp:
            raise IdempotentParameterMismatch(
                "The client token was already used with different parameters."
            )
        if cur.state == "done":
            return cur
        if self._wall() - cur.started_at < self._takeover_after:
            raise _Pending
        taken = msgspec.structs.replace(cur, started_at=self._wall())
        try:
            rev = await self._kv.update(key, msgspec.json.encode(taken), last=found.revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            raise _Pending from None
        log.warning("taking over ClientToken claim for reservation %s", cur.reservation_id)
        return Claim(key, cur.reservation_id, rev, takeover=True)

    async def known(self, *, owner_id: str, token: str) -> bool:
        """Whether a request has used this token (an unreachable store counts as yes,
        so the caller takes the path that reports it)."""
        try:
            await self._kv.get(token_key(owner_id, token))
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return False
        except _KV_DOWN:
            return True
        return True

    async def finish(self, claim: Claim, *, fingerprint: str, owner_id: str,
                     instances: list[InstanceRecord]) -> None:
        entry = TokenEntry(state="done", fingerprint=fingerprint,
                           reservation_id=claim.reservation_id, owner_id=owner_id,
                           started_at=self._wall(), instances=instances)
        try:
            await self._kv.put(claim.key, msgspec.json.encode(entry))
        except _KV_DOWN as exc:
            log.error("could not record ClientToken result for %s: %r", claim.reservation_id, exc)

    async def release(self, claim: Claim) -> None:
        """Forget a claim whose launch failed, so that a retry launches afresh."""
        try:
            await self._kv.delete(claim.key)
        except _KV_DOWN as exc:
            log.error("could not release ClientToken for %s: %r", claim.reservation_id, exc)


class _Pending(Exception):
    """Another request holds the token and is still working on it."""
