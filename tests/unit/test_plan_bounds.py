"""The demand model, the growth bound and the disruption budget in the plan."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

import pytest

from roost.decide.demand import (
    Estimates,
    burst_rate,
    carried,
    in_service,
    jump_share,
    mean_queue,
    size,
)
from roost.decide.drain import MarkDraining, Reactivate, RemoveReplica, ScaleUp
from roost.decide.plan import (
    Allowance,
    PoolHistory,
    disruption_budget,
    growth_limit,
    periods_spent,
    remembered,
    worker_slots,
)
from roost.decide.snapshot import (
    Demand,
    Infra,
    InstanceView,
    PlanSettings,
    WorkerStatus,
    pool_spec_problems,
)
from tests.unit.test_plan_helpers import (
    NOW,
    SETTINGS,
    db,
    held,
    pool,
    run,
    snap,
    spec,
    worker,
)

D = WorkerStatus.DRAINING
S = PlanSettings(startup_default=30.0, drain_horizon=60.0)


def _est(service: float | None, startup: float | None = None) -> Estimates:
    return Estimates(service=service, service_at=NOW, startup=startup)


@pytest.mark.parametrize(
    ("rule", "demand", "est", "replicas", "effective"),
    [
        ("no rate: queued + running", Demand(40, 10), _est(1.0), 5, 50),
        ("no service time yet: queued + running", Demand(40, 10, 5.0), _est(None), 5, 50),
        ("steady: arrivals x service", Demand(2, 9, 10.0, None), _est(1.0), 4, 10),
        ("running above the rate's estimate wins (the rate lags a rise)",
         Demand(0, 30, 10.0), _est(1.0), 10, 30),
        # 10 replicas x 5 / 1 s = 50/s of capacity, 10/s arriving: 40/s spare clears
        # 1200 queued in the 30 s start-up: nothing left to size for
        ("backlog the pool clears before a new replica starts is not counted",
         Demand(1000, 10, 10.0), _est(1.0), 10, 10),
        # 2 replicas x 5 / 1 s = 10/s, all taken by arrivals: 600 left over 60 s = 10
        ("backlog left is drained within the horizon",
         Demand(600, 10, 10.0), _est(1.0), 2, 20),
        ("a measured start-up replaces the default",
         Demand(600, 10, 5.0), _est(1.0, startup=120.0), 2, 10),
        ("never above queued + running", Demand(3, 0, 100.0), _est(1.0), 1, 3),
        # 14 running where 10/s x 1 s predicts 10: within 2 sd of the noise (sd 3.2), so
        # mostly the rate's figure ((1 x 14 + 30 x 10) / 31 = 10.1), not the noisy count
        ("running within noise of arrivals x service reads mostly the rate",
         Demand(0, 14, 10.0), _est(1.0), 10, 11),
    ],
)
def test_demand_model(rule: str, demand: Demand, est: Estimates, replicas: int,
                      effective: int) -> None:
    got = size(demand, est, replicas=replicas, target=5, s=S)
    assert got.effective == effective, (rule, got.explain)
    assert got.explain, rule


def _erlang_c_queue(c: int, a: float) -> float:
    """The M/M/c mean queue by its closed form (powers and factorials, small c only)."""
    top = a ** c / math.factorial(c) * c / (c - a)
    waits = top / (sum(a ** k / math.factorial(k) for k in range(c)) + top)
    return waits * a / (c - a)


@pytest.mark.parametrize(("slots", "load"), [(1, 0.5), (2, 1.0), (4, 3.0), (10, 7.5),
                                             (30, 29.0), (40, 1.0)])
def test_the_mean_queue_is_erlangs_c_formula(slots: int, load: float) -> None:
    assert mean_queue(slots, load) == pytest.approx(_erlang_c_queue(slots, load), rel=1e-9)


def _erlang_b_from_zero(c: int, a: float) -> float:
    """Erlang's B formula by its recursion from no slots: exact to float rounding, at a
    cost that grows with ``c``."""
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    return b


@pytest.mark.parametrize("load", [150.0, 600.0, 5_000.25, 60_000.0])
@pytest.mark.parametrize("sds_above", [0.01, 0.5, 2.0, 6.0])
def test_a_large_load_reads_the_queue_from_near_it(load: float, sds_above: float) -> None:
    # the recursion starts 12 standard deviations below a load above 144 Erlangs; the
    # queue it reads is the one the recursion from no slots gives
    slots = math.floor(load + sds_above * math.sqrt(load)) + 1
    b = _erlang_b_from_zero(slots, load)
    expected = slots * b / (slots - load * (1 - b)) * load / (slots - load)
    assert expected > 0
    assert mean_queue(slots, load) == pytest.approx(expected, rel=1e-9)


def test_slots_that_cannot_keep_up_queue_without_bound() -> None:
    assert mean_queue(2, 2.0) == math.inf and mean_queue(1, 3.5) == math.inf
    assert mean_queue(4, 0.0) == 0.0
    # a worker that claims two billion slots: no queue, read in a few hundred steps
    assert mean_queue(2 ** 31, 5.0) == 0.0


@pytest.mark.parametrize("target", [1, 3, 12])
@pytest.mark.parametrize("slots", [1, 2, 4, 16])
def test_carried_is_the_fewest_replicas_that_carry_the_target(target: int, slots: int
                                                              ) -> None:
    for tenth in range(1, 2000, 7):
        load = tenth / 10
        got = carried(load, target, slots)
        least = max(1, math.ceil(load / target - 1e-9))
        r = least
        while load + mean_queue(slots * r, load) > target * r + 1e-9:  # one at a time
            r += 1
        assert got == (load if r == least else target * r), (load, got, r)


def test_the_queue_a_workers_slots_keep_counts_against_the_target() -> None:
    # one slot a worker sized at one task a replica: 20 replicas for 20 Erlangs run at a
    # utilisation of 1, where the queue has no bound; the fewest that carry the load and
    # its mean queue within one task each
    r = carried(20.0, 1, 1)
    assert r == int(r) > 20
    assert 20 + mean_queue(int(r), 20.0) <= r < 20 + mean_queue(int(r) - 1, 20.0) + 1
    # one worker of 4 slots at 3 Erlangs queues 1.53 on average: 4.53 outstanding against
    # a target of 3, so two replicas
    assert carried(3.0, 3, 4) == 6.0
    # 100 replicas of 4 slots sized at 3 a replica: 299 Erlangs queue next to none
    assert carried(299.0, 3, 4) == 299.0
    # no worker said: the load as it is
    assert carried(20.0, 1, None) == 20.0
    # a load a hair above a whole number of replicas with no queue to speak of (80 slots
    # for 5 Erlangs) is not one replica more; exactly a whole number with a queue is
    assert carried(5 + 1e-12, 1, 16) == 5 + 1e-12
    assert carried(30.0, 3, 4) == 33.0 and mean_queue(40, 30.0) > 0.1
    # slots fewer than the target: the replicas must at least hold the load in slots
    assert carried(10.0, 4, 1) >= 4 * 10.0 / 1


def test_the_plan_sizes_for_the_queue_the_slots_keep_when_workers_report_them() -> None:
    # 20/s of 1 s tasks, 20 running and 10 queued, one slot a worker sized at one; 22
    # replicas clear the 10 within a start-up, so no backlog is left to size for
    demand = Demand(10, 20, 20.0)
    told = size(demand, _est(1.0), replicas=22, target=1, s=S, slots=1)
    assert told.effective == carried(20.0, 1, 1), told.explain
    assert any(line.startswith("carried = 23 tasks") for line in told.explain), told.explain
    untold = size(demand, _est(1.0), replicas=22, target=1, s=S)
    assert untold.effective == 20
    assert "carried = load (no worker reported its slots)" in untold.explain
    # never above queued + in service: with nothing queued, 20 (the noise is the queue)
    assert size(Demand(0, 20, 20.0), _est(1.0), replicas=22, target=1, s=S,
                slots=1).effective == 20
    # the fewest slots of the live workers (a pool mid-rollout), gone ones aside
    views = (replace(worker("a"), slots=4), replace(worker("b", status=D), slots=2),
             replace(worker("c", status=WorkerStatus.GONE), slots=1), worker("d"))
    assert worker_slots(replace(pool(), workers=views)) == 2
    assert worker_slots(replace(pool(), workers=(worker("d"),))) is None
    assert worker_slots(replace(pool(), workers=None)) is None


def _starting(ready: int, *ages: float, startup: float | None = 30.0) -> Estimates:
    """Service 1 s; ``ready`` replicas ready and one starting for each of ``ages``."""
    return Estimates(service=1.0, service_at=NOW, startup=startup, ready=ready,
                     starting_since=tuple(NOW - a for a in sorted(ages, reverse=True)))


def test_a_backlog_with_no_replica_serving_yet_is_short() -> None:
    # one replica, just asked for: it serves none of the coming start-up
    got = size(Demand(10, 0, 5.0), _starting(0, 0.0), replicas=1, target=5, s=S, now=NOW)
    assert got.overdue == 10 and got.short
    assert "short of capacity: yes: no replica serves the backlog left before the next " \
           "start-up" in got.explain


def test_a_starting_replica_serves_only_the_part_of_the_start_up_it_is_ready_for() -> None:
    demand = Demand(600, 10, 10.0)
    # 2 ready x 5 / 1 s = 10/s, all taken by arrivals; 8 just asked for serve none of
    # the coming 30 s start-up: 600 left over the 60 s horizon = 10 more tasks
    just_asked = size(demand, _starting(2, *[0.0] * 8), replicas=10, target=5, s=S, now=NOW)
    assert just_asked.effective == 20 and just_asked.overdue == 600, just_asked.explain
    assert any("serving over the start-up" in line and "= 2 replicas" in line
               for line in just_asked.explain)
    # the same 8 nearly ready serve all of it: 40/s spare clears 1200 in 30 s
    nearly = size(demand, _starting(2, *[30.0] * 8), replicas=10, target=5, s=S, now=NOW)
    assert nearly.effective == 10 and nearly.overdue == 0, nearly.explain
    # not knowing which are ready (no infra seen yet), all count, as before
    assert size(demand, _est(1.0), replicas=10, target=5, s=S, now=NOW).effective == 10


def test_a_replica_starting_longer_than_the_estimate_lengthens_it() -> None:
    # 2 ready and 1 starting for 80 s where 30 s was assumed: the start-up is at least
    # 80 s, the starting one serves all of it: (3 x 5 - 10) x 80 = 400 of 600 cleared
    got = size(Demand(600, 10, 10.0), _starting(2, 80.0, startup=None), replicas=3,
               target=5, s=S, now=NOW)
    assert got.overdue == pytest.approx(200.0), got.explain
    assert any("been starting 80s" in line for line in got.explain)


def test_the_drain_horizon_is_never_shorter_than_one_service_time() -> None:
    s = replace(S, drain_horizon=5.0)
    est = Estimates(service=30.0, service_at=NOW, startup=30.0)
    # 10 x 3 / 30 s - 0.5/s = 0.5/s spare clears 15 of 60 queued: 45 left. Over 5 s
    # that would be 270 tasks in service; over one service time 45 (all of them start)
    got = size(Demand(60, 15, 0.5), est, replicas=10, target=3, s=s, now=NOW)
    assert got.overdue == pytest.approx(45.0) and got.effective == 15 + 45, got.explain
    # 0.2 s tasks: 8 x 3 / 0.2 s - 100/s = 20/s clears 600 of 645 in 30 s; the 45 left
    # drain within the 5 s horizon: 45 x 0.2 / 5 = 1.8 more in service
    short = Estimates(service=0.2, service_at=NOW, startup=30.0)
    got = size(Demand(645, 20, 100.0), short, replicas=8, target=3, s=s, now=NOW)
    assert got.overdue == pytest.approx(45.0) and got.effective == math.ceil(20 + 1.8)


def _infra(target: int, ready: int) -> Infra:
    inst = tuple(InstanceView(f"i-{k}", k < ready) for k in range(target))
    return Infra(target, inst, (), NOW)


def test_an_overdue_backlog_is_sized_by_the_old_rule_until_a_start_up_is_seen() -> None:
    demand = Demand(60, 4, 10.0)  # 1 s tasks; 1 ready replica x 5 / 1 s = 5/s < 10/s
    unseen = _starting(1, 10.0, startup=None)  # one replica asked 10 s ago, none ready yet
    got = size(demand, unseen, replicas=2, target=5, s=S, now=NOW)
    assert got.overdue > 0 and got.effective == 60 + 4, got.explain
    assert any("no start-up seen yet" in line for line in got.explain)
    # once a replica has turned ready (or a start-up was measured), the model sizes it
    seen = replace(unseen, turned_ready=True)
    model = size(demand, seen, replicas=2, target=5, s=S, now=NOW)
    assert model.overdue == got.overdue and model.effective < 60 + 4, model.explain
    measured = size(demand, replace(unseen, startup=30.0), replicas=2, target=5, s=S,
                    now=NOW)
    assert measured.effective == model.effective
    # nothing starting (the pool has not grown yet): nothing for the start-up to miscount
    still = size(demand, _starting(2, startup=None), replicas=2, target=5, s=S, now=NOW)
    assert still.overdue > 0 and still.effective < 60 + 4, still.explain


def test_a_replica_turning_ready_shows_the_start_up_was_seen() -> None:
    e = Estimates().observe(None, _infra(1, 1), NOW, S)
    assert not e.turned_ready
    slow = e.observe(None, _infra(3, 1), NOW + 10, S)  # two asked for, seen starting
    assert not slow.turned_ready and slow.startup is None
    slow = slow.observe(None, _infra(3, 3), NOW + 40, S)
    assert slow.turned_ready and slow.startup == 30.0
    # two asked for and both ready at the next read (never seen starting): each
    # started within the 10 s between the reads, and that is what is measured rather
    # than the 30 s default
    fast = e.observe(None, _infra(3, 3), NOW + 10, S)
    assert fast.turned_ready and fast.startup == 10.0
    assert size(Demand(0, 1, 1.0), replace(fast, service=1.0), replicas=3, target=5, s=S,
                now=NOW + 10).explain[1].endswith("start-up 10s (measured)")
    # one seen starting and one never seen: each timed by what was seen of it
    mixed = e.observe(None, _infra(2, 1), NOW + 10, S)
    mixed = mixed.observe(None, _infra(2, 1), NOW + 20, S)
    mixed = mixed.observe(None, _infra(3, 3), NOW + 30, S)  # 20 s, then at most 10 s
    assert mixed.startup == pytest.approx(20.0 + 0.3 * (10.0 - 20.0))
    # without an earlier read of the orchestrator there is nothing to time them by
    assert Estimates(ready=1).observe(None, _infra(3, 3), NOW, S).startup is None
    # a wall clock stepped back between the reads times a start-up as 0 s, never less:
    # the estimate is published, and a negative one would be refused
    back = e.observe(None, _infra(3, 1), NOW + 10, S).observe(None, _infra(3, 3), NOW - 50, S)
    assert back.startup == 0.0
    never_seen = e.observe(None, _infra(3, 3), NOW - 50, S)
    assert never_seen.startup == 0.0


def test_a_replica_starting_before_this_leadership_is_no_sample_of_the_start_up() -> None:
    """A new leader's first read finds two replicas starting, since it does not know
    when: their turning ready would time the start-up from the handover, too short.
    The replicas it saw asked for are timed as ever."""
    first = Estimates(startup=80.0, startup_remembered=True).observe(
        None, _infra(3, 1), NOW, S)
    assert first.unseen == 2 and first.starting_since == (NOW, NOW)
    one = first.observe(None, _infra(4, 2), NOW + 10, S)  # one more asked; one ready
    assert one.startup == 80.0 and one.startup_remembered and one.unseen == 1
    assert one.turned_ready  # a replica did turn ready
    both = one.observe(None, _infra(4, 3), NOW + 20, S)
    assert both.startup == 80.0 and both.unseen == 0
    timed = both.observe(None, _infra(4, 4), NOW + 60, S)  # seen asked at NOW + 10
    assert timed.startup == pytest.approx(80.0 + 0.3 * (50.0 - 80.0))
    assert not timed.startup_remembered
    # replicas removed while starting: the newest go first, then the unseen ones
    fewer = first.observe(None, _infra(2, 1), NOW + 10, S)
    assert fewer.unseen == 1 and len(fewer.starting_since) == 1


def test_a_remembered_start_up_is_used_until_this_leader_measures_one() -> None:
    # a new leadership starts each pool it has no history for from the start-up the
    # previous one published; a pool it already tracks keeps its own
    own = PoolHistory(estimates=_est(1.0, startup=12.0))
    got = remembered({"q": own}, {"p": 80.0, "q": 50.0})
    assert got["q"] is own
    est = got["p"].estimates
    assert est.startup == 80.0 and est.startup_remembered and got["p"].samples == ()
    # sized on it, and said so; the rule for a start-up not seen yet does not apply:
    # the start-up is known (an overdue backlog with a replica starting)
    demand = Demand(60, 4, 10.0)
    warm = replace(est, service=1.0, service_at=NOW, ready=1, starting_since=(NOW - 10,))
    sized = size(demand, warm, replicas=2, target=5, s=S, now=NOW)
    assert sized.explain[1].endswith("start-up 80s (remembered from the previous "
                                     "leadership)"), sized.explain
    assert sized.overdue > 0 and sized.effective < 60 + 4, sized.explain
    assert not any("no start-up seen yet" in line for line in sized.explain)
    # the first start-up this leader measures moves it as any sample does, and from
    # then on it is measured
    e = warm.observe(None, _infra(2, 1), NOW, S)
    assert e.startup_remembered
    e = e.observe(None, _infra(2, 2), NOW + 30, S)  # seen starting at NOW - 10: 40 s
    assert e.startup == pytest.approx(80.0 + 0.3 * (40.0 - 80.0))
    assert not e.startup_remembered


def test_estimates_time_a_replica_from_not_ready_to_ready() -> None:
    infra = _infra

    e = Estimates().observe(None, infra(2, 2), NOW, S)
    e = e.observe(None, infra(4, 2), NOW + 10, S)  # two asked for
    assert e.starting_since == (NOW + 10, NOW + 10)
    e = e.observe(None, infra(4, 3), NOW + 50, S)
    assert e.startup == 40.0 and e.starting_since == (NOW + 10,)
    e = e.observe(Demand(0, 0, 1.0, 2.0), infra(4, 4), NOW + 60, S)
    assert e.startup == pytest.approx(40 + 0.3 * (50 - 40)) and e.service == 2.0


@pytest.mark.parametrize(
    ("current", "periods", "growth", "limit"),
    [
        (2, 1.0, (4, 100), 6),  # max(4, 100 % of 2): a whole period's worth
        (20, 1.0, (4, 100), 40),  # max(4, 100 % of 20)
        (20, 2 / 3, (4, 100), 31),  # 20 x 2^(2/3) = 31.7, rounded down
        (1, 2 / 3, (4, 100), 3),  # 1 + 4 x 2/3 = 3.7
        (20, 1.0, (1, 0), 21),
        (20, 0.5, (1, 0), 20),  # half a replica's worth: none yet
        (0, 1.0, (4, 100), 4),
        (20, 0.0, (4, 100), 20),
    ],
)
def test_growth_limit(current: int, periods: float, growth: tuple[int, int], limit: int
                      ) -> None:
    s = spec(growth_replicas=growth[0], growth_percent=growth[1])
    assert growth_limit(s, current, periods) == limit


@pytest.mark.parametrize(
    ("before", "after", "spent"),
    [
        (8, 16, 1.0),  # a doubling: one period
        (16, 64, 2.0),  # two doublings, whatever the ticks between
        (1, 5, 1.0),  # four more: one period of the replicas' policy (the percent: 2.3)
        (2, 3, 0.25),  # the replicas' policy: a quarter; the percent's 0.58
        (10, 10, 0.0),
        (10, 4, 0.0),
        (0, 4, 1.0),
    ],
)
def test_periods_spent_inverts_the_limit(before: int, after: int, spent: float) -> None:
    s = spec(growth_replicas=4, growth_percent=100)
    assert periods_spent(s, before, after) == pytest.approx(spent)


def test_the_allowance_refills_at_the_rate_and_never_past_one_period() -> None:
    s = spec(growth_replicas=4, growth_percent=100)
    a = Allowance(NOW, 8)
    assert a.limit(s) == 16
    a = a.read(s, NOW + 10, 16, 15.0)  # the doubling asked at NOW spent it all
    assert a.left == pytest.approx(10 / 15) and a.limit(s) == 25  # 16 x 2^(2/3)
    a = a.read(s, NOW + 20, 25, 15.0)
    assert a.left == pytest.approx(10 / 15 - math.log2(25 / 16) + 10 / 15)
    idle = Allowance(NOW, 8, 0.0).read(s, NOW + 600, 8, 15.0)
    assert idle.left == 1.0 and idle.limit(s) == 16
    shrunk = Allowance(NOW, 8, 0.2).read(s, NOW + 3, 4, 15.0)  # shrinking spends none
    assert shrunk.left == pytest.approx(0.4)


def test_a_pool_grows_at_the_rate_whatever_the_tick() -> None:
    """Four ticks a period or one every 10 s: a pool that keeps growing doubles about
    every 15 s (floors aside), never faster; a tick longer than the period doubles it
    once a tick. A window over the last 15 s let a 10 s tick double the pool only every
    20 s."""
    s = spec(growth_replicas=4, growth_percent=100)
    for tick in (3.75, 10.0, 15.0, 20.0):
        a, asked = Allowance(NOW, 64), 0.0
        while True:
            n = a.limit(s)  # asked at each tick, the first one a whole period's worth
            if asked + tick > 60:
                break
            asked += tick
            a = a.read(s, NOW + asked, n, 15.0)
        rate = 1 + asked / max(tick, 15)  # a read refills one period's worth at most
        assert rate - 0.1 <= math.log2(n / 64) <= rate + 1e-9, (tick, n)


def test_a_burst_grows_the_pool_within_the_bound() -> None:
    s = spec(growth_replicas=4, growth_percent=100, max_replicas=1000, target_per_replica=1)
    p = run(snap(pool(s, queued=500, replicas=2)), {"p": held(500)}).pool("p")
    assert p.desired_replicas == 6 and p.steps == (ScaleUp("p", 6),)
    assert "growth bound" in p.reason
    # ten seconds later two thirds of a period's worth has come back: 6 x 2^(2/3)
    p2 = run(snap(pool(s, queued=500, replicas=6), read_at=NOW + 10),
             {"p": p.history}, now=NOW + 10).pool("p")
    assert p2.desired_replicas == 9 and "0.67 of a period's worth unspent" in p2.reason


def test_min_replicas_is_not_bounded() -> None:
    s = spec(growth_replicas=1, growth_percent=0, min_replicas=8)
    p = run(snap(pool(s, replicas=2))).pool("p")
    assert p.desired_replicas == 8


def _idle(n: int, **kw: object) -> object:
    return pool(spec(**kw), workers=[worker(f"w{i}") for i in range(n)], replicas=n)


def test_scale_down_drains_up_to_the_budget_at_once() -> None:
    p = run(snap(_idle(10, disruption_replicas=3)), {"p": held(0)}).pool("p")  # type: ignore[arg-type]
    assert p.desired_replicas == 0
    assert [x.worker_id for x in p.steps if isinstance(x, MarkDraining)] == ["w0", "w1", "w2"]
    assert "disruption budget" in p.reason
    # the budget is per period: the next tick drains none while those three finish
    ws = [worker(f"w{i}", status=D, running=1, draining_since=NOW) if i < 3
          else worker(f"w{i}") for i in range(10)]
    nxt = run(snap(pool(spec(disruption_replicas=3), workers=ws, replicas=10),
                   read_at=NOW + 10), {"p": p.history}, now=NOW + 10).pool("p")
    assert not [x for x in nxt.steps if isinstance(x, MarkDraining)]
    assert "budget spent" in nxt.reason
    # with none in flight, one drains even on a spent budget (the seed rule's pace)
    ws = [w for w in ws if w.status is not D]
    last = run(snap(pool(spec(disruption_replicas=3), workers=ws, replicas=7),
                    read_at=NOW + 20), {"p": nxt.history}, now=NOW + 20).pool("p")
    assert [x.worker_id for x in last.steps if isinstance(x, MarkDraining)] == ["w3"]


def test_disruption_budget_is_the_larger_of_count_and_percent() -> None:
    assert disruption_budget(spec(disruption_replicas=2, disruption_percent=20), 100) == 20
    assert disruption_budget(spec(disruption_replicas=2, disruption_percent=20), 5) == 2


def test_drained_workers_leave_in_one_removal() -> None:
    ws = [worker("a"), worker("b", status=D, draining_since=NOW - 20),
          worker("c", status=D, draining_since=NOW - 20),
          worker("d", status=D, running=1, draining_since=NOW - 20)]
    p = run(snap(pool(spec(disruption_replicas=3), workers=ws, replicas=4)),
            {"p": held(0)}).pool("p")
    removes = [x for x in p.steps if isinstance(x, RemoveReplica)]
    assert removes == [RemoveReplica("p", "b", "i-b", 2, also=(("c", "i-c"),))]
    assert "draining d" in p.reason


def test_a_batch_waits_for_a_settled_pool() -> None:
    ws = [worker("a"), worker("b", status=D, draining_since=NOW - 20),
          worker("c", status=D, draining_since=NOW - 20)]
    p = run(snap(pool(spec(disruption_replicas=3), workers=ws, replicas=3, unready=["i-a"])),
            {"p": held(0)}).pool("p")
    assert not [x for x in p.steps if isinstance(x, RemoveReplica)]


def test_demand_returning_part_way_keeps_only_the_drains_still_needed() -> None:
    ws = [worker("a", running=5), worker("b", status=D, running=1, draining_since=NOW - 20),
          worker("c", status=D, draining_since=NOW - 20)]
    # 3 replicas, demand for 2: one drain is still needed, the drained one is kept
    p = run(snap(pool(spec(disruption_replicas=3), running=6, workers=ws, replicas=3)),
            {"p": held(6)}).pool("p")
    assert Reactivate("p", "b", "demand_returned") in p.steps
    assert RemoveReplica("p", "c", "i-c", 2) in p.steps


def test_a_committed_batch_is_finished_with_its_count() -> None:
    ws = [worker("a"), worker("b", status=D, draining_since=NOW - 20, removal=1),
          worker("c", status=D, draining_since=NOW - 20, removal=1)]
    p = run(snap(pool(workers=ws, replicas=3)), {"p": held(0)}).pool("p")
    assert p.steps == (RemoveReplica("p", "b", "i-b", 1, also=(("c", "i-c"),)),)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"growth_replicas": 0}, "growth_replicas must be >= 1"),
        ({"growth_percent": -1}, "growth_percent must be >= 0"),
        ({"disruption_replicas": 0}, "disruption_replicas must be >= 1"),
        ({"disruption_replicas": -2}, "disruption_replicas must be >= 1"),
        ({"disruption_percent": 101}, "disruption_percent must be within 0..100"),
        ({"scale_down_window": -1}, "scale_down_window must be whole seconds within 0..3600"),
        ({"scale_down_window": 3601}, "scale_down_window must be whole seconds within 0..3600"),
        ({"scale_down_window": 299.5}, "scale_down_window must be whole seconds"),
        ({"scale_down_window": True}, "scale_down_window must be whole seconds"),
    ],
)
def test_bad_bounds_are_named(change: dict[str, int], words: str) -> None:
    problems = pool_spec_problems(replace(spec(), **change))  # type: ignore[arg-type]
    assert len(problems) == 1 and words in problems[0]


def test_history_keeps_what_the_bounds_need() -> None:
    h = run(snap(pool()), {"p": PoolHistory()}, settings=SETTINGS).history["p"]
    assert h.allowance == Allowance(NOW, 2) and h.estimates.ready == 2


def test_a_pool_that_grows_again_soon_after_shrinking_holds_longer() -> None:
    s = spec(disruption_replicas=5)
    settings = replace(SETTINGS, flap_window=300.0)
    idle = run(snap(_idle(4, disruption_replicas=5)), {"p": held(0)},  # type: ignore[arg-type]
               settings=settings).pool("p")
    assert [x for x in idle.steps if isinstance(x, MarkDraining)]
    assert idle.history.shrunk_at == NOW
    # 60 s later demand is back: the pool grows, and is now flapping
    back = run(snap(pool(s, queued=50, replicas=1, infra_at=NOW + 60), read_at=NOW + 60,
                    health=db(at=NOW + 60)),
               {"p": replace(held(50, seconds=40), shrunk_at=NOW)}, settings=settings,
               now=NOW + 60).pool("p")
    assert any(isinstance(x, ScaleUp) for x in back.steps)
    assert back.history.flap_until == NOW + 60 + 300
    # demand gone again: a flapping pool waits the flap window, not the 60 s one
    later = NOW + 200
    h = replace(back.history, samples=tuple((later - 10 * k, 0) for k in range(12, 0, -1)))
    calm = run(snap(pool(s, replicas=10, infra_at=later), read_at=later, health=db(at=later)),
               {"p": h}, settings=settings,
               now=later).pool("p")
    assert calm.desired_replicas == 10 and "300s" in calm.reason


def test_a_pool_that_keeps_up_when_it_grows_again_is_not_flapping() -> None:
    s = spec(disruption_replicas=5)
    settings = replace(SETTINGS, flap_window=300.0)
    est = Estimates(service=1.0, service_at=NOW)
    hist = replace(held(50, seconds=40), shrunk_at=NOW - 60, estimates=est)

    def back(queued: int) -> PoolHistory:
        inputs = replace(pool(s, replicas=1), demand=Demand(queued, 50, 50.0, 1.0))
        got = run(snap(inputs), {"p": hist}, settings=settings).pool("p")
        assert any(isinstance(x, ScaleUp) for x in got.steps)
        return got.history

    # a rise the windows follow (nothing queued): the scale-down was right
    assert back(0).flap_until is None
    # a queue the one replica cannot clear before a new one starts: the shrink left it
    # short, and it flaps
    assert back(50).flap_until == NOW + 300


def test_a_queue_that_clears_within_the_wait_aimed_at_is_not_a_flap() -> None:
    s = spec(disruption_replicas=5, max_replicas=100, target_per_replica=3)
    settings = replace(SETTINGS, flap_window=300.0, drain_horizon=5.0)
    est = Estimates(service=2.0, service_at=NOW, startup=20.0)
    hist = replace(held(36, seconds=40), shrunk_at=NOW - 60, estimates=est)

    def back(queued: int) -> tuple[PoolHistory, tuple[str, ...]]:
        # 12 replicas at a target of 3 serve 18 tasks/s of 2 s, and 18/s arrive: nothing
        # is spare, so the whole queue is left past the start-up
        inputs = replace(pool(s, replicas=12), demand=Demand(queued, 44, 18.0, 2.0))
        got = run(snap(inputs), {"p": hist}, settings=settings).pool("p")
        assert any(isinstance(x, ScaleUp) for x in got.steps), got.reason
        return got.history, got.sizing

    # 7 left clear at 18 tasks/s in 7 x 2 / 36 = 0.39 s, within the 5 s aimed at: the
    # arrivals' noise, and the pool grows by its ordinary rule without a flap hold
    calm, lines = back(7)
    assert calm.flap_until is None
    assert any(x.startswith("short of capacity: no") and "0.389s" in x for x in lines)
    # 200 left take 11 s: the shrink left it unable to serve, a flap
    flap, lines = back(200)
    assert flap.flap_until == NOW + 300
    assert any(x.startswith("short of capacity: yes") and "11.1s" in x for x in lines)


def test_a_pool_short_after_growing_past_its_last_shrink_is_not_flapping() -> None:
    s = spec(disruption_replicas=5)
    settings = replace(SETTINGS, flap_window=300.0)
    est = Estimates(service=1.0, service_at=NOW)

    def back(replicas: int, shrunk_from: int) -> PoolHistory:
        hist = replace(held(50, seconds=40), shrunk_at=NOW - 200, shrunk_from=shrunk_from,
                       estimates=est)
        inputs = replace(pool(s, replicas=replicas),
                         demand=Demand(500, 4 * replicas, 200.0, 1.0))
        got = run(snap(inputs), {"p": hist}, settings=settings).pool("p")
        assert any(isinstance(x, ScaleUp) for x in got.steps)
        return got.history

    # short at or below the size it shrank from: the shrink left it short, a flap
    assert back(3, shrunk_from=3).flap_until == NOW + 300
    # short only after growing past it (a ramp outran the start-up): demand rose since
    # the shrink, which was right, and the pool is not held at its peak for 300 s
    assert back(4, shrunk_from=3).flap_until is None


def test_a_scale_down_records_the_size_it_shrank_from() -> None:
    idle = run(snap(_idle(4, disruption_replicas=5)), {"p": held(0)},  # type: ignore[arg-type]
               settings=SETTINGS).pool("p")
    assert [x for x in idle.steps if isinstance(x, MarkDraining)]
    assert idle.history.shrunk_at == NOW and idle.history.shrunk_from == 4


def test_in_service_weighs_the_running_count_against_the_rate_by_their_noise() -> None:
    s = replace(S, rate_window=30.0, headroom_sigmas=2.0)
    # short tasks: the rate's figure is the steadier one
    busy, agree = in_service(36, 32.0, 2.0, s)
    assert agree and busy == pytest.approx((2 * 36 + 30 * 32) / 32)
    # tasks as long as the rate window: half and half
    busy, agree = in_service(320, 300.0, 30.0, s)
    assert agree and busy == pytest.approx(310.0)
    # far beyond the noise (a rise the rate window lags): the running count
    assert in_service(60, 32.0, 2.0, s) == (60.0, False)
    assert in_service(10, 32.0, 2.0, s) == (10.0, False)


def test_an_idle_pool_scales_from_zero_without_the_window() -> None:
    p = run(snap(pool(spec(growth_replicas=4), queued=30, replicas=0, workers=[])),
            {"p": held(0)}).pool("p")
    assert p.desired_replicas == 4  # 6 wanted, the growth bound allows 4 from zero
    assert "scale from zero" in p.reason and p.steps == (ScaleUp("p", 4),)


def test_an_orchestrator_that_removes_one_at_a_time_gets_batches_of_one() -> None:
    ws = [worker("a"), worker("b", status=D, draining_since=NOW - 20),
          worker("c", status=D, draining_since=NOW - 20)]
    inputs = pool(spec(disruption_replicas=3), workers=ws, replicas=3)
    assert inputs.infra is not None
    inputs = replace(inputs, infra=replace(inputs.infra, removal_batch=1))
    p = run(snap(inputs), {"p": held(0)}).pool("p")
    assert [x for x in p.steps if isinstance(x, RemoveReplica)] == [
        RemoveReplica("p", "b", "i-b", 2)]


def _rates(*values: float, step: float = 10.0) -> tuple[tuple[float, float], ...]:
    return tuple((NOW - step * (len(values) - i), v) for i, v in enumerate(values))


def test_headroom_holds_room_for_bursts_beyond_poisson_noise() -> None:
    s = replace(S, rate_window=30.0, headroom_sigmas=2.0)
    # 1/s with a 4/s burst read now and then: the variance is far beyond Poisson's
    bursty = replace(_est(1.0), rates=_rates(*[1.0] * 9, 4.0, *[1.0] * 9, 4.0))
    peak = bursty.peak_rate(s)
    assert peak is not None and peak.mean == pytest.approx(1.3)
    assert 1.3 < peak.rate <= peak.highest == 4.0
    got = size(Demand(0, 1, 1.0), bursty, replicas=1, target=1, s=s)
    assert got.effective == 1 and got.reserve == math.ceil(peak.rate)
    assert any("headroom" in line for line in got.explain)
    # Poisson-like reads (variance about mean / window) hold no headroom beyond the mean
    calm = replace(_est(1.0), rates=_rates(*[10.0, 10.5, 9.6, 10.2, 9.8] * 4))
    calm_peak = calm.peak_rate(s)
    assert calm_peak is not None and calm_peak.rate == pytest.approx(calm_peak.mean)
    # never above the highest rate read: a step's own variance does not overshoot it
    step = replace(_est(1.0), rates=_rates(*[1.0] * 10, *[10.0] * 10))
    step_peak = step.peak_rate(s)
    assert step_peak is not None and step_peak.rate == 10.0
    assert replace(_est(1.0), rates=_rates(1.0, 4.0)).peak_rate(
        replace(s, headroom_sigmas=0)) is None


def test_one_extreme_burst_neither_hides_the_recurring_ones_nor_sets_their_room() -> None:
    s = replace(S, rate_window=30.0, headroom_sigmas=2.0)
    # bursts to 4/s come back, one of them to 40/s: against the sd of every read (the
    # 40 in it) the 4s sit below mean + 2 sd; left out of the line, the 40 does not
    reads = (*[1.0] * 9, 4.0, *[1.0] * 9, 40.0, *[1.0] * 9, 4.0, 1.0)
    xs = list(reads)
    assert max(x for x in xs if x < 40) < statistics.mean(xs) + 2 * statistics.stdev(xs)
    peak = replace(_est(1.0), rates=_rates(*reads)).peak_rate(s)
    assert peak is not None and peak.recurs and peak.highest == 40.0
    # the room is no more than the bursts reached twice, and /status says so
    assert peak.rate == 4.0
    est = replace(_est(1.0), rates=_rates(*reads))
    got = size(Demand(0, 1, 1.0), est, replicas=1, target=1, s=s)
    assert any("second-highest burst 4/s; bursts recur" in line for line in got.explain)
    # one burst alone, however high, does not recur
    once = replace(_est(1.0), rates=_rates(*[1.0] * 19, 40.0, 1.0)).peak_rate(s)
    assert once is not None and not once.recurs


def test_a_burst_is_read_at_one_service_time_not_at_the_rate_window() -> None:
    s = replace(S, rate_window=30.0, peak_grain=5.0)
    # 10 s at 100/s in 30 s at 10/s otherwise: the average reads 40/s, the busiest 5 s
    # 100/s; tasks of 0.2 s are in service at the burst's own rate
    assert burst_rate(40.0, 100.0, 0.2, s) == 100.0
    # 10 s tasks: the busiest 5 s are in service for 10 s, so half of it
    assert burst_rate(40.0, 100.0, 10.0, s) == 50.0
    # tasks as long as the window read its average, as before; so does a missing peak
    assert burst_rate(40.0, 100.0, 30.0, s) == burst_rate(40.0, 100.0, 300.0, s) == 40.0
    assert burst_rate(10.0, None, 0.2, s) == 10.0
    # the reads the plan keeps are burst rates, and /status shows the busiest 5 s
    est = _est(0.2).observe(Demand(0, 1, 40.0, 0.2, 100.0), None, NOW, s)
    assert est.rates[-1][1] == 100.0
    got = size(Demand(0, 1, 40.0, 0.2, 100.0), est, replicas=1, target=3, s=s)
    assert any("busiest 5s: 100/s" in line for line in got.explain)
    with pytest.raises(ValueError, match="peak_grain"):
        replace(S, peak_grain=60.0).validate()


def test_headroom_stops_a_scale_down_of_recurring_demand_but_never_starts_a_scale_up(
) -> None:
    # tasks as long as the wait aimed at (shorter ones keep room for a jump: below)
    s = replace(SETTINGS, headroom_sigmas=2.0, scale_down_window=30.0, flap_window=30.0,
                drain_horizon=1.0)
    est = replace(Estimates(service=1.0, service_at=NOW), rates=_rates(*[1.0] * 9, 12.0))
    hist = replace(held(1), estimates=est, flap_until=NOW + 100)  # demand recurs
    inputs = pool(spec(target_per_replica=1), running=1, replicas=4)
    inputs = replace(inputs, demand=Demand(0, 1, 1.0, 1.0))
    p = run(snap(inputs), {"p": hist}, settings=s).pool("p")
    assert p.desired_replicas == 4 and "headroom" in p.reason
    assert not [x for x in p.steps if isinstance(x, MarkDraining)]
    # the same reads after a step down (no recurrence): no room held
    once = run(snap(inputs), {"p": replace(hist, flap_until=None)}, settings=s).pool("p")
    assert once.desired_replicas is not None and once.desired_replicas < 4
    # a burst seen twice, apart, recurs: room is held without the flap guard
    twice = replace(est, rates=_rates(*[1.0] * 9, 12.0, *[1.0] * 9, 12.0, 1.0))
    held_twice = run(snap(inputs), {"p": replace(hist, flap_until=None, estimates=twice)},
                     settings=s).pool("p")
    assert held_twice.desired_replicas == 4 and "headroom" in held_twice.reason
    small = replace(inputs, infra=replace(inputs.infra, target_replicas=1,  # type: ignore[arg-type]
                                          instances=inputs.infra.instances[:1]))  # type: ignore[union-attr]
    grown = run(snap(small), {"p": hist}, settings=s).pool("p")
    assert grown.desired_replicas == 1  # room is kept, never asked for


def test_backlog_the_pool_cannot_clear_in_time_skips_the_scale_up_window() -> None:
    s = replace(SETTINGS, scale_up_window=30.0, startup_default=30.0)
    est = Estimates(service=1.0, service_at=NOW)
    inputs = replace(pool(spec(target_per_replica=5), replicas=2),
                     demand=Demand(600, 10, 10.0, 1.0))
    # no history over the window: the seed rule would wait 30 s
    p = run(snap(inputs), {"p": PoolHistory(estimates=est)}, settings=s).pool("p")
    assert p.desired_replicas is not None and p.desired_replicas > 2
    # a backlog the pool clears before a new replica could start waits the window
    easy = replace(pool(spec(target_per_replica=5), replicas=10),
                   demand=Demand(100, 10, 10.0, 1.0))
    q = run(snap(easy), {"p": PoolHistory(estimates=est)}, settings=s).pool("p")
    assert q.desired_replicas == 10


def test_the_room_is_not_shrunk_by_a_fall_of_the_service_time_within_its_noise() -> None:
    s = replace(S, rate_window=30.0, headroom_sigmas=2.0, service_smoothing=0.0)
    est = _est(30.0).observe(Demand(0, 30, 1.0, 30.0), None, NOW, s)
    assert est.room_service == 30.0
    # 1/s over 30 s: about 30 completions, a standard error of 30 / sqrt(30) = 5.5 s.
    # 26.9 s is within 2 of them: the room keeps 30 s while the load reads 26.9 s
    fell = est.observe(Demand(0, 27, 1.0, 26.9), None, NOW + 10, s)
    assert fell.service == pytest.approx(26.9) and fell.room_service == 30.0
    # a fall beyond the noise is shorter tasks: the room follows
    assert fell.observe(Demand(0, 15, 1.0, 15.0), None, NOW + 20, s).room_service == 15.0
    # with 100 completions a second the same fall is no noise
    many = _est(30.0).observe(Demand(0, 3000, 100.0, 30.0), None, NOW, s)
    assert many.observe(Demand(0, 2700, 100.0, 26.9), None, NOW + 10, s).room_service == 26.9
    # a rise is followed at once
    assert fell.observe(Demand(0, 33, 1.0, 33.0), None, NOW + 20, s).room_service == 33.0
    # the headroom is sized on it: 3/s of bursts x 30 s, not x 26.9 s
    hist = replace(fell, rates=_rates(*[1.0] * 9, 3.0, *[1.0] * 9, 3.0, 1.0))
    got = size(Demand(0, 27, 1.0, 26.9), hist, replicas=10, target=3, s=s)
    peak = hist.peak_rate(s)
    assert peak is not None and got.recurs
    assert got.reserve == math.ceil(peak.rate * 30.0 - 1e-9) > math.ceil(peak.rate * 26.9)
    assert any("30s (its fall to 26.9s is within 2 standard errors)" in line
               for line in got.explain)


RECURRING = (*[1.0] * 9, 12.0, *[1.0] * 9, 12.0, 1.0)
ONCE = (*[1.0] * 19, 12.0, 1.0)


def test_a_small_pool_of_short_tasks_holds_bursts_that_recurred_one_window_more() -> None:
    # a start-up within the wait aimed at, read continuously: no room for a jump
    # (`jump_share`), only the headroom's
    s = replace(S, rate_window=30.0, headroom_sigmas=2.0, drain_horizon=5.0,
                small_pool_replicas=5, startup_default=5.0, interval=0.0)
    # the reads show bursts that recur: observe() records when, and their ceiling
    est = replace(_est(1.0), rates=_rates(*RECURRING)).observe(
        Demand(0, 1, 1.0), None, NOW + 1, s)
    peak = est.peak_rate(s)
    assert peak is not None and peak.recurs and peak.ceiling == 12.0
    assert est.recurred == (NOW + 1, 12.0)
    # later the window holds one of the bursts: no recurrence of its own
    once = replace(_est(1.0), rates=_rates(*ONCE))
    own = size(Demand(0, 1, 1.0), once, replicas=2, target=1, s=s, now=NOW)
    assert not own.recurs and own.reserve >= 6
    # /status says the headroom is not held then (the plan holds it only while the
    # pool flaps); the room for a jump is, and with 5 s start-ups it is none
    assert own.jump == 0 and not own.grows
    assert any(line == f"scale down no lower than the jump's room: 0 tasks (the "
                       f"headroom's {own.reserve} only while the pool flaps: bursts do "
                       f"not recur)" for line in own.explain), own.explain
    # bursts recurred 100 s ago: a pool of 2 replicas of 1 s tasks (shorter than the
    # 5 s wait aimed at) holds them as if they recur, no higher than the ceiling then
    then = replace(once, recurred=(NOW - 100.0, 3.0))
    got = size(Demand(0, 1, 1.0), then, replicas=2, target=1, s=s, now=NOW)
    assert got.recurs and got.reserve == 3 and got.grows
    assert any("but they did 100s ago" in line for line in got.explain)
    assert any(line.startswith("scale down no lower than the room: max(headroom, jump) = 3 "
                               "tasks; a pool") for line in got.explain)
    # not beyond the headroom window, not for a pool of small_pool_replicas or more,
    # not for tasks as long as the wait aimed at, not without a clock to tell
    late = replace(once, recurred=(NOW - s.headroom_window - 1.0, 3.0))
    assert not size(Demand(0, 1, 1.0), late, replicas=2, target=1, s=s, now=NOW).recurs
    assert not size(Demand(0, 1, 1.0), then, replicas=5, target=1, s=s, now=NOW).recurs
    long = replace(then, service=5.0)
    assert not size(Demand(0, 5, 1.0), long, replicas=2, target=1, s=s, now=NOW).recurs
    assert not size(Demand(0, 1, 1.0), then, replicas=2, target=1, s=s).recurs


def test_the_share_of_a_jump_served_already_keeps_its_wait_within_the_aim() -> None:
    s = replace(S, drain_horizon=5.0, interval=10.0)
    # a jump to L finds (1 - 5 / (I + T)) x L served: (L - C) x (I + T) queue until the
    # next read (up to the interval I) and a start-up T, cleared by the grown pool (at
    # least L) in 5 s
    assert jump_share(10.0, s) == 0.75
    assert jump_share(90.0, s) == pytest.approx(1 - 5 / 100)
    # the interval counts alone: a start-up within the wait aimed at still waits for
    # the next read
    assert jump_share(0.0, s) == 0.5
    # read continuously, start-ups within the wait aimed at need no room: new replicas
    # serve in time
    now = replace(s, interval=0.0)
    assert jump_share(10.0, now) == 0.5
    assert jump_share(5.0, now) == jump_share(2.0, now) == jump_share(0.0, now) == 0.0


def test_tasks_shorter_than_the_wait_aimed_at_keep_room_for_a_jump_back() -> None:
    s = replace(S, rate_window=30.0, headroom_sigmas=2.0, drain_horizon=5.0,
                flap_window=300.0, headroom_window=600.0)
    # 0.2 s tasks at 10/s, one burst to 100/s read 20 s ago; 90 s start-ups
    est = replace(_est(0.2, startup=90.0), rates=_rates(*[10.0] * 19, 100.0, 10.0))
    got = size(Demand(0, 2, 10.0), est, replicas=7, target=3, s=s, now=NOW)
    jump = math.ceil((1 - 5 / 90) * 100.0 * 0.2)
    assert jump == 19 and got.jump == jump, got.explain
    # the burst came once: the headroom's room (11 tasks) is not held, the jump's is
    assert not got.recurs and not got.grows and got.reserve == 11
    assert any(line.startswith("scale down no lower than the jump's room: 19 tasks")
               for line in got.explain)
    assert any(line.startswith("room for a jump (tasks shorter than the 5s wait aimed at): "
                               "the busiest burst rate read over 300s, 100/s")
               for line in got.explain), got.explain
    # the burst read more than the flap window ago: the jump is to the rate since
    old = replace(est, rates=_rates(*[10.0] * 19, 100.0, *[10.0] * 31))
    late = size(Demand(0, 2, 10.0), old, replicas=7, target=3, s=s, now=NOW)
    assert late.jump == math.ceil((1 - 5 / 90) * 10.0 * 0.2)
    # a flap window longer than the headroom's reaches back no further than the reads
    # kept (the headroom window): that burst, 320 s ago, is beyond 300 s of them
    kept = size(Demand(0, 2, 10.0), old, replicas=7, target=3, now=NOW,
                s=replace(s, flap_window=900.0, headroom_window=300.0))
    assert kept.jump == late.jump
    assert any("the busiest burst rate read over 300s, 10/s" in line
               for line in kept.explain), kept.explain
    # tasks as long as the wait aimed at keep the headroom's rules alone
    long = size(Demand(0, 2, 10.0), est, replicas=7, target=3,
                s=replace(s, drain_horizon=0.2), now=NOW)
    assert long.jump == 0 and not any("room for a jump" in line for line in long.explain)
    assert any(line.startswith("no room held for bursts that do not recur")
               for line in long.explain)


def test_the_room_for_a_jump_holds_a_pool_of_short_tasks_at_its_size() -> None:
    s = replace(SETTINGS, headroom_sigmas=2.0, scale_down_window=30.0, drain_horizon=5.0)
    est = replace(Estimates(service=0.2, service_at=NOW, startup=90.0),
                  rates=_rates(*[10.0] * 19, 100.0, 10.0))
    inputs = replace(pool(spec(target_per_replica=3), running=2, replicas=7),
                     demand=Demand(0, 2, 10.0, 0.2))
    p = run(snap(inputs), {"p": replace(held(1), estimates=est)}, settings=s).pool("p")
    assert p.desired_replicas == 7 and "headroom: 19 tasks of room hold 7" in p.reason
    assert not [x for x in p.steps if isinstance(x, MarkDraining)]
    # with 5 s start-ups a jump still waits for the next read, 10 s: 1 - 5 / 15 of its
    # 20 tasks served already, 14 tasks, hold 5 replicas
    fast = {"p": replace(held(1), estimates=replace(est, startup=5.0))}
    quick = run(snap(inputs), fast, settings=s).pool("p")
    assert quick.desired_replicas == 5 and "headroom keeps 5" in quick.reason, quick.reason
    # read continuously, a jump needs no room, and a burst that came once holds none of
    # the headroom's: the pool scales down to its load
    now = run(snap(inputs), fast, settings=replace(s, interval=0.0)).pool("p")
    assert now.desired_replicas == 1, now.reason


def test_a_small_pool_of_short_tasks_grows_to_the_room_while_bursts_recur() -> None:
    s = replace(SETTINGS, headroom_sigmas=2.0, small_pool_replicas=5)
    est = replace(Estimates(service=1.0, service_at=NOW), rates=_rates(*RECURRING))
    hist = replace(held(1), estimates=est)
    inputs = replace(pool(spec(target_per_replica=1), running=1, replicas=1),
                     demand=Demand(0, 1, 1.0, 1.0))
    room = size(Demand(0, 1, 1.0, 1.0),
                est.observe(Demand(0, 1, 1.0, 1.0), inputs.infra, NOW, s),
                replicas=1, target=1, s=s, now=NOW).reserve
    assert room >= 3
    p = run(snap(inputs), {"p": hist}, settings=s).pool("p")
    assert p.desired_replicas == room and "grows to its room" in p.reason
    assert [x for x in p.steps if isinstance(x, ScaleUp)]
    # a pool of small_pool_replicas or more is held at the room, not grown to it
    big = run(snap(inputs), {"p": hist}, settings=replace(s, small_pool_replicas=1))
    assert big.pool("p").desired_replicas == 1
    # so is a pool of tasks as long as the wait aimed at (5 s)
    slow = replace(inputs, demand=Demand(0, 5, 1.0, 5.0))
    long = run(snap(slow), {"p": replace(hist, estimates=replace(est, service=5.0))},
               settings=s).pool("p")
    assert long.desired_replicas == 1 and "scale-up window" in long.reason
    # and bursts that do not recur grow nothing
    calm = replace(hist, estimates=replace(est, rates=_rates(*ONCE)))
    assert run(snap(inputs), {"p": calm}, settings=s).pool("p").desired_replicas == 1


def test_the_service_time_weighs_each_read_by_its_completions() -> None:
    """After a burst of 30 s tasks, the few still finishing are the longest: a read of
    3 of them at 90 s barely moves a mean read from 600 completions, while a plain
    moving average would move a sixth of the way there (1 - e^(-10/60))."""
    s = replace(S, service_smoothing=60.0)
    burst = _est(None).observe(Demand(0, 0, 0.0, 30.0, completed=600), None, NOW, s)
    assert burst.service == 30.0 and burst.service_weight == 600
    tail = burst.observe(Demand(0, 3, 0.0, 90.0, completed=3), None, NOW + 10, s)
    assert tail.service is not None and 30.0 < tail.service < 30.5
    # where a plain moving average (each read alike) would have taken it: 39.2 s
    plain = 30.0 + (1 - math.exp(-10 / 60)) * (90.0 - 30.0)
    assert plain - tail.service > 8.5
    # /status shows the weight behind the figure: 600 faded by e^(-10/60), plus 3
    got = size(Demand(0, 3, 0.0, 90.0, completed=3), tail, replicas=10, target=3, s=s)
    assert any("(weight 511: the completions read, fading over 60s)" in line
               for line in got.explain)
    # with as many completions in each read the weights are alike: a plain moving
    # average once the weight has built up (and the read itself without smoothing)
    steady = _est(None)
    for k in range(60):
        steady = steady.observe(Demand(0, 10, 1.0, 30.0, completed=30), None, NOW + 10 * k, s)
    moved = steady.observe(Demand(0, 10, 1.0, 36.0, completed=30), None, NOW + 600, s)
    assert moved.service == pytest.approx(30.0 + (1 - math.exp(-10 / 60)) * 6.0, rel=1e-3)
    none = replace(s, service_smoothing=0.0)
    assert tail.observe(Demand(0, 3, 0.0, 90.0, completed=3), None, NOW + 20,
                        none).service == 90.0
    # the weight fades with time: a read long after the burst counts nearly in full
    late = burst.observe(Demand(0, 3, 0.0, 90.0, completed=3), None, NOW + 1200, s)
    assert late.service is not None and late.service > 89.0
    # a read without a count weighs as one completion; one of no completions keeps the
    # estimate (and the weight fades)
    one = burst.observe(Demand(0, 3, 0.0, 90.0), None, NOW + 10, s)
    assert one.service == pytest.approx(30.0 + 60.0 / (600 * math.exp(-10 / 60) + 1))
    empty = burst.observe(Demand(0, 3, 0.0, 90.0, completed=0), None, NOW + 10, s)
    assert empty.service == 30.0
    assert empty.service_weight == pytest.approx(600 * math.exp(-10 / 60))


def test_a_flapping_pool_holds_the_arrivals_level_not_a_backlog_peak() -> None:
    # 30 s tasks at 1/s: the arrivals keep 30 in service. A burst's backlog had the
    # pool sized for 90 for a minute (a running count working it off); the guard holds
    # the arrivals' level over its 300 s, and the sized figures over the 60 s window.
    s = spec(disruption_replicas=5, max_replicas=100, target_per_replica=3)
    settings = replace(SETTINGS, flap_window=300.0, scale_down_window=60.0)
    est = Estimates(service=30.0, service_at=NOW, startup=10.0)
    times = [NOW - 300 + 10 * k for k in range(30)]
    sized = tuple((t, 90 if t < NOW - 240 else 30) for t in times)
    hist = PoolHistory(samples=sized, levels=tuple((t, 30) for t in times),
                       estimates=est, flap_until=NOW + 100)
    inputs = replace(pool(s, replicas=30), demand=Demand(0, 30, 1.0, 30.0))
    got = run(snap(inputs), {"p": hist}, settings=settings).pool("p")
    assert got.desired_replicas == 10, got.reason
    assert got.history.levels[-1] == (NOW, 30)
    assert any(x.startswith("arrivals' level = burst rate 1/s x service = 30 tasks")
               for x in got.sizing)
    # the burst's peak inside the ordinary window still holds the pool
    recent = tuple((t, 90 if t >= NOW - 40 else 30) for t in times)
    kept = run(snap(inputs), {"p": replace(hist, samples=recent)},
               settings=settings).pool("p")
    assert kept.desired_replicas == 30, kept.reason
    # and a level that was higher within the flap window holds it too
    high = tuple((t, 60 if t == NOW - 200 else 30) for t in times)
    held_level = run(snap(inputs), {"p": replace(hist, levels=high)},
                     settings=settings).pool("p")
    assert held_level.desired_replicas == 20, held_level.reason


def test_the_level_is_kept_apart_from_the_sized_figure() -> None:
    s = spec(max_replicas=100, target_per_replica=3)
    est = Estimates(service=30.0, service_at=NOW, startup=10.0)
    # 90 running where 1/s of 30 s tasks keep 30 busy: a backlog worked off
    working = replace(pool(s, replicas=30), demand=Demand(0, 90, 1.0, 30.0))
    h = run(snap(working), {"p": replace(held(30), estimates=est)}).pool("p").history
    assert h.samples[-1] == (NOW, 90) and h.levels[-1] == (NOW, 30)
    # the busiest 5 s (12/s) spread over a 30 s service time: 2/s, 60 in service
    bursty = replace(pool(s, replicas=30), demand=Demand(0, 30, 1.0, 30.0, arrival_peak=12.0))
    h = run(snap(bursty), {"p": replace(held(30), estimates=est)}).pool("p").history
    assert h.levels[-1] == (NOW, 60)
    # a gap in the data clears both
    gap = replace(pool(s, replicas=30), demand=None)
    h = run(snap(gap), {"p": replace(held(30), estimates=est)}).pool("p").history
    assert h.samples == () and h.levels == ()


def test_levels_hold_only_a_flapping_pool() -> None:
    s = spec(disruption_replicas=5, max_replicas=100, target_per_replica=3)
    settings = replace(SETTINGS, flap_window=300.0, scale_down_window=60.0)
    est = Estimates(service=30.0, service_at=NOW, startup=10.0)
    times = [NOW - 300 + 10 * k for k in range(30)]
    hist = PoolHistory(samples=tuple((t, 30) for t in times),
                       levels=tuple((t, 60 if t == NOW - 200 else 30) for t in times),
                       estimates=est)
    inputs = replace(pool(s, replicas=30), demand=Demand(0, 30, 1.0, 30.0))
    calm = run(snap(inputs), {"p": hist}, settings=settings).pool("p")
    assert calm.desired_replicas == 10, calm.reason  # not flapping: the 60 s window
    flapping = run(snap(inputs), {"p": replace(hist, flap_until=NOW + 100)},
                   settings=settings).pool("p")
    assert flapping.desired_replicas == 20, flapping.reason
    assert "the arrivals' level for 300s (flapping)" in flapping.reason
    # a history whose levels do not reach back over the flap window keeps the sized
    # figures over it, as before levels were kept
    short = replace(hist, flap_until=NOW + 100, levels=hist.levels[-5:],
                    samples=tuple((t, 90 if t == NOW - 200 else 30) for t in times))
    old = run(snap(inputs), {"p": short}, settings=settings).pool("p")
    assert old.desired_replicas == 30, old.reason


def test_without_the_model_the_level_is_the_sized_figure() -> None:
    inputs = replace(pool(spec(), replicas=2), demand=Demand(7, 3))  # no rate read
    got = run(snap(inputs), {"p": held(10)}).pool("p")
    assert got.history.levels[-1] == got.history.samples[-1] == (NOW, 10)


def test_a_pools_long_window_is_kept_in_the_history_tick_by_tick() -> None:
    """A pool's own window longer than anything the controller keeps (900 s against the
    300 s of the flap and small-pool windows): ticking the plan forward, the history
    reaches back over it, so the pool scales down after 900 s idle, not never."""
    s = spec(scale_down_window=900, max_replicas=100)
    settings = replace(SETTINGS, flap_window=300.0, small_pool_replicas=5)
    hist: dict[str, PoolHistory] = {"p": held(50)}  # busy: 10 replicas' worth
    downs = []
    for k in range(1, 100):
        now = NOW + 10 * k
        fresh = [worker(f"p-w{i}", hb=now) for i in range(10)]
        inputs = pool(s, replicas=10, workers=fresh, infra_at=now)
        got = run(snap(inputs, read_at=now, health=db(at=now)), hist, settings=settings,
                  now=now)
        hist = dict(got.history)
        if got.pool("p").desired_replicas < 10:
            downs.append(k * 10)
    assert downs and downs[0] == 910, downs[:3]  # 900 s after the first idle read, at 10 s


@pytest.mark.parametrize(("own", "held_for"), [(30, 300), (900, 900)])
def test_a_flapping_pool_holds_the_longer_of_its_window_and_the_flap_window(
        own: int, held_for: int) -> None:
    """The flap guard lengthens a pool's own short window to ``flap_window``; a pool's
    longer window stays its own; the sized figures are held over the pool's window."""
    s = spec(disruption_replicas=5, max_replicas=100, target_per_replica=3,
             scale_down_window=own)
    settings = replace(SETTINGS, flap_window=300.0, scale_down_window=60.0)
    est = Estimates(service=30.0, service_at=NOW, startup=10.0)
    times = [NOW - 1000 + 10 * k for k in range(100)]
    level = 60  # a level of 60 tasks (20 replicas) held_for + 10 s ago, 30 since
    hist = PoolHistory(samples=tuple((t, 30) for t in times),
                       levels=tuple((t, level if t == NOW - held_for - 10 else 30)
                                    for t in times),
                       estimates=est, flap_until=NOW + 100)
    inputs = replace(pool(s, replicas=30), demand=Demand(0, 30, 1.0, 30.0))
    got = run(snap(inputs), {"p": hist}, settings=settings).pool("p")
    assert got.desired_replicas == 10, got.reason  # the level left the window just now
    assert f"the arrivals' level for {held_for}s (flapping)" in got.reason
    inside = replace(hist, levels=tuple((t, level if t == NOW - held_for + 10 else 30)
                                        for t in times))
    kept = run(snap(inputs), {"p": inside}, settings=settings).pool("p")
    assert kept.desired_replicas == 20, kept.reason
    # the sized figures are held over the pool's own window (not the controller's 60 s)
    sized = replace(hist, samples=tuple((t, 90 if t == NOW - own + 10 else 30)
                                        for t in times))
    assert run(snap(inputs), {"p": sized}, settings=settings).pool("p").desired_replicas == 30
