"""ClientToken claims against real NATS JetStream: fenced by KV revision, taken over by
no wall clock, and never left blocking a repeat after an outage.

Two `TokenStore`s on two connections stand for two gateways. The measured times are
printed (``pytest -s``) and recorded in docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import msgspec
import pytest
from nats.aio.client import Client
from nats.js.kv import KeyValue

from roost.bus import subjects
from roost.bus.connect import connect, key_value
from roost.domain.errors import ServiceUnavailable
from roost.embedded import NatsServer
from roost.gateway.tokens import Claim, TokenEntry, TokenStore, token_key

OWNER, FP = "000000000000", "fp-1"


async def _bucket(server: NatsServer, name: str) -> tuple[Client, KeyValue]:
    nc = await connect([server.url], name=name)
    return nc, await key_value(nc, subjects.CLIENT_TOKENS_BUCKET)


@pytest.fixture
async def two(nats_server: NatsServer) -> AsyncIterator[tuple[KeyValue, KeyValue]]:
    nc1, kv1 = await _bucket(nats_server, "gw-1")
    nc2, kv2 = await _bucket(nats_server, "gw-2")
    try:
        yield kv1, kv2
    finally:
        await nc1.close()
        await nc2.close()


async def _claim(store: TokenStore, token: str = "tok", rid: str = "r-1") -> Claim:
    got = await store.claim(owner_id=OWNER, token=token, fingerprint=FP, reservation_id=rid)
    assert isinstance(got, Claim), got
    return got


async def _repeat(store: TokenStore, token: str, *, rid: str) -> Claim:
    """What a client does: retry while the bucket is unreachable (JetStream recovering
    its streams). "Still in progress" is not retried: it is what must not happen."""
    for _ in range(100):
        try:
            return await _claim(store, token, rid)
        except ServiceUnavailable as exc:
            assert "unreachable" in str(exc), exc
            await asyncio.sleep(0.1)
    raise AssertionError("the bucket stayed unreachable")


async def _entry(kv: KeyValue, token: str = "tok") -> TokenEntry:
    found = await kv.get(token_key(OWNER, token))
    return msgspec.json.decode(found.value or b"", type=TokenEntry)


async def test_a_claim_taken_over_cannot_be_finished_or_released_by_its_old_owner(
    two: tuple[KeyValue, KeyValue],
) -> None:
    kv1, kv2 = two
    # gw-1 renews only every 25 s: its claim looks dead to gw-2 after gw-2's 0.3 s lease.
    slow, quick = TokenStore(kv1, lease=100), TokenStore(kv2, lease=0.3, poll=0.05)
    try:
        old = await _claim(slow)
        new = await _claim(quick, rid="r-other")
        assert new.takeover and new.reservation_id == "r-1"  # the first reservation's id
        await slow.finish(old, fingerprint=FP, owner_id=OWNER, instances=[])
        await slow.release(old)
        assert old.lost
        cur = await _entry(kv1)
        assert cur.state == "pending" and cur.claimant == new.claimant  # untouched
        await quick.finish(new, fingerprint=FP, owner_id=OWNER, instances=[])
        assert (await _entry(kv1)).state == "done"
        replay = await slow.claim(owner_id=OWNER, token="tok", fingerprint=FP,
                                  reservation_id="r-3")
        assert isinstance(replay, TokenEntry) and replay.reservation_id == "r-1"
    finally:
        await slow.close()
        await quick.close()


async def test_a_live_claim_is_never_taken_over_whatever_its_wall_clock_says(
    two: tuple[KeyValue, KeyValue],
) -> None:
    """The claimant's wall clock an hour behind (its started_at looks ancient) and the
    repeat waiting several leases: the claim is renewed, so it stays its owner's."""
    kv1, kv2 = two
    owner, repeat = TokenStore(kv1, lease=0.4), TokenStore(kv2, lease=0.4, wait_for=1.5)
    try:
        claim = await _claim(owner)
        key = token_key(OWNER, "tok")
        found = await kv1.get(key)
        skewed = msgspec.structs.replace(await _entry(kv1), started_at=time.time() - 3600)
        claim.revision = await kv1.update(key, msgspec.json.encode(skewed),
                                          last=found.revision)
        claim.entry = skewed
        with pytest.raises(ServiceUnavailable, match="still in progress"):
            await _claim(repeat, rid="r-2")
        assert not claim.lost
        await owner.finish(claim, fingerprint=FP, owner_id=OWNER, instances=[])
        assert (await _entry(kv1)).state == "done"
    finally:
        await owner.close()
        await repeat.close()


async def test_a_request_that_ends_holding_its_claim_leaves_it_to_the_next_repeat(
    two: tuple[KeyValue, KeyValue],
) -> None:
    kv1, _ = two
    store = TokenStore(kv1, lease=30)
    try:
        async def request_that_crashes() -> None:
            await _claim(store)
            raise RuntimeError("the handler failed before finish or release")

        with pytest.raises(RuntimeError):
            await asyncio.create_task(request_that_crashes())
        start = time.monotonic()
        again = await _claim(store, rid="r-2")
        assert again.takeover and again.reservation_id == "r-1"
        assert time.monotonic() - start < 1.0  # not a 30 s lease
    finally:
        await store.close()


async def test_a_claim_abandoned_in_an_outage_never_blocks_a_repeat(
    nats_server: NatsServer,
) -> None:
    """The launch fails while NATS is down, so the release cannot land either. After the
    outage the repeat on the same gateway goes through at once; one on another gateway
    within a lease; neither waits out ``wait_for`` or answers "still in progress"."""
    nc1, kv1 = await _bucket(nats_server, "gw-1")
    nc2, kv2 = await _bucket(nats_server, "gw-2")
    here = TokenStore(kv1, lease=3, retry_every=0.5)
    there = TokenStore(kv2, lease=3, poll=0.1)
    try:
        await _claim(here, "b", rid="r-b")  # held (and renewed) by this gateway

        async def launch_during_outage(token: str) -> None:
            claim = await _claim(here, token)
            nats_server.stop()  # by pid
            await here.release(claim)  # fails: retried in the background

        await asyncio.create_task(launch_during_outage("a"))
        nats_server.start()
        while not (nc1.is_connected and nc2.is_connected):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        back = time.monotonic()
        # The same gateway: the claim it abandoned is in nobody's way.
        got = await _repeat(here, "a", rid="r-2")
        same_gateway = time.monotonic() - back
        # Another gateway, for a claim whose gateway went away (``b``, never settled).
        await here.close()
        start = time.monotonic()
        other = await _repeat(there, "b", rid="r-3")
        other_gateway = time.monotonic() - start
        print(f"\nafter the outage: same gateway {same_gateway:.2f}s, other gateway "
              f"{other_gateway:.2f}s (lease 3s)")
        assert got.reservation_id in {"r-1", "r-2"}  # taken over, or released meanwhile
        assert same_gateway < 3
        assert other.takeover and other.reservation_id == "r-b"
        assert other_gateway <= 3 + 1
    finally:
        await here.close()
        await there.close()
        await nc1.close()
        await nc2.close()
