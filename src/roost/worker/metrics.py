"""A worker's Prometheus metrics, read from the worker at scrape time.

A collector rather than counters bumped on the task path: the worker already keeps
these figures (`WorkerStats`, running, held), so a scrape reads them and the task path
stays as it is.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from roost.decide.snapshot import WorkerStatus
from roost.worker.runtime import Worker

OUTCOMES = ("succeeded", "retried", "failed", "rejected", "replayed", "unconfirmed")
"""`WorkerStats` fields counted under ``roost_worker_settles_total{outcome}``."""


class WorkerCollector(Collector):
    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    def collect(self) -> Iterator[Metric]:
        w, s = self._worker, self._worker.stats
        labels = {"pool": w.config.pool, "worker": w.worker_id}
        names, values = list(labels), list(labels.values())
        claims = CounterMetricFamily("roost_worker_claims", "Tasks this worker claimed",
                                     labels=names)
        claims.add_metric(values, s.claimed)
        yield claims
        settles = CounterMetricFamily(
            "roost_worker_settles",
            "Task attempts this worker settled, by outcome (succeeded; retried: failed "
            "and queued again; failed: for good; rejected: the lease had been lost; "
            "replayed: a lost reply had committed; unconfirmed: given up unreachable)",
            labels=[*names, "outcome"])
        for outcome in OUTCOMES:
            settles.add_metric([*values, outcome], getattr(s, outcome))
        yield settles
        lost = CounterMetricFamily("roost_worker_lost_leases",
                                   "Leases this worker lost while running the task",
                                   labels=names)
        lost.add_metric(values, s.lost_leases)
        yield lost
        for name, doc, value in (
            ("roost_worker_running_tasks", "Tasks running now", w.running),
            ("roost_worker_held_leases", "Task leases held now", w.held),
            ("roost_worker_draining", "1 while the worker drains (controller or SIGTERM)",
             int(w.mode is not WorkerStatus.ACTIVE or w.stopping)),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=names)
            gauge.add_metric(values, value)
            yield gauge


def serve_metrics(worker: Worker, *, host: str, port: int) -> CollectorRegistry:
    """Serve ``/metrics`` for ``worker`` on ``host:port`` from a daemon thread."""
    registry = CollectorRegistry()
    registry.register(WorkerCollector(worker))
    start_http_server(port, addr=host, registry=registry)
    return registry
