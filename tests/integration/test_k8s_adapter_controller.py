"""The capacity controller's reconcile loop (real Postgres, real leadership, a fake clock)
driving the kubernetes orchestrator over HTTP: a drained worker's pod, and no other, is
the one the ReplicaSet removes; k drained workers leave in one scale-down; a not-ready
pod holds the removal back; a conflict is a failed action that the next tick finishes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from roost.controller.adapters.kubernetes import KubernetesOrchestrator, KubernetesSettings
from roost.controller.clock import FakeClock
from roost.controller.config import ControllerConfig
from roost.controller.leadership import Leadership
from roost.controller.loop import Controller, TickResult
from roost.store import pools as pools_q
from roost.store.timeconv import to_ts
from tests.integration.test_controller_helpers import add_worker, open_db, pool_spec, worker_rows
from tests.k8s_fake_api import FakeApiServer, FakeCluster, controller_grants, write_kubeconfig

NS, DEP = "roost-workers", "roost-worker"


@dataclass
class Loop:
    db: Any
    cluster: FakeCluster
    orch: KubernetesOrchestrator
    controller: Controller
    clock: FakeClock
    running: dict[str, int] = field(default_factory=dict)

    async def tick(self) -> TickResult:
        """Ten seconds on; every pod's worker reports (as the worker runtime would, under
        its POD_NAME); one tick."""
        self.clock.advance(10)
        known = await worker_rows(self.db, "batch")
        for name in self.cluster.names(NS, DEP):
            if name not in known:
                await add_worker(self.db, "batch", name, at=self.clock.time(), ref=name)
        await self.db.execute("UPDATE workers SET heartbeat_at = $1 WHERE status <> 'gone'",
                              to_ts(self.clock.time()))
        for wid, n in self.running.items():
            await self.db.execute("UPDATE workers SET running_tasks = $2 WHERE id = $1", wid, n)
        return await self.controller.tick()

    async def draining(self) -> list[str]:
        return [w for w, r in (await worker_rows(self.db, "batch")).items()
                if r["status"] == "draining"]


@pytest.fixture
async def loop(pg_dsn: str, tmp_path: Path) -> AsyncIterator[Loop]:
    cluster = FakeCluster(token="s3cret", grants=controller_grants())
    cluster.add_node("node-a", cpu="16", memory="64Gi")
    cluster.add_deployment(NS, DEP, replicas=3, requests={"cpu": "500m", "memory": "512Mi"})
    server = await FakeApiServer(cluster).start()
    clock = FakeClock()
    orch = KubernetesOrchestrator.from_settings(
        KubernetesSettings(kubeconfig=str(write_kubeconfig(tmp_path / "kc", server.url,
                                                           token="s3cret")),
                           cluster_view_ttl=0),
        now=clock.time)
    db = await open_db(pg_dsn)
    await pools_q.create_pool(db, pool_spec("batch", orchestrator="kubernetes",
                                            orchestrator_ref=f"{NS}/{DEP}",
                                            worker_cpu_milli=500, worker_mem_mib=512))
    config = ControllerConfig(dsn=pg_dsn, interval=10, scale_up_window=0,
                              scale_down_window=0, drain_timeout=120,
                              follower_retry=0.01).validate()
    leadership = Leadership(pg_dsn, holder="k8s-test", clock=clock,
                            retry_interval=config.follower_retry)
    controller = Controller(db=db, leadership=leadership, orchestrators={"kubernetes": orch},
                            config=config, clock=clock)
    try:
        yield Loop(db, cluster, orch, controller, clock)
    finally:
        await leadership.close()
        await db.close()
        await orch.close()
        await server.stop()


async def test_the_drained_workers_pod_is_the_one_removed(loop: Loop) -> None:
    a, b, c = loop.cluster.names(NS, DEP)
    loop.running = {a: 2, c: 1}
    res = await loop.tick()  # no demand: drain the least busy worker, b
    assert res.leader and res.error is None
    assert await loop.draining() == [b]
    # A pod turning not-ready holds the removal back: the ReplicaSet would take it first.
    loop.cluster.set_ready(NS, c, False)
    res = await loop.tick()
    assert [r.kind for r in res.actions] == []
    assert loop.cluster.names(NS, DEP) == [a, b, c]
    loop.cluster.set_ready(NS, c, True)
    res = await loop.tick()
    assert [(r.kind, r.outcome, r.replicas) for r in res.actions] == [("remove", "ok", 2)]
    assert loop.cluster.names(NS, DEP) == [a, c]
    assert loop.cluster.deleted == [b]
    rows = await worker_rows(loop.db, "batch")
    assert rows[b]["status"] == "gone"
    await loop.tick()  # the next read confirms which pod went
    (check,) = loop.orch.removal_checks("batch")
    assert (check.outcome, check.expected) == ("ok", (b,))


async def test_a_conflict_fails_the_action_and_the_next_tick_finishes_it(loop: Loop) -> None:
    a, b, c = loop.cluster.names(NS, DEP)
    loop.running = {a: 1, c: 1}
    await loop.tick()  # drains b
    loop.cluster.before_scale_patch.append(lambda: loop.cluster.touch(NS, DEP))
    res = await loop.tick()
    assert [(r.kind, r.outcome) for r in res.actions] == [("remove", "failed")]
    assert "ScaleConflict" in res.actions[0].detail
    assert loop.cluster.names(NS, DEP) == [a, b, c]
    res = await loop.tick()
    assert [(r.kind, r.outcome, r.replicas) for r in res.actions] == [("remove", "ok", 2)]
    assert loop.cluster.deleted == [b]


async def test_k_drained_workers_leave_in_one_scale_down(loop: Loop) -> None:
    await pools_q.update_pool(loop.db, "batch", disruption_replicas=3)
    loop.cluster.scale(NS, DEP, 6)
    busy = loop.cluster.names(NS, DEP)[:3]
    loop.running = {w: 1 for w in busy}
    await loop.tick()  # 3 running at 1 per replica: 3 idle workers drain at once
    drained = await loop.draining()
    assert len(drained) == 3 and not set(drained) & set(busy)
    patches = sum(1 for m, p, _ in loop.cluster.requests if m == "PATCH" and p.endswith("/scale"))
    res = await loop.tick()  # they report idle: one removal for the three
    removes = [(r.kind, r.outcome, r.replicas) for r in res.actions if r.kind == "remove"]
    assert removes == [("remove", "ok", 6 - len(drained))]
    after = sum(1 for m, p, _ in loop.cluster.requests if m == "PATCH" and p.endswith("/scale"))
    assert after - patches == 1  # one request for the batch
    assert sorted(loop.cluster.deleted) == sorted(drained)
    await loop.tick()
    (check,) = loop.orch.removal_checks("batch")
    assert (check.outcome, check.expected) == ("ok", tuple(sorted(drained)))
