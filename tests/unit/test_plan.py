"""The capacity plan's demand rules, windows, min/max, caps and freezes, one table each.

Every row names the rule it pins down; docs/autoscaling.md explains the same rules.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from roost.decide.drain import MarkDraining, Reactivate, ScaleUp
from roost.decide.plan import PoolHistory, raw_desired
from roost.decide.snapshot import PlanSettings, WorkerStatus
from tests.unit.test_plan_helpers import (
    NOW,
    SETTINGS,
    db,
    held,
    node,
    pool,
    run,
    snap,
    spec,
    worker,
)


@pytest.mark.parametrize(
    ("queued", "running", "target", "raw"),
    [
        (0, 0, 5, 0),  # no demand, no replicas needed
        (1, 0, 5, 1),  # any demand needs one replica
        (5, 0, 5, 1),  # exactly one replica's worth
        (6, 0, 5, 2),  # rounds up, never down
        (3, 4, 5, 2),  # running tasks count as demand too
        (100, 0, 1, 100),
    ],
)
def test_raw_desired(queued: int, running: int, target: int, raw: int) -> None:
    assert raw_desired(queued + running, target) == raw
    p = run(snap(pool(spec(target_per_replica=target), queued=queued, running=running)))
    assert p.pool("p").raw_desired == raw


# current = 2 replicas, target 5 per replica; the history holds earlier samples.
@pytest.mark.parametrize(
    ("rule", "queued", "history", "desired"),
    [
        ("demand held above current for the window scales up", 20, held(20), 4),
        ("no history yet: the window is not observed", 20, PoolHistory(), 2),
        ("above current for only 20s of 30s", 20, held([5, 5, 5, 5, 5, 5, 5, 20, 20]), 2),
        ("rising demand scales to the least seen in the window", 25, held([15, 20, 25]), 3),
        ("a dip inside the window restarts it", 20, held([20, 20, 5, 20]), 2),
    ],
)
def test_scale_up_window(rule: str, queued: int, history: PoolHistory, desired: int) -> None:
    p = run(snap(pool(queued=queued)), {"p": history}).pool("p")
    assert p.desired_replicas == desired, rule
    assert p.steps == ((ScaleUp("p", desired),) if desired > 2 else ()), rule


def test_scale_up_window_zero_acts_at_once() -> None:
    settings = replace(SETTINGS, scale_up_window=0)
    p = run(snap(pool(queued=20)), settings=settings).pool("p")
    assert p.desired_replicas == 4
    assert p.steps == (ScaleUp("p", 4),)


# current = 4 replicas, target 5; stabilization window 60s.
@pytest.mark.parametrize(
    ("rule", "queued", "running", "history", "desired"),
    [
        ("idle for the whole window, queue empty: scale down", 0, 0, held(0), 0),
        ("idle for only 30s of 60s", 0, 0, held([20] * 4 + [0] * 3), 4),
        ("the most demand seen in the window sets the floor", 0, 5, held([5, 10, 5, 5, 5, 5]), 2),
        ("below current but tasks still queued: hold", 1, 0, held(1), 4),
        ("running-only demand with an empty queue may scale down", 0, 10, held(10), 2),
    ],
)
def test_scale_down_stabilization_and_empty_queue(
    rule: str, queued: int, running: int, history: PoolHistory, desired: int
) -> None:
    p = run(snap(pool(replicas=4, queued=queued, running=running)), {"p": history}).pool("p")
    assert p.desired_replicas == desired, rule
    drains = [s for s in p.steps if isinstance(s, MarkDraining)]
    assert len(drains) == (1 if desired < 4 else 0), rule  # a budget of one at a time


# small_pool_replicas 5, window 60 s: a pool of n < 5 waits 60 x 5 / n seconds.
@pytest.mark.parametrize(
    ("rule", "replicas", "idle_for", "desired"),
    [
        ("one replica waits 300 s: idle 290 s holds", 1, 290, 1),
        ("one replica waits 300 s: idle 300 s scales down", 1, 300, 0),
        ("two replicas wait 150 s: idle 140 s holds", 2, 140, 2),
        ("two replicas wait 150 s: idle 150 s scales down", 2, 150, 0),
        ("four replicas wait 75 s: idle 70 s holds", 4, 70, 4),
        ("five or more wait the plain window: idle 60 s scales down", 5, 60, 0),
    ],
)
def test_small_pool_waits_longer(rule: str, replicas: int, idle_for: int,
                                 desired: int) -> None:
    settings = replace(SETTINGS, small_pool_replicas=5)
    # busy until idle_for seconds ago, idle since (the plan adds NOW's own idle sample)
    history = held([20] * 30 + [0] * (idle_for // 10))
    p = run(snap(pool(replicas=replicas)), {"p": history}, settings=settings).pool("p")
    assert p.desired_replicas == desired, rule
    if desired == replicas:
        assert "not yet held" in p.reason, rule
    else:
        assert f"for {60 * max(1, 5 / replicas):.0f}s" in p.reason, rule


@pytest.mark.parametrize(
    ("rule", "own", "replicas", "idle_for", "desired"),
    [
        ("a pool's 300 s holds a large pool past the controller's 60 s", 300, 8, 290, 8),
        ("a pool's 300 s scales it down at 300 s", 300, 8, 300, 0),
        ("a pool's 30 s replaces the small-pool 150 s: idle 30 s scales down", 30, 2, 30, 0),
        ("a pool's 30 s: idle 20 s holds", 30, 2, 20, 2),
        ("a pool's 0 s scales down at the first idle read", 0, 4, 0, 0),
    ],
)
def test_a_pools_own_scale_down_window_replaces_the_controllers(
        rule: str, own: int, replicas: int, idle_for: int, desired: int) -> None:
    """``PoolSpec.scale_down_window`` (HPA's per-object stabilization) is the window,
    whatever the controller's and its small-pool lengthening would be."""
    settings = replace(SETTINGS, small_pool_replicas=5)
    history = held([50] * 40 + [0] * (idle_for // 10))  # 50 tasks: 10 replicas' worth
    p = run(snap(pool(spec(scale_down_window=own), replicas=replicas)), {"p": history},
            settings=settings)
    assert p.pool("p").desired_replicas == desired, rule
    if desired == replicas:
        assert f"not yet held for {own}s" in p.pool("p").reason, rule
    else:
        assert f"for {own}s" in p.pool("p").reason, rule
    # the history reaches back over the pool's own window
    assert NOW - p.history["p"].samples[0][0] >= own


def test_the_small_pool_window_is_kept_in_the_history() -> None:
    settings = replace(SETTINGS, small_pool_replicas=5)
    hist = run(snap(pool(replicas=1)), {"p": held(0, seconds=1000)}, settings=settings).history
    assert NOW - hist["p"].samples[0][0] >= 300  # the newest sample at or before NOW - 300
    assert NOW - hist["p"].samples[0][0] < 310


@pytest.mark.parametrize(
    ("rule", "replicas", "queued", "history", "bounds", "desired"),
    [
        ("below min scales up at once, no window", 1, 0, PoolHistory(), (3, 10), 3),
        ("above max scales down even with a queue", 8, 50, PoolHistory(), (0, 5), 5),
        ("demand past max is clamped", 2, 500, held(500), (0, 10), 10),
        ("idle pools keep min", 4, 0, held(0), (2, 10), 2),
    ],
)
def test_min_max(rule: str, replicas: int, queued: int, history: PoolHistory,
                 bounds: tuple[int, int], desired: int) -> None:
    s = spec(min_replicas=bounds[0], max_replicas=bounds[1])
    p = run(snap(pool(s, replicas=replicas, queued=queued)), {"p": history}).pool("p")
    assert p.desired_replicas == desired, rule
    assert not p.frozen_reason


# current = 2, target 1 per replica, 10 tasks held: demand asks for 10 replicas.
@pytest.mark.parametrize(
    ("rule", "nodes", "worker_size", "desired", "capped_by"),
    [
        ("roomy node: no cap", [node()], (1000, 1024), 10, ()),
        ("memory target: 80% of 10 GiB with 6 GiB used leaves 2 workers",
         [node(mem=10240, used_mem=6144)], (1000, 1024), 4, ("memory_target",)),
        ("memory hard: no node may pass 90%, though the aggregate is under target",
         [node("a", mem=10240, used_mem=8192), node("b", mem=10240, used_mem=8192)],
         (100, 2048), 2, ("memory_hard",)),
        ("a node under memory pressure takes no workers",
         [node(pressure=True)], (1000, 1024), 2, ("memory_pressure",)),
        ("pressure on one node: the others still take workers",
         [node("a", pressure=True, mem=262_144), node("b", mem=8192)], (100, 1024), 9,
         ("memory_hard", "memory_pressure")),
        ("cpu target: 75% of 4 cores with 2 used leaves 1 worker",
         [node(cpu=4000, used_cpu=2000)], (1000, 64), 3, ("cpu_target",)),
        ("per-node fit: a 8-core worker on 6-core nodes",
         [node("a", cpu=6000), node("b", cpu=6000)], (8000, 64), 2, ("node_fit",)),
        ("no nodes reported: no growth", [], (1000, 1024), 2, ("no_nodes",)),
    ],
)
def test_node_caps(rule: str, nodes: list[object], worker_size: tuple[int, int], desired: int,
                   capped_by: tuple[str, ...]) -> None:
    settings = replace(SETTINGS, scale_up_window=0, cpu_target_percent=75,
                       memory_target_percent=90 if "hard" in rule else 80)
    s = spec(target_per_replica=1, worker_cpu_milli=worker_size[0],
             worker_mem_mib=worker_size[1])
    p = run(snap(pool(s, queued=10, nodes=nodes)), settings=settings).pool("p")  # type: ignore[arg-type]
    assert (p.desired_replicas, p.capped_by) == (desired, capped_by), rule
    assert p.steps == ((ScaleUp("p", desired),) if desired > 2 else ())


@pytest.mark.parametrize(
    ("rule", "health", "pool_size", "desired"),
    [
        # budget = 50 - 3 reserved - 10 non-worker = 37; 2 replicas x 5 = 10 used: room 27.
        ("db budget caps growth", db(max_connections=50), 5, 7),
        # two sync peers hold 2 more connections: room 25.
        ("synchronous replication peers are accounted", db(max_connections=50, sync_peers=2),
         5, 7),
        ("synchronous peers can push a pool under a replica", db(max_connections=48,
                                                                 sync_peers=2), 5, 6),
        ("workers without a db pool are not bounded by it", db(max_connections=20), 0, 10),
    ],
)
def test_db_budget_cap(rule: str, health: object, pool_size: int, desired: int) -> None:
    settings = replace(SETTINGS, scale_up_window=0)
    s = spec(target_per_replica=1, worker_db_pool_size=pool_size)
    p = run(snap(pool(s, queued=10), health=health), settings=settings)  # type: ignore[arg-type]
    assert p.pool("p").desired_replicas == desired, rule
    assert p.pool("p").capped_by == (() if desired == 10 else ("db_budget",)), rule


def test_db_budget_is_shared_fairly_across_pools() -> None:
    # room = 50 - 3 - 10 - (2 + 2) * 5 = 17: three more workers of 5 connections.
    settings = replace(SETTINGS, scale_up_window=0)
    a = spec("a", target_per_replica=1, worker_db_pool_size=5)
    b = spec("b", target_per_replica=1, worker_db_pool_size=5)
    p = run(snap(pool(a, queued=10), pool(b, queued=10), health=db(max_connections=50)),
            settings=settings)
    assert (p.pool("a").desired_replicas, p.pool("b").desired_replicas) == (4, 3)
    assert p.db_worker_budget == 37
    assert p.db_connections_used == 20


def test_pools_sharing_nodes_share_their_headroom() -> None:
    # One node: 80% of 10 GiB = 8 workers of 1 GiB, 4 already running.
    settings = replace(SETTINGS, scale_up_window=0)
    shared = [node("n", mem=10240, used_mem=4096)]
    a = spec("a", target_per_replica=1)
    b = spec("b", target_per_replica=1)
    p = run(snap(pool(a, queued=10, nodes=shared), pool(b, queued=10, nodes=shared)),
            settings=settings)
    assert p.pool("a").desired_replicas + p.pool("b").desired_replicas == 4 + 4


@pytest.mark.parametrize(
    ("rule", "kwargs", "code"),
    [
        ("database health missing", {"no_db": True, "errors": ["db: timeout"]},
         "inputs_missing"),
        ("database health stale", {"health": db(at=NOW - 31)}, "stale_inputs"),
        ("demand and workers stale", {"read_at": NOW - 31}, "stale_inputs"),
        ("database in recovery", {"health": db(in_recovery=True)}, "db_unhealthy"),
        ("budget cannot hold the minimums", {"health": db(max_connections=16)}, "db_budget"),
    ],
)
def test_global_freezes(rule: str, kwargs: dict[str, object], code: str) -> None:
    s = spec(min_replicas=2, worker_db_pool_size=2)  # 4 connections at minimum
    p = run(snap(pool(s, queued=100, replicas=3), **kwargs), {"p": held(100)}  # type: ignore[arg-type]
            ).pool("p")
    assert p.frozen_reason is not None and p.frozen_reason.startswith(code), rule
    assert (p.desired_replicas, p.steps, p.action) == (3, (), "frozen"), rule


def test_expected_sync_peers_missing_freezes() -> None:
    settings = replace(SETTINGS, db_expected_sync_peers=1)
    p = run(snap(pool(queued=100)), {"p": held(100)}, settings=settings).pool("p")
    assert p.frozen_reason is not None and p.frozen_reason.startswith("db_unhealthy")


@pytest.mark.parametrize(
    ("rule", "kwargs", "code"),
    [
        ("orchestrator unreachable", {"no_infra": True, "missing": ["infra: timeout"]},
         "inputs_missing"),
        ("demand query failed", {"no_demand": True}, "inputs_missing"),
        ("worker query failed", {"no_workers": True}, "inputs_missing"),
        ("orchestrator state stale", {"infra_at": NOW - 60}, "stale_inputs"),
        ("a fresh worker runs another revision",
         {"workers": [worker("a"), worker("b", revision="r0")]}, "revision_mismatch"),
    ],
)
def test_pool_freezes_never_scale_down(rule: str, kwargs: dict[str, object], code: str) -> None:
    s = spec(expected_revision="r1")
    # Idle for the whole window: unfrozen, this pool would drain a worker.
    frozen = pool(s, replicas=2, **kwargs)  # type: ignore[arg-type]
    calm = pool(spec("q", expected_revision="r1"), replicas=2)
    p = run(snap(frozen, calm), {"p": held(0), "q": held(0)})
    assert p.pool("p").frozen_reason is not None, rule
    assert p.pool("p").frozen_reason.startswith(code), rule  # type: ignore[union-attr]
    assert p.pool("p").steps == (), rule
    assert p.pool("q").frozen_reason is None  # one pool's trouble stays its own
    assert any(isinstance(s, MarkDraining) for s in p.pool("q").steps)


def test_revision_check_ignores_gone_and_stale_workers() -> None:
    s = spec(expected_revision="r2")
    ws = [
        worker("a", revision="r2"),
        worker("b", revision="r2"),
        worker("old", revision="r1", status=WorkerStatus.GONE),
        worker("dead", revision="r1", hb=NOW - 300),
    ]
    p = run(snap(pool(s, workers=ws, instances=["i-a", "i-b"]))).pool("p")
    assert p.frozen_reason is None


def test_missing_demand_clears_history() -> None:
    p = run(snap(pool(no_demand=True)), {"p": held(50)}).pool("p")
    assert p.history.samples == ()  # the estimates and drain records are not demand


def test_frozen_pool_still_reactivates_a_timed_out_drain() -> None:
    ws = [worker("a"), worker("b", status=WorkerStatus.DRAINING, running=1,
                             draining_since=NOW - 121)]
    p = run(snap(pool(workers=ws), no_db=True)).pool("p")
    assert p.frozen_reason
    assert p.steps == (Reactivate("p", "b", "drain_timeout"),)


def test_history_keeps_only_what_the_windows_need() -> None:
    h = PoolHistory()
    for t in range(0, 1000, 10):
        h = h.add(float(t), t, keep=60)
    assert h.samples[0][0] == 990 - 60
    assert h.window(990, 60) == [930, 940, 950, 960, 970, 980, 990]
    assert h.window(990, 61) is None


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="memory target"):
        PlanSettings(memory_target_percent=95, memory_hard_percent=90).validate()
    with pytest.raises(ValueError, match="scale_up_window"):
        PlanSettings(scale_up_window=-1).validate()
    with pytest.raises(ValueError, match="small_pool_replicas"):
        PlanSettings(small_pool_replicas=0).validate()
