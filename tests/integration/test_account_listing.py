"""Listing the accounts bucket against a real JetStream: each listing holds every live
entry under its prefix and nothing else (no other prefix, no deleted key), an empty
bucket lists nothing, and twenty listings at once on one connection are all whole.

The listing reads the bucket through `roost.bus.contents`, not nats-py's ``keys()``,
whose end-of-contents mark can come before every entry on a loaded host: a full-suite
run once saw `roost accounts show` list an account with no keys. That race is not
forced here (it needs the consumer's info to beat messages already sent); the repeated
listings below are where it would show."""

from __future__ import annotations

import asyncio
import os

from roost.bus.connect import connect, key_value
from roost.bus.subjects import ACCOUNTS_BUCKET
from roost.domain.accounts import Held, Usage
from roost.embedded import NatsServer
from roost.gateway.accounts import AccountStore

KEYS = 60
LISTINGS = 20


async def test_listings_hold_every_live_entry_of_their_prefix(
        nats_server: NatsServer) -> None:
    nc = await connect([nats_server.url], name="listing-test")
    try:
        store = AccountStore(await key_value(nc, ACCOUNTS_BUCKET))
        assert await store.accounts() == [] and await store.keys() == []
        operator_key = os.urandom(32)
        a = await store.create_account("alpha")
        b = await store.create_account("beta")
        made = [(await store.create_key(a.account_id, operator_key))[0].access_key_id
                for _ in range(KEYS)]
        other = (await store.create_key(b.account_id, operator_key))[0].access_key_id
        await store.change_usage(a.account_id, lambda u: Usage(
            {"i-1": Held("standard", 2, 0, 1)}, u.holds))
        await store.revoke_key(made[0])

        assert [x.account_id for x in await store.accounts()] == sorted(
            [a.account_id, b.account_id])
        want_a = set(made[1:])
        listings = await asyncio.gather(*(store.keys(a.account_id)
                                          for _ in range(LISTINGS)))
        assert all({k.access_key_id for k in got} == want_a for got in listings)
        every = {k.access_key_id for k in await store.keys()}
        assert every == want_a | {other}
    finally:
        await nc.close()
