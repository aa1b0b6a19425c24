"""Reservations against the accounts' quotas.

What an account holds is its instances as this gateway's mirror counts them
(`InstanceIndex.tally`) plus ``usage.<id>`` of the accounts bucket, changed with
compare-and-set (`AccountStore.change_usage`): a launch holds before it places, and its
hold becomes one entry per instance, kept only until every mirror shows the instance
(`roost.domain.accounts.Usage`). An instance that stops or ends stops counting as the
mirrors see it do so, with no write. Accounts with no limit set hold nothing. The
decision itself is pure (`roost.domain.accounts.check`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

import msgspec
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from roost.bus.connect import follow_bucket
from roost.bus.schemas import InstanceRecord, decode
from roost.domain.accounts import (
    COUNTED_STATES,
    DEFAULT_ACCOUNT,
    Held,
    Quotas,
    Tally,
    Usage,
    check,
    demand,
)
from roost.domain.catalog import InstanceType
from roost.domain.errors import InstanceLimitExceeded, ServiceUnavailable, VcpuLimitExceeded
from roost.gateway.accounts import AccountStore, KeyBook

log = logging.getLogger(__name__)


def weigher(types: Callable[[str], InstanceType | None]
            ) -> Callable[[InstanceRecord], Held | None]:
    """What a mirrored instance counts against its account's quotas, by its type
    (`InstanceIndex.weigh`). A type this gateway does not know yet (a node's own, not
    asked for here) counts nothing until the record's next change after it is learnt."""
    weights: dict[str, Held] = {}

    def weigh(rec: InstanceRecord) -> Held | None:
        found = weights.get(rec.instance_type)
        if found is None:
            itype = types(rec.instance_type)
            if itype is None:
                return None
            found = weights[rec.instance_type] = demand(itype, 1, 0.0)
        return found

    return weigh


async def counted_now(records: KeyValue, account_id: str, usage: Usage,
                      types: Callable[[str], InstanceType | None], *,
                      timeout: float = 30.0) -> tuple[Tally, int]:
    """What ``account_id`` holds, as a gateway would count it, from a read of the
    instances bucket (for `roost accounts show`), and how many of its counted
    instances are of types ``types`` does not know (left out of the sums)."""
    states: dict[str, str] = {}
    launched: dict[str, int] = {}
    tally, unknown = Tally(), 0
    weigh = weigher(types)
    mine: dict[str, InstanceRecord] = {}

    def on_entry(entry: KeyValue.Entry) -> None:
        if entry.operation in (KV_DEL, KV_PURGE):
            mine.pop(entry.key, None)
            return
        try:
            rec = decode(entry.value or b"", InstanceRecord)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
            return
        mine[rec.instance_id] = rec

    synced = asyncio.Event()
    reading = asyncio.create_task(follow_bucket(records, "instances", on_entry=on_entry,
                                                synced=synced))
    try:
        await asyncio.wait_for(synced.wait(), timeout)
    finally:
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
    for rec in mine.values():
        if (rec.owner_id or DEFAULT_ACCOUNT) != account_id:
            continue
        states[rec.instance_id] = rec.state
        launched[rec.reservation_id] = launched.get(rec.reservation_id, 0) + 1
        if rec.state in COUNTED_STATES:
            held = weigh(rec)
            if held is None:
                unknown += 1
            else:
                tally.add(held)
    return (usage.counted(time.time(), tally, states.get,
                          lambda rid: launched.get(rid, 0)), unknown)


