"""Reservations against the accounts' quotas, kept in ``usage.<id>`` of the accounts
bucket with compare-and-set (`AccountStore.change_usage`): a launch holds before it
places, its hold becomes one entry per instance, and an instance's entry goes when it
stops or ends. The decision itself is pure (`roost.domain.accounts.check`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

import msgspec

from roost.bus.schemas import InstanceRecord
from roost.domain.accounts import DEFAULT_ACCOUNT, HOLD_TTL, Held, Usage, check
from roost.domain.errors import InstanceLimitExceeded, ServiceUnavailable, VcpuLimitExceeded
from roost.gateway.accounts import AccountStore, KeyBook

log = logging.getLogger(__name__)


class QuotaBook:
    """Reservations against the accounts' quotas: a launch holds before it places, and
    its hold becomes one entry per instance, given back when the instance ends."""

    def __init__(self, store: AccountStore, keys: KeyBook,
                 state_of: Callable[[str], str | None]) -> None:
        self.store = store
        self.keys = keys
        self._state_of = state_of
        """The mirror's state of an instance, None without a record."""
        self._chores: set[asyncio.Task[None]] = set()

    def counts(self, account_id: str) -> bool:
        """Whether the account's usage is kept (it has a record in the bucket)."""
        return self.keys.quotas(account_id) is not None

    async def reserve(self, account_id: str, hold_id: str, want: Callable[[int], Held],
                      *, min_count: int, max_count: int) -> int:
        """Hold the most of ``max_count`` instances (at least ``min_count``) the quotas
        allow; returns how many, or raises EC2's limit error for ``min_count``. Accounts
        without a record are not counted: ``max_count`` at once."""
        quotas = self.keys.quotas(account_id)
        if quotas is None:
            return max_count
        granted = 0

        def edit(usage: Usage) -> Usage:
            nonlocal granted
            now = time.time()
            usage = self._pruned(usage, now)
            for n in range(max_count, min_count - 1, -1):
                try:
                    check(quotas, usage, want(n), now)
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

    async def hold_instance(self, account_id: str, instance_id: str, held: Held) -> None:
        """A stopped instance starting counts against the quotas again (EC2's are on
        running instances): held as it starts, or refused with EC2's limit error."""
        quotas = self.keys.quotas(account_id)
        if quotas is None:
            return

        def edit(usage: Usage) -> Usage:
            if instance_id in usage.instances:
                return usage  # still held (it stopped on its own, not through a gateway)
            now = time.time()
            usage = self._pruned(usage, now)
            check(quotas, usage, held, now)
            return Usage({**usage.instances, instance_id: held}, usage.holds)

        await self.store.change_usage(account_id, edit)

    def _pruned(self, usage: Usage, now: float) -> Usage:
        """Usage without what is surely over: instances the mirror holds as terminated
        (a release that no gateway saw through), instances whose record has expired
        (none for `HOLD_TTL` after their launch), and lapsed holds. An instance not yet
        mirrored (just launched through another gateway) is kept."""
        def over(iid: str, held: Held) -> bool:
            state = self._state_of(iid)
            return state == "terminated" or (state is None and now - held.at > HOLD_TTL)

        return Usage({i: h for i, h in usage.instances.items() if not over(i, h)},
                     usage.live_holds(now))

    async def settle(self, account_id: str, hold_id: str, held: Mapping[str, Held]) -> None:
        """The launch ended: its hold becomes ``held`` (instance id -> what it holds)."""
        if self.keys.quotas(account_id) is None:
            return

        def edit(usage: Usage) -> Usage:
            holds = {k: h for k, h in usage.holds.items() if k != hold_id}
            return Usage({**usage.instances, **held}, holds)

        try:
            await self.store.change_usage(account_id, edit)
        except ServiceUnavailable as exc:
            log.error("could not settle the quota hold %s of %s: %s (it lapses after "
                      "a while)", hold_id, account_id, exc)

    def instance_gone(self, rec: InstanceRecord) -> None:
        """An instance terminated or expired: what it held goes back (in the background;
        every gateway may try, and only the first changes anything)."""
        owner = rec.owner_id or DEFAULT_ACCOUNT
        if self.keys.quotas(owner) is None:
            return
        task = asyncio.get_running_loop().create_task(self.release(owner, rec.instance_id))
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)

    async def stop(self) -> None:
        """Let releases in flight finish (each is bounded by its CAS retries)."""
        await asyncio.gather(*self._chores, return_exceptions=True)

    async def release(self, account_id: str, instance_id: str) -> None:
        if self.keys.quotas(account_id) is None:
            return

        def edit(usage: Usage) -> Usage:
            return msgspec.structs.replace(usage, instances={
                i: h for i, h in usage.instances.items() if i != instance_id})

        try:
            await self.store.change_usage(account_id, edit)
        except ServiceUnavailable as exc:
            log.warning("could not release %s from the quota of %s: %s", instance_id,
                        account_id, exc)
