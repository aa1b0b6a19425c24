"""Capacity-gated launch subscriptions: ``ec2.RunInstances.<type>`` for exactly the types
that fit one more.

Unsubscribing uses `Subscription.drain`, not ``unsubscribe``: nats-py's unsubscribe
discards messages already delivered to the client, and a request dropped that way would
time out at the gateway instead of getting an explicit "no capacity" answer. Drain sends
UNSUB, waits for the server's round trip, and lets the callback answer what is queued.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from roost.bus.subjects import NODE_QUEUE, run_instances


class TypeSubscriptions:
    def __init__(self, nc: Client, handler: Callable[[Msg], Awaitable[None]]) -> None:
        self._nc = nc
        self._handler = handler
        self._subs: dict[str, Subscription] = {}
        self._lock = asyncio.Lock()

    @property
    def types(self) -> frozenset[str]:
        return frozenset(self._subs)

    async def sync(self, wanted: Callable[[], Iterable[str]]) -> tuple[set[str], set[str]]:
        """Subscribe and unsubscribe only the types whose fit changed.

        ``wanted`` is asked once the lock is held, so syncs that queue behind one another
        each apply the fit as it is then: a sync worked out before an allocation can
        never land after one worked out after it.

        Returns (added, removed). When it returns, the server has processed every SUB
        and UNSUB: a request published after this can't reach a type we dropped.
        """
        async with self._lock:
            want = set(wanted())
            added = want - self._subs.keys()
            removed = self._subs.keys() - want
            for t in added:
                self._subs[t] = await self._nc.subscribe(
                    run_instances(t), queue=NODE_QUEUE, cb=self._handler
                )
            drains = [self._subs.pop(t).drain() for t in removed]  # type: ignore[no-untyped-call]
            if drains:
                await asyncio.gather(*drains)
            if added or removed:
                # Let the client's flusher task write SUB/UNSUB before the PING that
                # flush() sends, so its PONG proves the server has seen them.
                await asyncio.sleep(0)
                await self._nc.flush()
            return added, removed
