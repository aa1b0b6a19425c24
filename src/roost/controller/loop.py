"""The reconcile loop: every interval, lead or follow, and as leader read, plan, publish
and act.

A tick as leader:

1. keep-alive on the leader connection (step down at once on failure);
2. read the snapshot (`roost.controller.inputs`): read errors freeze what they concern;
3. plan (`roost.decide.plan.plan`, pure, with ``now`` from the injected clock);
4. publish every pool's desired capacity, fenced, valid for two intervals;
5. apply the steps (`roost.controller.actuator`), or in shadow mode only log them.

A follower reads the plan the leader published, so any replica's /status shows it.
The demand history that the windows need lives in the leader's memory and starts empty
on every new leadership: a new leader must observe a window itself before it acts on it.
Each pool's replica start-up time carries over, published with the plan
(docs/architecture.md, "What a new leader remembers"), and the arrival reads the
demand model's estimates rest on are read back once from the task table ("What a new
leader reads back").
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from roost.controller.actuator import ActionRecord, Actuator
from roost.controller.clock import Clock
from roost.controller.config import ControllerConfig
from roost.controller.inputs import DB_ERRORS, RateReads, read_snapshot
from roost.controller.leadership import Leadership, LeadershipError
from roost.controller.metrics import ControllerMetrics
from roost.controller.orchestrator import Orchestrator
from roost.decide.demand import past_span, peak_span
from roost.decide.plan import Plan, PoolHistory, plan, read_back, remembered
from roost.decide.snapshot import Demand, PastArrivals
from roost.store import fenced, runtime
from roost.store.errors import StaleEpoch

log = logging.getLogger("roost.controller")
MIN_TICK_SPACING = 1.0
"""Seconds between the starts of two ticks when tasks wake the loop early."""
PRUNE_EVERY = 60.0
"""Seconds between a leader's deletions of tasks past `ControllerConfig.task_retention`."""
PRUNE_BATCH = 5000
"""Tasks of one pool per statement (tens of milliseconds): a leader deletes again while
a pool's whole batch went, starting no statement past `PRUNE_BUDGET`."""
PRUNE_BUDGET = 2.0
"""Seconds after which a leader starts no more deletes in one `PRUNE_EVERY`: a backlog
(the whole history, when retention is first set) is worked off over the minutes."""


@dataclass(slots=True)
class TickResult:
    leader: bool
    plan: Plan | None = None
    actions: list[ActionRecord] = field(default_factory=list)
    error: str | None = None


