"""Applying a plan's steps: fenced writes to Postgres, idempotent calls to orchestrators.

Each step writes to Postgres (fenced by the epoch) *before* it touches an orchestrator,
so a deposed leader fails on its write and never reaches the orchestrator. Between
orchestrator calls the leader's connection state is checked too: the termination
listener flips it the moment the session dies.

A re-activated worker whose instance still carries a negative termination priority (a
removal mark) has it reset to 0, so the orchestrator does not pick it first on the next
scale-down. Marks are set only after a removal is committed, which a re-activation
never undoes, so this is a safeguard; its failure is logged and noted on the record,
never fatal.

A failure is recorded as data (`ActionRecord`) and ends that pool's steps for this
tick; other pools go on. The next tick re-reads everything and decides again, and a
committed removal is finished from where it stopped. `StaleEpoch` is different: it ends
the whole tick, since nothing this controller decided is valid any more.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from roost.controller.clock import Clock
from roost.controller.orchestrator import Orchestrator, OrchestratorError, PoolRef
from roost.decide.drain import MarkDraining, Reactivate, RemoveReplica, ScaleUp, Step
from roost.decide.plan import Plan
from roost.decide.snapshot import PoolInputs, PoolSpec
from roost.store import fenced
from roost.store.errors import StaleEpoch

log = logging.getLogger("roost.controller.actuator")


@dataclass(frozen=True, slots=True)
class ActionRecord:
    at: float
    pool_id: str
    kind: str
    outcome: str
    """ok | skipped (the world moved since the read) | failed | shadow (not applied)."""
    worker_id: str | None = None
    replicas: int | None = None
    detail: str = ""


def describe(step: Step) -> str:
    match step:
        case ScaleUp():
            return f"scale {step.pool_id} up to {step.replicas}"
        case MarkDraining():
            return f"drain {step.worker_id} of {step.pool_id}"
        case Reactivate():
            return f"re-activate {step.worker_id} of {step.pool_id} ({step.why})"
        case RemoveReplica():
            to = "" if step.replicas is None else f", scaling to {step.replicas}"
            if step.also:
                who = ", ".join(w for w, _ in step.victims)
                return f"remove the replicas of drained {who} of {step.pool_id}{to}"
            return f"remove the replica of drained {step.worker_id} of {step.pool_id}{to}"
    raise AssertionError(step)


class Actuator:
    def __init__(
        self,
        db: Any,
        orchestrators: Mapping[str, Orchestrator],
        *,
        clock: Clock,
        timeout: float,
        still_leader: Callable[[], bool],
    ) -> None:
        self.db = db
        self.orchestrators = orchestrators
        self.clock = clock
        self.timeout = timeout
        self.still_leader = still_leader
        self._inputs: Mapping[str, PoolInputs] = {}

    async def apply(self, plan: Plan, specs: Mapping[str, PoolSpec], *, epoch: int,
                    shadow: bool, records: list[ActionRecord] | None = None,
                    inputs: Mapping[str, PoolInputs] | None = None) -> list[ActionRecord]:
        """Apply ``plan``; records go to ``records`` as they happen, so the caller keeps
        what was done even when a `StaleEpoch` ends the tick half-way. ``inputs`` (the
        snapshot the plan was made from, by pool) tells which instances carry a removal
        mark to undo on re-activation."""
        records = [] if records is None else records
        self._inputs = inputs or {}
        for pool in plan.pools:
            for step in pool.steps:
                if shadow:
                    log.info("shadow: would %s", describe(step))
                    records.append(self._record(step, "shadow", describe(step)))
                    continue
                rec = await self._apply(step, specs[step.pool_id], epoch)
                records.append(rec)
                if rec.outcome == "failed":
                    break
        return records

    def _record(self, step: Step, outcome: str, detail: str = "") -> ActionRecord:
        return ActionRecord(
            at=self.clock.time(),
            pool_id=step.pool_id,
            kind=step.kind,
            outcome=outcome,
            worker_id=getattr(step, "worker_id", None),
            replicas=getattr(step, "replicas", None),
            detail=detail,
        )

    def _guard(self, epoch: int) -> None:
        if not self.still_leader():
            raise StaleEpoch(epoch, None)

    async def _call(self, coro: Any) -> Any:
        return await asyncio.wait_for(coro, self.timeout)

    async def _apply(self, step: Step, spec: PoolSpec, epoch: int) -> ActionRecord:
        orch = self.orchestrators.get(spec.orchestrator)
        ref = PoolRef(spec.pool_id, spec.orchestrator_ref)
        try:
            match step:
                case MarkDraining():
                    ok = await fenced.mark_draining(self.db, epoch, step.pool_id,
                                                    step.worker_id, now=self.clock.time())
                    return self._record(step, "ok" if ok else "skipped")
                case Reactivate():
                    ok = await fenced.reactivate(self.db, epoch, step.pool_id, step.worker_id)
                    if not ok:
                        return self._record(step, "skipped", step.why)
                    note = await self._unmark(step, orch, ref, epoch)
                    return self._record(step, "ok", f"{step.why}{note}")
                case ScaleUp():
                    self._guard(epoch)
                    if orch is None:
                        return self._record(step, "failed", "no orchestrator adapter")
                    res = await self._call(orch.scale_pool(
                        ref, step.replicas, request_id=f"{step.pool_id}:{step.replicas}:e{epoch}"
                    ))
                    return self._record(step, "ok", f"from {res.previous}")
                case RemoveReplica():
                    return await self._remove(step, orch, ref, epoch)
        except OrchestratorError as exc:
            return self._record(step, "failed", f"{type(exc).__name__}: {exc}")
        except TimeoutError:
            return self._record(step, "failed", f"orchestrator timed out after {self.timeout:g}s")
        raise AssertionError(step)

    async def _unmark(self, step: Reactivate, orch: Orchestrator | None, ref: PoolRef,
                      epoch: int) -> str:
        """Reset the removal mark of a re-activated worker's instance, if it has one (or
        if the pool's instances could not be read); "" or a note for the record."""
        pool = self._inputs.get(step.pool_id)
        if orch is None or pool is None:
            return ""
        worker = next((w for w in pool.workers or () if w.worker_id == step.worker_id), None)
        if worker is None or not worker.instance_ref:
            return ""
        if pool.infra is not None:  # else unknown: reset anyway, tolerating errors
            inst = next((i for i in pool.infra.instances if i.ref == worker.instance_ref), None)
            if inst is None or inst.termination_priority >= 0:
                return ""
        self._guard(epoch)
        try:
            await self._call(orch.set_instance_termination_priority(
                ref, worker.instance_ref, priority=0))
        except (OrchestratorError, TimeoutError, ValueError) as exc:
            log.warning("re-activated %s of %s but could not reset the termination "
                        "priority of %s: %s", step.worker_id, step.pool_id,
                        worker.instance_ref, exc or type(exc).__name__)
            return f"; priority of {worker.instance_ref} not reset: {type(exc).__name__}"
        log.info("reset the termination priority of %s (%s re-activated)",
                 worker.instance_ref, step.worker_id)
        return f"; priority of {worker.instance_ref} reset to 0"

    async def _remove(self, step: RemoveReplica, orch: Orchestrator | None, ref: PoolRef,
                      epoch: int) -> ActionRecord:
        """Remove a batch of drained workers' replicas: commit them all (or none), mark
        every instance, ask once for the count without them, then close the records."""
        victims = step.victims
        if step.replicas is not None:
            if orch is None:
                return self._record(step, "failed", "no orchestrator adapter")
            ids = [w for w, _ in victims]
            if len(ids) == 1:
                ok = await fenced.commit_removal(self.db, epoch, step.pool_id, ids[0],
                                                 step.replicas)
            else:
                ok = await fenced.commit_removals(self.db, epoch, step.pool_id, ids,
                                                  step.replicas)
            if not ok:
                return self._record(step, "skipped", "a worker is no longer drained")
            for _, instance in victims:
                self._guard(epoch)
                await self._call(orch.set_instance_termination_priority(
                    ref, instance, priority=step.priority))
            self._guard(epoch)
            await self._call(orch.scale_pool(
                ref, step.replicas, request_id=f"{step.pool_id}:remove:{step.worker_id}"))
        gone = [await fenced.mark_gone(self.db, epoch, step.pool_id, w) for w, _ in victims]
        return self._record(step, "ok" if all(gone) else "skipped",
                            ", ".join(i for _, i in victims))