class QuotaBook:
    """Reservations against the accounts' quotas: a launch holds before it places, and
    its hold becomes one entry per instance until the mirrors show the instance."""

    def __init__(self, store: AccountStore, keys: KeyBook,
                 state_of: Callable[[str], str | None], tally: Callable[[str], Tally],
                 launched: Callable[[str], int]) -> None:
        self.store = store
        self.keys = keys
        self._state_of = state_of
        """The mirror's state of an instance, None without a record."""
        self._tally = tally
        """Account -> what its instances count as the mirror has them."""
        self._launched = launched
        """Reservation id -> how many of its instances the mirror holds."""

    def _limits(self, account_id: str) -> Quotas | None:
        """The account's quotas if any limit is set: an account without one (or
        without a record) holds nothing and writes nothing."""
        quotas = self.keys.quotas(account_id)
        return quotas if quotas is not None and quotas.limited else None

    def counts(self, account_id: str) -> bool:
        """Whether the account's launches and starts hold against a limit."""
        return self._limits(account_id) is not None

    def _held(self, account_id: str, usage: Usage, now: float) -> Tally:
        return usage.counted(now, self._tally(account_id), self._state_of, self._launched)

    async def reserve(self, account_id: str, hold_id: str, want: Callable[[int], Held],
                      *, min_count: int, max_count: int) -> int:
        """Hold the most of ``max_count`` instances (at least ``min_count``) the quotas
        allow; returns how many, or raises EC2's limit error for ``min_count``. Accounts
        without a limit hold nothing: ``max_count`` at once."""
        quotas = self._limits(account_id)
        if quotas is None:
            return max_count
        granted = 0

        def edit(usage: Usage) -> Usage:
            nonlocal granted
            now = time.time()
            usage = usage.pruned(now, self._state_of)
            held = self._held(account_id, usage, now)
            for n in range(max_count, min_count - 1, -1):
                try:
                    check(quotas, held, want(n))
                except (VcpuLimitExceeded, InstanceLimitExceeded):
                    if n == min_count:
                        raise
                    continue
                granted = n
                return msgspec.structs.replace(usage,
                                               holds={**usage.holds, hold_id: want(n)})
            return usage  # min_count > max_count never reaches here

        await self.store.change_usage(account_id, edit)
        return granted

    async def hold_instance(self, account_id: str, instance_id: str, held: Held) -> bool:
        """A stopped instance starting counts against the quotas again (EC2's are on
        running instances): held as it starts, or refused with EC2's limit error.
        False when the account has no limit (nothing held, nothing to give back)."""
        quotas = self._limits(account_id)
        if quotas is None:
            return False
        entry = msgspec.structs.replace(held, starting=True)

        def edit(usage: Usage) -> Usage:
            now = time.time()
            usage = usage.pruned(now, self._state_of)
            if self._state_of(instance_id) not in ("stopping", "stopped"):
                return usage  # running already (a racing start): counted by the mirrors
            check(quotas, self._held(account_id, usage, now), entry)
            return Usage({**usage.instances,
                          instance_id: msgspec.structs.replace(entry, at=now)}, usage.holds)

        await self.store.change_usage(account_id, edit)
        return True

    async def settle(self, account_id: str, hold_id: str, held: Mapping[str, Held]) -> None:
        """The launch ended: its hold becomes ``held`` (instance id -> what it holds),
        counted until the mirrors show those instances."""
        if self._limits(account_id) is None:
            return

        def edit(usage: Usage) -> Usage:
            holds = {k: h for k, h in usage.holds.items() if k != hold_id}
            if len(holds) == len(usage.holds) and not held:
                return usage  # nothing held (the account's limits were set meanwhile)
            return Usage({**usage.instances, **held}, holds)

        try:
            await self.store.change_usage(account_id, edit)
        except ServiceUnavailable as exc:
            log.error("could not settle the quota hold %s of %s: %s (it lapses after "
                      "a while)", hold_id, account_id, exc)

    async def release(self, account_id: str, instance_id: str) -> None:
        """A start given up, or a stop: its entry goes (the mirrors stop counting the
        instance by themselves)."""
        if self._limits(account_id) is None:
            return

        def edit(usage: Usage) -> Usage:
            if instance_id not in usage.instances:
                return usage
            return msgspec.structs.replace(usage, instances={
                i: h for i, h in usage.instances.items() if i != instance_id})

        try:
            await self.store.change_usage(account_id, edit)
        except ServiceUnavailable as exc:
            log.warning("could not release %s from the quota of %s: %s", instance_id,
                        account_id, exc)
