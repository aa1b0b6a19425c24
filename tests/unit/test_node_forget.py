"""`roost node forget`'s read of the records bucket."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from nats.js.kv import KeyValue

from roost.node.forget import read_through


def entry(key: str, seq: int) -> KeyValue.Entry:
    return KeyValue.Entry(bucket="b", key=key, value=b"v", revision=seq, delta=None,
                          created=None, operation=None)


@pytest.mark.parametrize("marker_at", [0, 1, 3])
async def test_forget_reads_the_bucket_through_its_last_entry_wherever_the_marker_comes(
        marker_at: int) -> None:
    """nats-py's watcher can put its end-of-contents marker (None) before the entries
    it announces: the read goes on to the entry at the bucket's last sequence."""
    entries: list[KeyValue.Entry | None] = [
        entry(f"k{i}", seq) for i, seq in enumerate((4, 7, 9))]
    entries.insert(marker_at, None)

    async def watch() -> AsyncIterator[KeyValue.Entry | None]:
        for e in entries:
            yield e
        yield entry("later", 12)  # a put after the read began

    seen: list[str] = []
    assert await read_through(watch(), 9, lambda e: seen.append(e.key))
    assert seen == ["k0", "k1", "k2"]

    # the marker never came (the watch stalled): said so
    async def stalled() -> AsyncIterator[KeyValue.Entry | None]:
        yield entry("k0", 4)

    assert not await read_through(stalled(), 9, lambda e: None)