class Controller:
    def __init__(
        self,
        *,
        db: Any,
        leadership: Leadership,
        orchestrators: Mapping[str, Orchestrator],
        config: ControllerConfig,
        clock: Clock,
        metrics: ControllerMetrics | None = None,
    ) -> None:
        self.db = db
        self.leadership = leadership
        self.orchestrators = orchestrators
        self.config = config
        self.settings = config.plan_settings()
        self.clock = clock
        self.metrics = metrics or ControllerMetrics()
        self.actuator = Actuator(db, orchestrators, clock=clock, timeout=config.io_timeout,
                                 still_leader=lambda: leadership.is_leader)
        self.history: dict[str, PoolHistory] = {}
        self._clock_skewed = False
        self.last_plan: Plan | None = None
        self.published: list[runtime.Published] = []
        self.queue: dict[str, Demand] = {}
        self.last_run_at: float | None = None
        self.last_error: str | None = None
        self.actions: deque[ActionRecord] = deque(maxlen=100)
        self.stopped = False
        self._epoch_seen: int | None = None
        self._rates_read_at: float | None = None
        """When the leader last read the arrival rates (monotonic)."""
        self._remembered: dict[str, tuple[float, str | None]] = {}
        """The previous leadership's start-up estimate per pool, with the release it was
        published for: read when this leadership began and used on its first tick."""
        self._pruned_at: float | None = None
        """When this leader last deleted tasks past their retention (monotonic)."""
        self._past: tuple[float, dict[str, PastArrivals]] | None = None
        """Each pool's tasks before this leadership, and when they were read (the
        leader's clock): read when it began and used on its first tick."""
        self.wake = asyncio.Event()
        """Set to end the wait between ticks early: stop, this controller has just become
        leader, or tasks for an idle pool."""

    # ---- readiness -------------------------------------------------------------------

    def readiness(self) -> tuple[bool, str]:
        """Ready as leader and as follower; not before the first tick, after a failed
        tick, when the loop has not finished a tick for three intervals, or as a
        follower that cannot take the lead from a leader that is gone (it says why)."""
        if self.stopped:
            return False, "stopped"
        if self.last_run_at is None:
            return False, "no tick has completed yet"
        if self.last_error:
            return False, self.last_error
        if not self.leadership.is_leader and self.leadership.problem:
            return False, self.leadership.problem
        age = self.clock.time() - self.last_run_at
        if age > 3 * self.config.interval:
            return False, f"the last tick finished {age:.0f}s ago"
        return True, "leader" if self.leadership.is_leader else "follower"

    # ---- the loop ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        forward = asyncio.create_task(self._forward(stop))
        try:
            while not stop.is_set():
                self.wake.clear()  # before the tick: a task inserted during it still wakes
                started = self.clock.monotonic()
                await self.tick()
                await self.clock.sleep(self.config.interval, wake=self.wake)
                if not stop.is_set():  # woken early: never more than one tick a second
                    await self.clock.sleep(
                        max(0.0, MIN_TICK_SPACING - (self.clock.monotonic() - started)))
        finally:
            forward.cancel()
            self.stopped = True
            await self.leadership.close()

    async def _forward(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.wake.set()

    def task_created(self, pool_id: str) -> None:
        """New tasks for ``pool_id`` (from the database's NOTIFY). An idle pool (no
        replica, as of the last plan) gets a tick now rather than at the end of the
        interval: scale-from-zero should cost the orchestrator's start-up, not a tick."""
        if not self.leadership.is_leader or self.last_plan is None:
            return
        try:
            current = self.last_plan.pool(pool_id).current_replicas
        except KeyError:
            return
        if current == 0 and not self.wake.is_set():
            log.info("tasks for idle pool %s: ticking now", pool_id)
            self.wake.set()

    async def tick(self) -> TickResult:
        started = self.clock.monotonic()
        result = TickResult(leader=False)
        try:
            leading = await self.leadership.ensure()
            result.leader = leading
            if leading:
                await self._lead(result)
            else:
                await self._follow()
                if self.leadership.problem:
                    result.error = self.leadership.problem
        except StaleEpoch as exc:
            await self.leadership.step_down(str(exc))
            result.error = f"deposed: {exc}"
        except LeadershipError as exc:
            result.error = str(exc)
        except DB_ERRORS as exc:
            result.error = f"database: {exc or type(exc).__name__}"
        if result.error:
            log.warning("tick failed: %s", result.error)
        role = "leader" if result.leader else "follower"
        self.last_error = result.error
        self.last_run_at = self.clock.time()
        m = self.metrics
        m.ticks.labels(role, "error" if result.error else "ok").inc()
        m.tick_seconds.labels(role).observe(self.clock.monotonic() - started)
        m.last_run.set(self.last_run_at)
        m.is_leader.set(1 if self.leadership.is_leader else 0)
        m.epoch.set(self.leadership.epoch or 0)
        return result

    def _watch_clock(self, offset: float | None) -> None:
        """Heartbeat ages and drain deadlines compare the database's timestamps with this
        controller's clock. A skew of a few seconds does no harm (the drain mark itself
        is ordered by the database, see `fenced.mark_draining`); a larger one makes live
        workers look silent (never drained: no scale-down) or dead ones look alive, so
        the operator is told, once, and the gauge shows it. Not measured (a follower, or
        the health read failed): NaN, not a stale figure."""
        if offset is None:
            self.metrics.db_clock_offset.set(float("nan"))
            return
        self.metrics.db_clock_offset.set(offset)
        skewed = abs(offset) > self.settings.heartbeat_timeout / 3
        if skewed and not self._clock_skewed:
            log.warning("the database's clock is %+.1fs from this controller's: heartbeat "
                        "ages and drain deadlines are off by as much; sync both clocks "
                        "(NTP)", offset)
        elif self._clock_skewed and not skewed:
            log.info("the database's clock is back within %.1fs of this controller's",
                     self.settings.heartbeat_timeout / 3)
        self._clock_skewed = skewed

    async def _follow(self) -> None:
        self._watch_clock(None)
        self.history = {}
        if self.last_plan is not None:
            self.metrics.clear_plan()
        self.last_plan = None
        self._epoch_seen = None
        async with self.db.acquire() as conn:
            timeout = self.config.io_timeout
            self.published = await runtime.read_published(conn, timeout=timeout)
            self.queue = await runtime.read_demand(conn, timeout=timeout)

    async def _read_remembered(self) -> dict[str, tuple[float, str | None]]:
        """The published start-up estimates, each with its release. A failed read costs
        only the memory: the start-ups are measured afresh, as they would be without
        it."""
        try:
            async with self.db.acquire() as conn:
                rows = await runtime.read_published(conn, timeout=self.config.io_timeout)
        except DB_ERRORS as e:
            log.warning("could not read the previous leadership's start-up times (%s): "
                        "measuring them afresh", e)
            return {}
        return {r.pool_id: (r.startup, r.startup_revision) for r in rows
                if r.startup is not None}

    async def _read_past(self) -> tuple[float, dict[str, PastArrivals]] | None:
        """Each pool's tasks as far back as a leader reading all along would still hold
        them, so that the new leader's estimates start from them (`plan.read_back`). A
        failed read costs only that: the leader reads the arrivals afresh, as it did
        before this was read."""
        s = self.settings
        span = max(past_span(x, s) for x in
                   [None, *(got[0] for got in self._remembered.values())])
        try:
            async with self.db.acquire() as conn:
                past = await runtime.read_past(conn, span, grain=s.peak_grain,
                                               timeout=self.config.io_timeout)
        except DB_ERRORS as e:
            log.warning("could not read the arrivals before this leadership (%s): "
                        "reading them afresh", e)
            return None
        return self.clock.time(), past

    async def _lead(self, result: TickResult) -> None:
        epoch = self.leadership.epoch
        assert epoch is not None
        if epoch != self._epoch_seen:
            self.history = {}  # a new leadership observes its windows afresh
            self._epoch_seen = epoch
            self._rates_read_at = None
            self._remembered = await self._read_remembered()
            self._past = await self._read_past()
        s = self.settings
        read_at = self.clock.monotonic()
        # the peak is read since the previous read (the interval on a first read)
        since = self.config.interval if self._rates_read_at is None else \
            read_at - self._rates_read_at
        self._rates_read_at = read_at
        reads = RateReads(s.rate_window, s.peak_grain, peak_span(since, s))
        snapshot = await read_snapshot(self.db, self.orchestrators, clock=self.clock,
                                       timeout=self.config.io_timeout, rates=reads)
        self._watch_clock(None if snapshot.db is None else snapshot.db.clock_offset)
        now = self.clock.time()
        if self._remembered:
            self.history = remembered(self.history, {
                x.spec.pool_id: got[0] for x in snapshot.pools
                if (got := self._remembered.get(x.spec.pool_id)) is not None
                # a new release may start differently: measured again
                and got[1] == x.spec.expected_revision})
            self._remembered = {}
        if self._past is not None:
            # a replay of some hundred reads per pool: off the event loop, which must
            # keep renewing the lease meanwhile
            self.history = await asyncio.to_thread(
                read_back, self.history, self._past[1], now=self._past[0], settings=s)
            self._past = None
        p = plan(snapshot, self.history, now=now, settings=self.settings)
        self.history = p.history
        self.last_plan = result.plan = p
        self.queue = {x.spec.pool_id: x.demand for x in snapshot.pools if x.demand is not None}
        self.metrics.observe_plan(p)
        specs = {x.spec.pool_id: x.spec for x in snapshot.pools}
        await fenced.publish_desired(
            self.db, epoch,
            [fenced.DesiredRow(x.pool_id, x.desired_replicas, x.current_replicas, x.raw_desired,
                               x.reason, x.frozen_reason, x.history.estimates.startup,
                               specs[x.pool_id].expected_revision) for x in p.pools],
            now=now, valid_until=now + 2 * self.config.interval,
        )
        try:
            await self.actuator.apply(p, specs, epoch=epoch, shadow=self.config.shadow,
                                      records=result.actions,
                                      inputs={x.spec.pool_id: x for x in snapshot.pools})
        finally:
            self.actions.extend(result.actions)
            self.metrics.observe_actions(result.actions)
        if not self.config.shadow:  # a dry run deletes nothing
            await self._prune(list(specs))

    async def _prune(self, pools: list[str]) -> None:
        """Delete the tasks that finished more than ``task_retention`` ago (or longer,
        while a new leader would read them back), once a minute, by the leader alone:
        a batch per pool a statement, again for the pools whose whole batch went, until
        none did or `PRUNE_BUDGET` is spent. Not fenced: a deposed leader deleting them
        too deletes the same tasks. A failure is logged and never fails the tick: the
        tasks are deleted at the next try."""
        at = self.clock.monotonic()
        if self.config.task_retention <= 0 or (
                self._pruned_at is not None and at - self._pruned_at < PRUNE_EVERY):
            return
        self._pruned_at = at
        s = self.settings
        keep = max(self.config.task_retention, *(
            past_span(h.estimates.startup, s) for h in
            [PoolHistory(), *self.history.values()]))
        pools = random.sample(pools, len(pools))  # a budget spent early spares others
        try:
            async with self.db.acquire() as conn:
                while pools and self.clock.monotonic() - at < PRUNE_BUDGET:
                    full = []
                    for pool in pools:
                        if self.clock.monotonic() - at >= PRUNE_BUDGET:
                            break
                        n = await runtime.prune_finished(conn, pool, keep, batch=PRUNE_BATCH,
                                                         timeout=self.config.io_timeout)
                        self.metrics.pruned.inc(n)
                        if n >= PRUNE_BATCH:
                            full.append(pool)
                    pools = full
        except DB_ERRORS as e:
            log.warning("could not delete tasks past their retention (%s): next time", e)
