"""A controller rig for loop tests (no tests here): real Postgres, real leadership, the
fake orchestrator and a fake clock. The rig plays the worker runtime too: it registers a
worker row for every fake instance and heartbeats them at the fake clock's time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx

from roost.controller.adapters import FakeOrchestrator
from roost.controller.clock import FakeClock
from roost.controller.config import ControllerConfig
from roost.controller.leadership import Leadership
from roost.controller.loop import Controller, TickResult
from roost.controller.orchestrator import NodeFigures
from roost.decide.snapshot import PoolSpec
from roost.store import pools as pools_q
from roost.store.migrations import migrate
from roost.store.timeconv import to_ts
from tests.polling import until

BIG_NODE = NodeFigures("n1", 64_000, 262_144, 0, 0)


async def open_db(dsn: str) -> Any:
    db = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    async with db.acquire() as conn:
        await migrate(conn)
    return db


async def status_when(http: httpx.AsyncClient, what: str,
                      ready: Callable[[dict[str, Any]], object],
                      timeout: float = 10.0) -> dict[str, Any]:
    """A served controller's ``/status``, read every 0.05 s until ``ready`` holds of it."""
    doc: dict[str, Any] = {}

    async def read() -> object:
        nonlocal doc
        doc = (await http.get("/status")).json()
        return ready(doc)

    await until(what, read, timeout=timeout, interval=0.05, detail=lambda: f"/status {doc}")
    return doc


def pool_spec(pool_id: str = "p", **kw: Any) -> PoolSpec:
    """A pool without a growth bound to speak of and with a disruption budget of one
    worker at a time, so each rule shows alone (test_controller_bounds.py has both)."""
    base: dict[str, Any] = dict(min_replicas=0, max_replicas=10, target_per_replica=1,
                                worker_cpu_milli=1000, worker_mem_mib=1024,
                                worker_db_pool_size=2, orchestrator="fake",
                                orchestrator_ref=pool_id, growth_replicas=1000,
                                disruption_replicas=1, disruption_percent=0)
    base.update(kw)
    return PoolSpec(pool_id=pool_id, **base)


async def add_worker(db: Any, pool_id: str, worker_id: str, *, at: float, ref: str = "",
                     revision: str = "r1", running: int = 0) -> None:
    await db.execute(
        "INSERT INTO workers (id, pool_id, instance_ref, revision, running_tasks, heartbeat_at)"
        " VALUES ($1, $2, $3, $4, $5, $6)",
        worker_id, pool_id, ref or worker_id, revision, running, to_ts(at),
    )


async def enqueue(db: Any, pool_id: str, n: int, *, status: str = "queued") -> None:
    await db.execute(
        "INSERT INTO tasks (pool_id, status) SELECT $1, $2 FROM generate_series(1, $3)",
        pool_id, status, n,
    )


async def set_tasks(db: Any, pool_id: str, *, frm: str, to: str, n: int) -> None:
    await db.execute(
        "UPDATE tasks SET status = $3 WHERE id IN (SELECT id FROM tasks WHERE pool_id = $1 "
        "AND status = $2 ORDER BY id LIMIT $4)", pool_id, frm, to, n,
    )


async def worker_rows(db: Any, pool_id: str) -> dict[str, dict[str, Any]]:
    rows = await db.fetch("SELECT * FROM workers WHERE pool_id = $1", pool_id)
    return {r["id"]: dict(r) for r in rows}


@dataclass
class Rig:
    dsn: str
    db: Any
    clock: FakeClock = field(default_factory=FakeClock)
    fake: FakeOrchestrator = field(init=False)
    controllers: list[Controller] = field(default_factory=list)
    running: dict[str, int] = field(default_factory=dict)
    """Running tasks each worker reports in its heartbeat (default 0)."""
    revision: str = "r1"

    def __post_init__(self) -> None:
        self.fake = FakeOrchestrator(now=self.clock.time)

    def controller(self, **settings: Any) -> Controller:
        base: dict[str, Any] = dict(dsn=self.dsn, interval=10, scale_up_window=30,
                                    scale_down_window=60, drain_timeout=120,
                                    follower_retry=0.01)
        base.update(settings)
        config = ControllerConfig(**base).validate()
        leadership = Leadership(self.dsn, holder=f"test-{len(self.controllers)}",
                                clock=self.clock, retry_interval=config.follower_retry)
        c = Controller(db=self.db, leadership=leadership, orchestrators={"fake": self.fake},
                       config=config, clock=self.clock)
        self.controllers.append(c)
        return c

    async def add_pool(self, pool_id: str = "p", *, replicas: int = 0, **kw: Any) -> PoolSpec:
        spec = await pools_q.create_pool(self.db, pool_spec(pool_id, **kw))
        self.fake.add_pool(spec.orchestrator_ref, replicas=replicas, nodes=[BIG_NODE])
        await self.sync_workers()
        return spec

    async def sync_workers(self) -> None:
        """What the worker runtime would do: a worker per instance, all heartbeating."""
        now = self.clock.time()
        pools = await pools_q.list_pools(self.db)
        for spec in pools:
            if spec.orchestrator != "fake":
                continue
            known = await worker_rows(self.db, spec.pool_id)
            for ref in self.fake.instances(spec.orchestrator_ref):
                if ref not in known:
                    await add_worker(self.db, spec.pool_id, ref, at=now, revision=self.revision)
        await self.db.execute("UPDATE workers SET heartbeat_at = $1 WHERE status <> 'gone'",
                              to_ts(now))
        for wid, n in self.running.items():
            await self.db.execute("UPDATE workers SET running_tasks = $2 WHERE id = $1", wid, n)

    async def tick(self, c: Controller | None = None, *, advance: float = 10) -> TickResult:
        """Move the clock, let workers report, run one tick."""
        self.clock.advance(advance)
        await self.sync_workers()
        return await (c or self.controllers[0]).tick()

    async def close(self) -> None:
        for c in self.controllers:
            await c.leadership.close()
        await self.db.close()
