"""Quota usage changes against a real JetStream: the changes one store is asked for at
once are written together (a group commit), two stores writing the same account never
lose a change, one change that raises fails only its own caller, and a refusal judged
on a store's own last write is judged again on what another store wrote since."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from roost.bus.connect import connect, key_value
from roost.bus.subjects import ACCOUNTS_BUCKET
from roost.domain.accounts import Held, Usage
from roost.embedded import NatsServer
from roost.gateway.accounts import AccountStore

CHANGES = 40


def _add(instance_id: str):  # type: ignore[no-untyped-def]
    def edit(usage: Usage) -> Usage:
        return Usage({**usage.instances, instance_id: Held("standard", 2, 0, 1)}, usage.holds)
    return edit


def _refuse(usage: Usage) -> Usage:
    raise ValueError("over the limit")


async def test_changes_at_once_are_written_together_and_none_is_lost(
        nats_server: NatsServer) -> None:
    nc = await connect([nats_server.url], name="usage-test")
    try:
        kv = await key_value(nc, ACCOUNTS_BUCKET)
        one, two = AccountStore(kv), AccountStore(kv)
        asks = [one.change_usage("acct", _add(f"i-a{i}")) for i in range(CHANGES)]
        asks += [two.change_usage("acct", _add(f"i-b{i}")) for i in range(CHANGES)]
        asks.insert(CHANGES // 2, one.change_usage("acct", _refuse))
        outcomes = await asyncio.gather(*asks, return_exceptions=True)
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        assert [str(e) for e in errors] == ["over the limit"]
        usage = await one.usage("acct")
        assert len(usage.instances) == 2 * CHANGES
        writes = (await kv.get("usage.acct")).revision or 0
        print(f"\n{2 * CHANGES} changes from two stores at once: the key's revision is "
              f"{writes} (every entry of the bucket counts)")
        assert writes < CHANGES  # written in batches, not one write per change

        # `one` writes last (its guess: 81 instances); `two` releases two since (79). A
        # limit that refuses on the guess but passes on the store is judged on the store.
        await one.change_usage("acct", _add("i-extra"))
        await two.change_usage("acct", lambda u: Usage(
            {k: v for k, v in u.instances.items() if k not in ("i-a0", "i-extra")},
            u.holds))

        def at_most(n: int):  # type: ignore[no-untyped-def]
            def edit(usage: Usage) -> Usage:
                if len(usage.instances) >= n:
                    raise ValueError("full")
                return Usage({**usage.instances, "i-new": Held("standard", 2, 0, 1)},
                             usage.holds)
            return edit

        await one.change_usage("acct", at_most(2 * CHANGES))
        assert "i-new" in (await two.usage("acct")).instances
        with pytest.raises(ValueError, match="full"):
            await one.change_usage("acct", at_most(2 * CHANGES))
    finally:
        await nc.close()


async def test_an_unreadable_usage_record_fails_its_changes_rather_than_hanging(
        nats_server: NatsServer) -> None:
    nc = await connect([nats_server.url], name="usage-test")
    try:
        kv = await key_value(nc, ACCOUNTS_BUCKET)
        await kv.put("usage.broken", b"not a usage record")
        store = AccountStore(kv)
        asks = [store.change_usage("broken", _add(f"i-{i}")) for i in range(3)]
        outcomes = await asyncio.wait_for(asyncio.gather(*asks, return_exceptions=True), 10)
        assert all(isinstance(o, msgspec.DecodeError) for o in outcomes), outcomes
    finally:
        await nc.close()
