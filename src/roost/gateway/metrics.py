"""The gateway's Prometheus metrics, in a registry of its own.

A registry per gateway (not the process-global default) lets tests run several
gateways in one process without their series colliding.

In a worker of a gateway pool (`roost.gateway.workers`) prometheus-client runs in its
multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set before it was imported): every
worker writes its values to files in that directory, and `exposition` answers the sum
over all the workers, whichever of them a scrape reaches.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


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
        self._multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")

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
