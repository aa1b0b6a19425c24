"""Drain-safe scale-down in the plan: who is drained, when a replica goes, when a drain
is called off. Plus properties that must hold for any snapshot."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roost.decide.drain import MarkDraining, Reactivate, RemoveReplica, ScaleUp
from roost.decide.snapshot import WorkerStatus, WorkerView
from tests.unit.test_plan_helpers import NOW, SETTINGS, held, pool, run, snap, spec, worker

D = WorkerStatus.DRAINING


def _idle_pool(ws: list[WorkerView], **kw: object) -> object:
    return pool(workers=ws, replicas=len(ws), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("rule", "workers", "picked"),
    [
        ("least busy (running + leases) is drained",
         [worker("a", running=3), worker("b", leases=1), worker("c", running=2)], "b"),
        ("ties break by worker id", [worker("b"), worker("a"), worker("c")], "a"),
        ("a worker with a stale heartbeat is never picked",
         [worker("a", hb=NOW - 31), worker("b", running=1)], "b"),
    ],
)
def test_least_busy_worker_is_drained(rule: str, workers: list[WorkerView], picked: str) -> None:
    p = run(snap(_idle_pool(workers)), {"p": held(0)}).pool("p")  # type: ignore[arg-type]
    assert [s for s in p.steps if isinstance(s, MarkDraining)] == [MarkDraining("p", picked)], rule


def test_a_worker_on_a_not_ready_instance_is_not_picked() -> None:
    ws = [worker("a"), worker("b", running=1)]
    p = run(snap(pool(workers=ws, unready=["i-a"])), {"p": held(0)}).pool("p")
    assert p.steps == (MarkDraining("p", "b"),)


def test_only_one_worker_drains_at_a_time() -> None:
    ws = [worker(f"w{i}") for i in range(6)]
    p = run(snap(_idle_pool(ws)), {"p": held(0)}).pool("p")  # type: ignore[arg-type]
    assert p.desired_replicas == 0
    assert p.steps == (MarkDraining("p", "w0"),)


MARKED = NOW - 20


@pytest.mark.parametrize(
    ("rule", "draining", "kwargs", "steps"),
    [
        ("still running tasks: wait",
         worker("d", status=D, running=2, draining_since=MARKED), {}, ()),
        ("still holding a lease: wait",
         worker("d", status=D, leases=1, draining_since=MARKED), {}, ()),
        ("empty, but the report predates the mark: wait",
         worker("d", status=D, draining_since=MARKED, hb=MARKED - 1), {}, ()),
        ("empty and reported after the mark: remove its replica",
         worker("d", status=D, draining_since=MARKED), {},
         (RemoveReplica("p", "d", "i-d", 2),)),
        ("empty, but another instance is not ready: wait (k8s removes it first)",
         worker("d", status=D, draining_since=MARKED), {"unready": ["i-a"]}, ()),
        ("empty, but its instance is unknown to the orchestrator: wait",
         worker("d", status=D, draining_since=MARKED, ref="i-elsewhere"),
         {"instances": ["i-a", "i-b", "i-d"]}, ()),
        ("drain past its timeout is re-activated; the next least-busy worker drains",
         worker("d", status=D, running=1, draining_since=NOW - 121), {},
         (Reactivate("p", "d", "drain_timeout"), MarkDraining("p", "a"))),
    ],
)
def test_drain_progress(rule: str, draining: WorkerView, kwargs: dict[str, object],
                        steps: tuple[object, ...]) -> None:
    ws = [worker("a"), worker("b"), draining]
    p = run(snap(pool(workers=ws, replicas=3, **kwargs)), {"p": held(0)}).pool("p")  # type: ignore[arg-type]
    assert p.steps == steps, rule


def test_demand_returning_calls_off_the_drain_and_scales_up() -> None:
    settings = replace(SETTINGS, scale_up_window=0)
    ws = [worker("a"), worker("d", status=D, running=1, draining_since=MARKED)]
    p = run(snap(pool(workers=ws, queued=20)), settings=settings).pool("p")
    assert set(p.steps) == {Reactivate("p", "d", "demand_returned"), ScaleUp("p", 4)}


@pytest.mark.parametrize(
    ("rule", "orchestrator_at", "step"),
    [
        ("removal committed, orchestrator not there yet: ask again for the same count",
         3, RemoveReplica("p", "d", "i-d", 2)),
        ("removal committed and done: only close the record", 2,
         RemoveReplica("p", "d", "i-d", None)),
    ],
)
def test_a_committed_removal_is_finished_first(rule: str, orchestrator_at: int,
                                                step: RemoveReplica) -> None:
    ws = [worker("a"), worker("b"), worker("d", status=D, draining_since=MARKED, removal=2)]
    refs = ["i-a", "i-b", "i-d"][:orchestrator_at]
    settings = replace(SETTINGS, scale_up_window=0)
    p = run(snap(pool(workers=ws, replicas=orchestrator_at, instances=refs, queued=100)),
            settings=settings).pool("p")
    assert p.steps == (step,), rule  # and no scale-up while it is pending


def test_a_committed_removal_is_never_reactivated() -> None:
    ws = [worker("a"), worker("d", status=D, draining_since=NOW - 1000, removal=1)]
    p = run(snap(pool(workers=ws, replicas=2))).pool("p")
    assert p.steps == (RemoveReplica("p", "d", "i-d", 1),)


# ---- properties over arbitrary snapshots ---------------------------------------------

_workers = st.lists(
    st.builds(
        WorkerView,
        worker_id=st.sampled_from(["a", "b", "c", "d", "e"]),
        status=st.sampled_from(list(WorkerStatus)),
        running_tasks=st.integers(0, 3),
        active_leases=st.integers(0, 2),
        revision=st.just("r1"),
        instance_ref=st.sampled_from(["i-a", "i-b", "i-c", "i-x"]),
        heartbeat_at=st.floats(NOW - 100, NOW),
        draining_since=st.one_of(st.none(), st.floats(NOW - 300, NOW)),
        removal_target=st.none(),
    ),
    max_size=5,
    unique_by=lambda w: w.worker_id,
)


@settings(max_examples=300, deadline=None)
@given(
    workers=_workers,
    replicas=st.integers(0, 6),
    queued=st.integers(0, 60),
    running=st.integers(0, 60),
    past=st.lists(st.integers(0, 60), max_size=12),
    bounds=st.tuples(st.integers(0, 3), st.integers(3, 8)),
    db_down=st.booleans(),
)
def test_plan_properties(workers: list[WorkerView], replicas: int, queued: int, running: int,
                         past: list[int], bounds: tuple[int, int], db_down: bool) -> None:
    s = spec(min_replicas=bounds[0], max_replicas=bounds[1])
    p = run(snap(pool(s, workers=workers, replicas=replicas, queued=queued, running=running,
                      instances=["i-a", "i-b", "i-c"][:replicas]), no_db=db_down),
            {"p": held(past)}).pool("p")
    by_id = {w.worker_id: w for w in workers}
    if db_down:
        assert p.frozen_reason and p.desired_replicas == replicas
        assert all(isinstance(x, Reactivate) for x in p.steps)
    assert len([x for x in p.steps if isinstance(x, MarkDraining)]) <= 1
    for x in p.steps:
        if isinstance(x, RemoveReplica):  # only drained workers lose their replica
            w = by_id[x.worker_id]
            assert w.status is D and w.running_tasks == 0 and w.active_leases == 0
        if isinstance(x, MarkDraining):
            assert by_id[x.worker_id].status is WorkerStatus.ACTIVE
            assert p.desired_replicas is not None and p.desired_replicas < replicas
        if isinstance(x, ScaleUp):
            assert replicas < x.replicas <= bounds[1]
    if not p.frozen_reason and p.desired_replicas is not None:
        assert p.desired_replicas <= max(bounds[1], replicas)
        if p.desired_replicas < replicas:  # demand shrinks a pool only with an empty queue
            assert queued == 0 or replicas > bounds[1]


@pytest.mark.parametrize(
    ("demand", "starting", "drained"),
    [
        # 2 serving workers, 3 replicas still starting; target 3 tasks per replica
        (3, 3, ["a"]),  # 1 wanted: one of the 2 serving drains, not both (budget 2)
        (6, 3, []),  # 2 wanted: none drains, though 5 replicas are 3 too many
        (6, 0, []),  # nothing starting, 2 wanted, 2 there: nothing to drain
        (3, 0, ["a"]),  # nothing starting: the ordinary drain
    ],
)
def test_no_drain_below_the_serving_workers_wanted(demand: int, starting: int,
                                                   drained: list[str]) -> None:
    """Replicas still starting count in the orchestrator's target but serve nothing:
    draining for them would leave fewer serving workers than the plan wants."""
    ws = [worker("a"), worker("b")]
    extra = [f"i-s{i}" for i in range(starting)]
    p = run(snap(pool(workers=ws, replicas=2 + starting, instances=["i-a", "i-b", *extra],
                      unready=extra, running=demand)),
            {"p": held(demand)}).pool("p")
    assert [s.worker_id for s in p.steps if isinstance(s, MarkDraining)] == drained
    if starting:
        assert p.desired_replicas == demand // 3
        assert "to drain once more workers serve" in p.reason


def test_a_silent_worker_is_not_counted_as_serving() -> None:
    """3 replicas, 2 wanted, one worker silent past the heartbeat timeout: draining a
    healthy one would leave 1 serving where 2 are wanted."""
    ws = [worker("a"), worker("b"), worker("c", hb=NOW - 31)]
    p = run(snap(_idle_pool(ws, running=6)), {"p": held(6)}).pool("p")  # type: ignore[arg-type]
    assert p.desired_replicas == 2
    assert not [s for s in p.steps if isinstance(s, MarkDraining)], p.reason
    assert "2 serving, 2 wanted" in p.reason
