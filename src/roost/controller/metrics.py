"""Prometheus metrics of one controller, in a registry of its own (two controllers in one
test process must not share counters)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from roost.controller.actuator import ActionRecord
from roost.decide.plan import Plan


class ControllerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.is_leader = Gauge("roost_controller_is_leader",
                               "1 while this controller leads.", registry=r)
        self.epoch = Gauge("roost_controller_leader_epoch",
                           "Epoch of this controller's leadership (0 as follower).", registry=r)
        self.ticks = Counter("roost_controller_ticks_total", "Reconcile ticks.",
                             ["role", "outcome"], registry=r)
        self.tick_seconds = Histogram(
            "roost_controller_tick_seconds", "Duration of a reconcile tick.", ["role"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=r)
        self.last_run = Gauge("roost_controller_last_run_timestamp_seconds",
                              "When the last tick finished.", registry=r)
        self.replicas = Gauge("roost_controller_pool_replicas",
                              "Replicas per pool: current, desired and raw (demand alone).",
                              ["pool", "kind"], registry=r)
        self.frozen = Gauge("roost_controller_pool_frozen",
                            "1 when the pool's plan is frozen, labelled with the reason code.",
                            ["pool", "reason"], registry=r)
        self.queue = Gauge("roost_controller_queue_tasks", "Tasks per pool and state.",
                           ["pool", "state"], registry=r)
        self.db_clock_offset = Gauge(
            "roost_controller_db_clock_offset_seconds",
            "The database's clock minus this controller's (heartbeat ages and drain "
            "deadlines compare the two). NaN until measured, and on a follower.",
            registry=r)
        self.db_clock_offset.set(float("nan"))
        self.actions = Counter("roost_controller_scale_actions_total",
                               "Scale actions by kind and outcome.",
                               ["pool", "kind", "outcome"], registry=r)
        self.pruned = Counter("roost_controller_tasks_pruned_total",
                              "Finished tasks deleted past task_retention.", registry=r)

    def clear_plan(self) -> None:
        """Pools come and go, and a follower has no plan: no stale label set lingers."""
        for g in (self.replicas, self.frozen, self.queue):
            g.clear()

    def observe_plan(self, plan: Plan) -> None:
        self.clear_plan()
        for p in plan.pools:
            for kind, value in (("current", p.current_replicas), ("desired", p.desired_replicas),
                                ("raw", p.raw_desired)):
                if value is not None:
                    self.replicas.labels(p.pool_id, kind).set(value)
            if p.frozen_reason:
                self.frozen.labels(p.pool_id, p.frozen_reason.split(":", 1)[0]).set(1)
            if p.queued is not None:
                self.queue.labels(p.pool_id, "queued").set(p.queued)
            if p.running is not None:
                self.queue.labels(p.pool_id, "running").set(p.running)

    def observe_actions(self, records: list[ActionRecord]) -> None:
        for rec in records:
            self.actions.labels(rec.pool_id, rec.kind, rec.outcome).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
