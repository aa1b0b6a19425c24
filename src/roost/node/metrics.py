"""The node's Prometheus metrics: what each instance uses, read from its cgroup at
scrape time (so a scrape costs a few file reads per instance and nothing in between)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from roost.bus.schemas import InstanceRecord
from roost.domain.lifecycle import InstanceState
from roost.node.drivers import InstanceDriver

log = logging.getLogger(__name__)


class InstanceUsageCollector(Collector):
    def __init__(self, records: Callable[[], Mapping[str, InstanceRecord]],
                 driver: InstanceDriver, node_id: str) -> None:
        self._records = records
        self._driver = driver
        self._node_id = node_id

    def collect(self) -> Iterable[Metric]:
        labels = ["node", "instance_id", "instance_type"]
        cpu = CounterMetricFamily("roost_instance_cpu_seconds",
                                  "CPU time the instance's cgroup has used.", labels=labels)
        mem = GaugeMetricFamily("roost_instance_memory_bytes",
                                "Memory the instance's cgroup uses now.", labels=labels)
        peak = GaugeMetricFamily("roost_instance_memory_peak_bytes",
                                 "The most memory the instance's cgroup has used.",
                                 labels=labels)
        oom = CounterMetricFamily("roost_instance_oom_kills",
                                  "Processes of the instance killed by its memory limit.",
                                  labels=labels)
        for iid, rec in list(self._records().items()):
            if not InstanceState(rec.state).holds_capacity:
                continue
            usage = self._driver.usage(iid)
            if usage is None:
                continue
            values = [self._node_id, iid, rec.instance_type]
            cpu.add_metric(values, usage.cpu_seconds)
            mem.add_metric(values, usage.memory_current_bytes)
            peak.add_metric(values, usage.memory_peak_bytes)
            oom.add_metric(values, usage.oom_kills)
        isolation = GaugeMetricFamily("roost_node_isolation_info",
                                      "The isolation level this node enforces (value 1).",
                                      labels=["node", "level"])
        isolation.add_metric([self._node_id, self._driver.isolation], 1)
        return [cpu, mem, peak, oom, isolation]


def serve_metrics(collector: InstanceUsageCollector, *, port: int,
                  host: str = "127.0.0.1") -> WSGIServer:
    """Serve /metrics on ``host:port`` from a daemon thread (prometheus-client's own
    server: a scrape must not wait on the agent's event loop). The caller shuts the
    returned server down."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(collector)
    server, _ = start_http_server(port, addr=host, registry=registry)
    log.info("node metrics on http://%s:%d/metrics", host, server.server_port)
    return server
