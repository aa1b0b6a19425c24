"""A node whose heartbeat stalls reads its orders after the stall, even when a read
was already in flight: that read asked before the stall, and may miss its orders."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from roost.embedded import NatsServer
from tests.nodes import running_nodes
from tests.polling import until


async def test_a_gap_seen_during_a_read_gets_its_own_read_after(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with running_nodes([nats_server.url], ["4vcpu,16GiB"], tmp_path,
                             heartbeat_seconds=0.2) as [node]:
        reads: list[tuple[float, float]] = []

        async def slow_read(*, after: float = 0.0) -> None:
            reads.append((time.monotonic(), after))
            await asyncio.sleep(1.0)  # a read still waiting on JetStream

        node._read_orders = slow_read  # type: ignore[method-assign]
        await asyncio.sleep(0.5)  # the heartbeat is beating
        time.sleep(0.5)  # a stalled loop: the next beat sees a gap and starts a read
        await until("the gap starts a read", lambda: reads, timeout=2.5, interval=0.05)
        assert len(reads) == 1
        time.sleep(0.5)  # a second stall, while that read is in flight
        await asyncio.sleep(2.5)  # the first read ends after 1 s; the next beats follow
        # The regular read is 20 s away: only the gap can have asked for this one (a
        # stall of the loaded host's own can add a gap, and a read, of its own).
        assert len(reads) >= 2, reads
        assert reads[1][1] > 0 and reads[1][0] - reads[0][0] < 2.0
