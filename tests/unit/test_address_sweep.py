"""The address sweep lets the event loop run other work as it walks, however the addresses
are spread over subnets (no bus: nothing here is old enough to be released)."""

from __future__ import annotations

import asyncio
import time

from roost.gateway.network import SWEEP_SLICE, AddressClaim, NetworkStore


async def _turns_during_sweep(per_subnet: int, total: int) -> int:
    store = NetworkStore(None, None, None, region="r1", owner_id="o",  # type: ignore[arg-type]
                         zones=lambda: ["r1a"])
    now = time.time()
    for k in range(total):
        held = store._addresses.setdefault(f"subnet-{k // per_subnet}", {})
        held[(10 << 24) + 4 + k % per_subnet] = (1, AddressClaim(f"l-{k}", now))
    turns = 0
    done = False

    async def other_work() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other_work())
    await asyncio.sleep(0)
    start = turns
    assert await store.sweep([], now) == 0  # young claims: none taken back
    done = True
    await task
    return turns - start


def test_many_small_subnets_are_walked_in_slices_too() -> None:
    total = 3 * SWEEP_SLICE
    assert asyncio.run(_turns_during_sweep(10, total)) >= 3
    assert asyncio.run(_turns_during_sweep(total, total)) >= 3
