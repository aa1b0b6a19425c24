"""Reading a tick's snapshot: pools, demand, workers, database health and every pool's
orchestrator state.

A failed read becomes a ``None`` input with its error in ``missing``, so the plan
freezes exactly what it concerns: one unreachable orchestrator freezes its pools, a
failed demand query freezes all of them. Only the pool list itself is a hard failure:
without it there is nothing to plan.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from roost.controller.clock import Clock
from roost.controller.orchestrator import (
    Orchestrator,
    OrchestratorError,
    PoolRef,
    PoolState,
)
from roost.decide.snapshot import (
    DbHealth,
    Demand,
    PlanSettings,
    PoolInputs,
    PoolSpec,
    Snapshot,
    WorkerView,
)
from roost.store import pools as pools_q
from roost.store import runtime
from roost.store.session import CONNECTION_ERRORS

DB_ERRORS = CONNECTION_ERRORS
log = logging.getLogger("roost.controller.inputs")


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


async def _infra(orch: Orchestrator | None, spec: PoolSpec, *, timeout: float,
                 gate: asyncio.Semaphore) -> PoolState | str:
    if orch is None:
        return f"infra: no orchestrator adapter {spec.orchestrator!r} on this controller"
    async with gate:
        try:
            return await asyncio.wait_for(
                orch.pool_state(PoolRef(spec.pool_id, spec.orchestrator_ref)), timeout
            )
        except TimeoutError:
            return f"infra: {spec.orchestrator} timed out after {timeout:g}s"
        except OrchestratorError as exc:
            return f"infra: {spec.orchestrator}: {_describe(exc)}"
        except Exception as exc:  # an adapter bug must freeze its pools, not the loop
            return f"infra: {spec.orchestrator} failed: {type(exc).__name__}: {exc}"


@dataclass(frozen=True, slots=True)
class RateReads:
    """What the demand model's queries read: the arrival rate and service time over
    ``window``, and the arrival rate's peak at ``grain`` over the last ``span`` seconds
    (the time since the previous read: each burst counts in one read)."""

    window: float = PlanSettings().rate_window
    grain: float = PlanSettings().peak_grain
    span: float = PlanSettings().rate_window


async def _with_rates(conn: Any, demand: dict[str, Demand], reads: RateReads,
                      timeout: float) -> dict[str, Demand]:
    """Demand with the arrival rate, its peak and the service time the demand model
    uses. If they cannot be read the model falls back to queued + running (the rule
    before it), so this never freezes a pool; a failed read is logged."""
    try:
        rates = await runtime.read_rates(conn, reads.window, grain=reads.grain,
                                         span=reads.span, timeout=timeout)
    except DB_ERRORS as exc:
        log.warning("arrival rates not read, sizing on queued + running: %s", _describe(exc))
        return demand
    out = {}
    for pool, d in demand.items():
        rate, service, completed, peak = rates.get(pool, (0.0, None, 0, 0.0))
        out[pool] = replace(d, arrival_rate=rate, service_time=service, completed=completed,
                            arrival_peak=peak)
    return out


async def read_snapshot(
    db: Any,
    orchestrators: Mapping[str, Orchestrator],
    *,
    clock: Clock,
    timeout: float,
    concurrency: int = 16,
    rates: RateReads = RateReads(),
) -> Snapshot:
    demand: dict[str, Demand] | None = None
    workers: dict[str, list[WorkerView]] | None = None
    health: DbHealth | None = None
    errors: list[str] = []
    async with db.acquire() as conn:
        specs = await pools_q.list_pools(conn)
        try:
            demand = await runtime.read_demand(conn, timeout=timeout)
        except DB_ERRORS as exc:
            errors.append(f"demand: {_describe(exc)}")
        if demand is not None:
            demand = await _with_rates(conn, demand, rates, timeout)
        try:
            workers = await runtime.read_workers(conn, timeout=timeout)
        except DB_ERRORS as exc:
            errors.append(f"workers: {_describe(exc)}")
        try:
            health = await runtime.read_db_health(conn, observed_at=clock.time(),
                                                  timeout=timeout)
        except DB_ERRORS as exc:
            errors.append(f"database health: {_describe(exc)}")
    read_at = clock.time()
    gate = asyncio.Semaphore(concurrency)
    infra = await asyncio.gather(*(
        _infra(orchestrators.get(s.orchestrator), s, timeout=timeout, gate=gate) for s in specs
    ))
    pools = []
    for spec, state in zip(specs, infra, strict=True):
        missing = [e for e in errors if not e.startswith("database health")]
        pool_demand = None if demand is None else demand.get(spec.pool_id)
        if demand is not None and pool_demand is None:
            missing.append("demand: pool not in the queue view yet")
        if isinstance(state, str):
            missing.append(state)
        pools.append(PoolInputs(
            spec=spec,
            demand=pool_demand,
            workers=None if workers is None else tuple(workers.get(spec.pool_id, ())),
            infra=None if isinstance(state, str) else state,
            missing=tuple(missing),
        ))
    return Snapshot(tuple(pools), health, read_at, tuple(errors))
