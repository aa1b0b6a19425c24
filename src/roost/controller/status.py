"""The /status document, as typed structs: the same types give the OpenAPI schema, so the
document and its description cannot drift apart."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import msgspec

from roost.controller.actuator import ActionRecord, describe
from roost.controller.loop import Controller

log = logging.getLogger("roost.controller.status")


class _Doc(msgspec.Struct, rename="camel", omit_defaults=False):
    pass


class QueueDepth(_Doc):
    queued: int
    running: int


class PoolPlanDoc(_Doc):
    desired_replicas: int | None
    current_replicas: int | None
    raw_desired: int | None
    frozen_reason: str | None
    reason: str
    action: str
    capped_by: list[str] = []
    steps: list[str] = []
    """The actions this tick takes."""
    sizing: list[str] = []
    """The demand model's inputs and each step of its arithmetic, in words."""


class PlanDoc(_Doc):
    source: str
    """"leader": computed by this controller; "published": read from the leader's rows."""
    at: str | None
    pools: dict[str, PoolPlanDoc]
    db_worker_budget: int | None = None
    db_connections_used: int | None = None


class ScaleActionDoc(_Doc):
    at: str
    pool: str
    kind: str
    outcome: str
    worker: str | None = None
    replicas: int | None = None
    detail: str = ""


class StatusDoc(_Doc):
    leader: bool
    epoch: int | None
    holder: str
    shadow: bool
    ready: bool
    last_run_at: str | None
    last_error: str | None
    queue: dict[str, QueueDepth]
    plan: PlanDoc | None
    scale_actions: list[ScaleActionDoc]
    lost_leadership_reason: str = ""
    following: str = ""
    """A follower: the leader lock's holder as Postgres names it (application_name)."""
    leadership_problem: str = ""
    """A follower: why it cannot take the lead from a leader that is gone ("" if none)."""
    orchestrators: dict[str, dict[str, Any]] = {}
    """What each adapter that offers a ``report()`` says about itself (the kubernetes
    adapter: per pool, its Deployment, revisions, recent removals and mismatches)."""


class HealthDoc(_Doc):
    status: str
    leader: bool = False
    detail: str = ""


class Problem(msgspec.Struct, omit_defaults=True):
    """RFC 9457 problem details."""

    title: str
    status: int
    type: str = "about:blank"
    detail: str = ""
    instance: str = ""


def iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat()


def _action(rec: ActionRecord) -> ScaleActionDoc:
    return ScaleActionDoc(iso(rec.at) or "", rec.pool_id, rec.kind, rec.outcome, rec.worker_id,
                          rec.replicas, rec.detail)


def _keeper(pools: set[str] | None) -> Callable[[str], bool]:
    def keep(pool_id: str) -> bool:
        return pools is None or pool_id in pools

    return keep


def _plan(c: Controller, pools: set[str] | None) -> PlanDoc | None:
    keep = _keeper(pools)
    if c.last_plan is not None:
        p = c.last_plan
        return PlanDoc(
            source="leader",
            at=iso(p.now),
            pools={
                x.pool_id: PoolPlanDoc(x.desired_replicas, x.current_replicas, x.raw_desired,
                                       x.frozen_reason, x.reason, x.action, list(x.capped_by),
                                       [describe(s) for s in x.steps], list(x.sizing))
                for x in p.pools if keep(x.pool_id)
            },
            db_worker_budget=p.db_worker_budget,
            db_connections_used=p.db_connections_used,
        )
    if c.published:
        return PlanDoc(
            source="published",
            at=iso(max(r.published_at for r in c.published)),
            pools={
                r.pool_id: PoolPlanDoc(
                    r.desired, r.current, r.raw_desired, r.frozen_reason, r.reason,
                    "expired" if r.valid_until < c.clock.time() else "published",
                )
                for r in c.published if keep(r.pool_id)
            },
        )
    return None


def known_pools(c: Controller) -> set[str]:
    if c.last_plan is not None:
        return {p.pool_id for p in c.last_plan.pools}
    return {r.pool_id for r in c.published} | set(c.queue)


def _reports(c: Controller) -> dict[str, dict[str, Any]]:
    """Adapters' own reports; one that fails says so instead of failing /status."""
    out: dict[str, dict[str, Any]] = {}
    for name, orch in sorted(c.orchestrators.items()):
        report = getattr(orch, "report", None)
        if not callable(report):
            continue
        try:
            out[name] = dict(report())
        except Exception as exc:
            log.warning("orchestrator %s report failed", name, exc_info=True)
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def status_doc(c: Controller, *, pools: set[str] | None = None) -> StatusDoc:
    ready, _ = c.readiness()
    keep = _keeper(pools)
    return StatusDoc(
        leader=c.leadership.is_leader,
        epoch=c.leadership.epoch,
        holder=c.leadership.holder,
        shadow=c.config.shadow,
        ready=ready,
        last_run_at=iso(c.last_run_at),
        last_error=c.last_error,
        queue={k: QueueDepth(v.queued, v.running) for k, v in sorted(c.queue.items()) if keep(k)},
        plan=_plan(c, pools),
        scale_actions=[_action(r) for r in reversed(c.actions) if keep(r.pool_id)],
        lost_leadership_reason=c.leadership.lost_reason,
        following="" if c.leadership.is_leader else c.leadership.following,
        leadership_problem="" if c.leadership.is_leader else c.leadership.problem,
        orchestrators=_reports(c),
    )
