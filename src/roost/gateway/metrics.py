"""The gateway's Prometheus metrics, in a registry of its own.

A registry per gateway (not the process-global default) lets tests run several
gateways in one process without their series colliding.

In a worker of a gateway pool (`roost.gateway.workers`) prometheus-client runs in its
multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set before it was imported): every
worker writes its values to files in that directory, and `exposition` answers the sum
over all the workers, whichever of them a scrape reaches.
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_GC_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "roost_gateway_requests", "EC2 API requests, by action and result code",
            ["action", "code"], registry=r,
        )
        self.request_seconds = Histogram(
            "roost_gateway_request_seconds", "EC2 API request latency, by action",
            ["action"], buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.launches = Counter(
            "roost_launches",
            "Instances by launch outcome (launched, insufficient_capacity, failed, rolled_back)",
            ["outcome"], registry=r,
        )
        self.launch_seconds = Histogram(
            "roost_launch_seconds", "Time to place and launch one RunInstances request",
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.placement_attempts = Counter(
            "roost_placement_attempts",
            "Launch attempts sent to nodes, by policy, route (node-targeted or anycast) "
            "and outcome", ["policy", "route", "outcome"], registry=r,
        )
        self.nodes = Gauge(
            "roost_gateway_nodes", "Nodes in the gateway's capacity view that are live",
            registry=r, multiprocess_mode="mostrecent",
        )
        self.gc_seconds = Histogram(
            "roost_gateway_gc_seconds",
            "Pauses of the process's cyclic garbage collector, by generation (2: a full "
            "collection, which walks every object the mirrors hold)",
            ["generation"], buckets=_GC_BUCKETS, registry=r,
        )
        self._gc_started = 0.0
        self._gc_pauses: list[tuple[str, float]] = []
        self._multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")

    def watch_gc(self) -> None:
        """Time the collector's pauses from now on (until `unwatch_gc`). The collector is
        the process's: with several gateways in one process (tests), each sees them all."""
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def unwatch_gc(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # Only noted here: a collection can start inside a metric's own update, and in
        # multiprocess mode every metric shares one lock, so observing from the callback
        # could wait on a lock its own thread holds. `observed` files the pauses later.
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started:
            self._gc_pauses.append((str(info.get("generation", "")),
                                    time.perf_counter() - self._gc_started))

    def observed(self, action: str, seconds: float) -> None:
        """One EC2 request's latency, and the collector's pauses noted since the last."""
        self.request_seconds.labels(action).observe(seconds)
        self.file_gc()

    def file_gc(self) -> None:
        """File the collector's pauses noted so far: with each request, and every second
        from the gateway's collector task, so an idle gateway's notes do not pile up."""
        if self._gc_pauses:
            pauses, self._gc_pauses = self._gc_pauses, []
            for generation, paused in pauses:
                self.gc_seconds.labels(generation).observe(paused)

    def exposition(self) -> bytes:
        """The text format of every series: this process's, or in a pool every worker's."""
        if not self._multiprocess_dir:
            return generate_latest(self.registry)
        return generate_latest(merged_registry(self._multiprocess_dir))


def merged_registry(path: str) -> CollectorRegistry:
    """A registry that reads the sum of every process's series from ``path``."""
    merged = CollectorRegistry()
    MultiProcessCollector(merged, path=path)  # type: ignore[no-untyped-call]
    return merged
