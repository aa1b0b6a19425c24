"""The gateway times its garbage collector's pauses, and files them with the next
request rather than inside the collector's callback."""

from __future__ import annotations

import gc

from roost.gateway.metrics import GatewayMetrics


def _count(m: GatewayMetrics, generation: str) -> float:
    for line in m.exposition().decode().splitlines():
        if line.startswith(f'roost_gateway_gc_seconds_count{{generation="{generation}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_full_collections_are_timed_and_filed_with_the_next_request() -> None:
    m = GatewayMetrics()
    m.watch_gc()
    try:
        gc.collect()
        assert _count(m, "2") == 0  # noted, not yet filed
        m.observed("DescribeInstances", 0.001)
        assert _count(m, "2") >= 1
        before = _count(m, "2")
        gc.collect()
        m.file_gc()  # filed without a request too (an idle gateway's collector task does)
        assert _count(m, "2") >= before + 1
    finally:
        m.unwatch_gc()
    filed = _count(m, "2")
    gc.collect()
    m.observed("DescribeInstances", 0.001)
    assert _count(m, "2") == filed  # no longer watching
    assert m._on_gc not in gc.callbacks
