"""Placement policies: table-driven choices, and that every policy only ever offers
nodes the fit rule accepts."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roost.decide.placement import (
    DEFAULT_POLICY,
    POLICIES,
    FgdPolicy,
    NodeView,
    Remembering,
    RoostPolicy,
    best_placement,
    candidates,
    in_share,
    make_policy,
    placements,
    rank,
)
from roost.decide.workload import (
    Demand,
    GpuFragmentation,
    UsableCapacity,
    Workload,
    WorkloadWindow,
    parse_workload_toml,
)
from roost.domain.catalog import BUILTIN, InstanceType
from roost.domain.fit import FreeCapacity, fits, gpu_choices
from roost.domain.resources import Resources


def node(
    node_id: str,
    cpu: int = 16_000,
    mem: int = 65_536,
    *,
    total_cpu: int | None = None,
    total_mem: int | None = None,
    gpus: tuple[int, ...] = (),
    model: str = "A10",
    draining: bool = False,
) -> NodeView:
    alloc = Resources(total_cpu or cpu, total_mem or mem)
    free = FreeCapacity(Resources(cpu, mem), gpus, (model,) * len(gpus))
    return NodeView(node_id, alloc, free, draining)


SMALL = InstanceType("t3.small", 2000, 2048)
WHOLE = InstanceType("g5.xlarge", 4000, 16_384, gpu_count=1)
PAIR = InstanceType("g5.pair", 4000, 16_384, gpu_count=2)
HALF = InstanceType("gs1.half", 2000, 8192, gpu_milli=500)
QUARTER = InstanceType("gs1.quarter", 2000, 8192, gpu_milli=250)


# -- the fit rule's device choices ---------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "itype", "expected"),
    [
        ((1000, 1000), WHOLE, [((0, 1000),)]),
        ((500, 1000, 1000), PAIR, [((1, 1000), (2, 1000))]),
        ((500, 1000), PAIR, []),
        ((600, 1000, 600, 400), HALF, [((0, 500),), ((1, 500),)]),  # 600 twice: one choice
        ((400,), HALF, []),
        ((), SMALL, [()]),
    ],
)
def test_gpu_choices(gpus: tuple[int, ...], itype: InstanceType, expected: list[object]) -> None:
    cap = FreeCapacity(Resources(64_000, 1 << 20), gpus, ("A10",) * len(gpus))
    assert gpu_choices(cap, itype) == expected


def test_gpu_choices_respect_the_model() -> None:
    cap = FreeCapacity(Resources(64_000, 1 << 20), (1000, 1000), ("T4", "A10"))
    t = InstanceType("x.a10", 1000, 1024, gpu_milli=500, gpu_models=("A10",))
    assert gpu_choices(cap, t) == [((1, 500),)]


# -- which node each policy puts first -----------------------------------------------

MIX = Workload.from_requests([HALF, QUARTER, WHOLE, WHOLE, SMALL])

EMPTY = node("a-empty", gpus=(1000, 1000))
BUSY = node("b-busy", cpu=6000, total_cpu=16_000, gpus=(500, 1000))
SLIVER = node("c-sliver", gpus=(250, 1000))
FULL = node("d-full", cpu=1000, gpus=(1000, 1000))  # too little CPU for anything but tiny


@pytest.mark.parametrize(
    ("policy", "nodes", "itype", "first"),
    [
        ("pack", [EMPTY, BUSY], SMALL, "b-busy"),
        ("spread", [EMPTY, BUSY], SMALL, "a-empty"),
        ("dotprod", [EMPTY, BUSY], SMALL, "b-busy"),
        # A slice goes where it fills a partly used device, not a whole one.
        ("fgd", [EMPTY, BUSY], HALF, "b-busy"),
        ("roost", [EMPTY, BUSY], HALF, "b-busy"),
        ("fgd", [EMPTY, SLIVER], QUARTER, "c-sliver"),
        ("roost", [EMPTY, SLIVER], QUARTER, "c-sliver"),
        # Nothing fits on FULL, whatever the policy.
        ("pack", [FULL, EMPTY], WHOLE, "a-empty"),
        ("fgd", [FULL, EMPTY], WHOLE, "a-empty"),
        # Equal nodes tie; the lower id wins.
        ("pack", [node("n2"), node("n1")], SMALL, "n1"),
        ("roost", [node("n2", gpus=(1000,)), node("n1", gpus=(1000,))], WHOLE, "n1"),
    ],
)
def test_first_choice(policy: str, nodes: list[NodeView], itype: InstanceType, first: str) -> None:
    assert rank(nodes, itype, policy=policy, workload=MIX)[0].node_id == first


def test_fgd_places_a_slice_on_the_device_that_fragments_least() -> None:
    n = node("n", cpu=64_000, mem=1 << 20, gpus=(1000, 500, 1000))
    [p] = placements([n], HALF, policy="fgd", workload=MIX)
    assert p.gpus == ((1, 500),)


def test_roost_keeps_cpu_for_the_gpus() -> None:
    """A CPU-only request should not take the CPU that a node's free GPUs need."""
    workload = Workload.from_requests([WHOLE] * 9 + [SMALL])
    gpu_node = node("a-gpu", cpu=8000, total_cpu=16_000, gpus=(1000, 1000))
    cpu_node = node("b-cpu", cpu=8000, total_cpu=16_000, gpus=(0, 0))
    assert rank([gpu_node, cpu_node], SMALL, policy="roost", workload=workload)[0] is cpu_node


def test_anycast_is_random_but_reproducible_with_a_seeded_rng() -> None:
    nodes = [node(f"n{i}") for i in range(20)]
    one = rank(nodes, SMALL, policy="anycast", rng=random.Random(7))
    two = rank(nodes, SMALL, policy="anycast", rng=random.Random(7))
    assert one == two
    assert sorted(v.node_id for v in one) == sorted(v.node_id for v in nodes)
    assert [v.node_id for v in one] != sorted(v.node_id for v in nodes)


def test_draining_nodes_are_never_offered() -> None:
    nodes = [node("a", draining=True), node("b")]
    for policy in POLICIES:
        assert [v.node_id for v in rank(nodes, SMALL, policy=policy)] == ["b"]


def test_unknown_policy_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="known: anycast"):
        rank([node("a")], SMALL, policy="bogus")


def test_default_policy_and_existing_call_still_work() -> None:
    assert DEFAULT_POLICY in POLICIES
    assert rank([node("a"), node("b", cpu=4000, total_cpu=16_000)], SMALL)[0].node_id == "b"


def test_policy_objects_can_be_passed_directly() -> None:
    policy = RoostPolicy(Workload.from_requests([HALF, WHOLE]))
    assert rank([EMPTY, BUSY], HALF, policy=policy)[0].node_id == "b-busy"


# -- fragmentation and usable capacity -----------------------------------------------


def test_fragmentation_by_hand() -> None:
    """Workload: half the arrivals ask 0.5 GPU, half 1 GPU (both 1 CPU)."""
    w = Workload.from_requests([HALF, WHOLE])
    f = GpuFragmentation(w)
    models = ("A10", "A10")
    assert f(16_000, 0, (1000, 1000), models) == pytest.approx(0)
    # 0.5 and 0.3 free: the half-GPU shape can use 500 of 800, the whole one nothing.
    assert f(16_000, 0, (500, 300), models) == pytest.approx(0.5 * 300 + 0.5 * 800)
    # No CPU: nothing runs, all 2000 milli are stranded.
    assert f(0, 0, (1000, 1000), models) == pytest.approx(2000)
    assert f(16_000, 0, (0, 0), models) == 0


def test_usable_capacity_counts_whole_requests() -> None:
    w = Workload.from_requests([WHOLE])
    u = UsableCapacity(w)
    two_gpus_cpu_for_one = FreeCapacity(Resources(5000, 1 << 20), (1000, 1000), ("A", "A"))
    two_gpus_cpu_for_two = FreeCapacity(Resources(8000, 1 << 20), (1000, 1000), ("A", "A"))
    assert u.weighted(two_gpus_cpu_for_one) * 2 == u.weighted(two_gpus_cpu_for_two)


def test_typical_keeps_the_frequent_shapes() -> None:
    w = Workload.from_requests([HALF] * 96 + [WHOLE] * 3 + [PAIR])
    kept = [d for d, _ in w.typical(0.95).mix]
    assert kept == [Demand(2000, 0, 1, 500)]
    assert w.typical(1.0).mix[0][1] == pytest.approx(0.96)


def test_fgd_without_a_workload_measures_against_the_request() -> None:
    """Against only itself, a slice fragments nothing wherever it lands: a tie, by id.
    That is why the gateway should pass the workload it has seen."""
    fgd = make_policy("fgd")
    assert isinstance(fgd, Remembering) and isinstance(fgd.inner, FgdPolicy)
    assert rank([EMPTY, BUSY], HALF, policy="fgd")[0].node_id == "a-empty"
    assert rank([EMPTY, BUSY], HALF, policy="fgd", workload=MIX)[0].node_id == "b-busy"


# -- every policy only offers nodes that fit -------------------------------------------

gpu_lists = st.lists(st.sampled_from([0, 100, 250, 500, 750, 1000]), max_size=4)


@st.composite
def node_views(draw: st.DrawFn, i: int) -> NodeView:
    total_cpu = draw(st.integers(1000, 32_000))
    total_mem = draw(st.integers(1024, 65_536))
    gpus = tuple(draw(gpu_lists))
    return NodeView(
        f"n{i:02d}",
        Resources(total_cpu, total_mem),
        FreeCapacity(
            Resources(draw(st.integers(0, total_cpu)), draw(st.integers(0, total_mem))),
            gpus,
            tuple(draw(st.sampled_from(["A10", "T4"])) for _ in gpus),
        ),
        draining=draw(st.booleans()),
    )


@st.composite
def clusters(draw: st.DrawFn) -> list[NodeView]:
    return [draw(node_views(i)) for i in range(draw(st.integers(0, 8)))]


requests = st.builds(
    lambda cpu, mem, kind, n, milli, model: InstanceType(
        "x.req",
        cpu,
        mem,
        gpu_count=n if kind == "whole" else 0,
        gpu_milli=milli if kind == "slice" else 0,
        gpu_models=model,
    ),
    st.integers(1, 16_000),
    st.integers(1, 32_768),
    st.sampled_from(["none", "whole", "slice"]),
    st.integers(1, 3),
    st.sampled_from([100, 250, 500, 900]),
    st.sampled_from([(), ("A10",), ("A10", "T4")]),
)


@settings(max_examples=150, deadline=None)
@given(clusters(), requests, st.sampled_from(POLICIES), st.lists(requests, min_size=1))
def test_every_policy_offers_exactly_the_nodes_that_fit(
    nodes: list[NodeView], itype: InstanceType, policy: str, seen: list[InstanceType]
) -> None:
    workload = Workload.from_requests(seen)
    found = placements(nodes, itype, policy=policy, rng=random.Random(0), workload=workload)
    assert {p.node.node_id for p in found} == {n.node_id for n in candidates(nodes, itype)}
    for p in found:
        assert fits(p.node.free, itype)
        assert p.gpus in gpu_choices(p.node.free, itype)


def test_roost_without_gpus_keeps_room_for_the_expected_requests() -> None:
    """Mostly 4-vCPU requests expected: a 1-vCPU one should not break the last 4-vCPU
    hole, even though best fit would put it there."""
    big, small = InstanceType("m.big", 4000, 1024), InstanceType("m.small", 1000, 1024)
    workload = Workload.from_requests([big] * 9 + [small])
    a = node("a-tight", cpu=4000, mem=60_000, total_cpu=8000, total_mem=60_000)
    b = node("b-roomy", cpu=5000, mem=60_000, total_cpu=8000, total_mem=60_000)
    assert rank([a, b], small, policy="pack")[0] is a
    assert rank([a, b], small, policy="roost", workload=workload)[0] is b


def test_workload_window_rebuilds_every_refresh_over_the_last_requests() -> None:
    window = WorkloadWindow(size=4, refresh=2)
    window.observe(SMALL)
    assert window.current() is None
    window.observe(WHOLE)
    first = window.current()
    assert first is not None and len(first.mix) == 2
    for _ in range(4):
        window.observe(HALF)
    latest = window.current()
    assert latest is not None and [d for d, _ in latest.mix] == [Demand.of(HALF)]
    with pytest.raises(ValueError):
        WorkloadWindow(size=0)


def test_a_declared_workload_weighs_shapes_by_type() -> None:
    declared = parse_workload_toml(
        '[workload]\n"g5.xlarge" = 3\n"gs1.quarter" = 1\n"g5.2xlarge" = 0.5\n', BUILTIN)
    shares = {d: round(s, 4) for d, s in declared.mix}
    assert shares == {Demand.of(BUILTIN["g5.xlarge"]): round(3 / 4.5, 4),
                      Demand.of(BUILTIN["gs1.quarter"]): round(1 / 4.5, 4),
                      Demand.of(BUILTIN["g5.2xlarge"]): round(0.5 / 4.5, 4)}


@pytest.mark.parametrize("name", ["roost", "fgd", "dotprod", "pack", "spread"])
def test_remembered_verdicts_rank_as_fresh_ones_and_follow_a_changed_node(name: str) -> None:
    """The memo answers for a node's view object only: a node that changed (a new view
    under the same id) is scored again, and every ranking equals a fresh policy's."""
    rng = random.Random(7)
    views = [node(f"n{i:02d}", cpu=rng.randrange(2000, 16_001, 1000),
                  mem=rng.randrange(4096, 65_537, 4096), gpus=(1000,) * rng.randrange(0, 3))
             for i in range(20)]
    policy = make_policy(name, MIX)
    assert isinstance(policy, Remembering)
    for step in range(40):
        for itype in (SMALL, WHOLE, HALF):
            fresh = placements(views, itype, policy=Remembering(policy.inner))
            assert placements(views, itype, policy=policy) == fresh, (step, itype.name)
            skip = {p.node.node_id for p in fresh[:step % 3]}  # nodes a launch tried
            assert best_placement(views, itype, policy=policy, skip=skip) == next(
                (p for p in fresh if p.node.node_id not in skip), None)
            index = step % 3  # one placer of three: its own share first, else all
            untried = [p for p in fresh if p.node.node_id not in skip]
            assert best_placement(views, itype, policy=policy, skip=skip,
                                  share=(index, 3)) == next(
                (p for p in untried if in_share(p.node.node_id, index, 3)),
                untried[0] if untried else None), (step, itype.name)
        k = rng.randrange(len(views))  # one node changes, as after a launch on it
        old = views[k]
        views[k] = node(old.node_id, cpu=max(0, old.free.resources.cpu_milli - 2000),
                        mem=old.free.resources.mem_mib, total_cpu=old.allocatable.cpu_milli,
                        total_mem=old.allocatable.mem_mib, gpus=old.free.gpu_free[1:])


def test_placers_sharing_a_view_pack_their_own_shares_first() -> None:
    """Placers sharing a view (a gateway pool's processes) each take the best node of
    their own share, so they do not all send their launches to the one best node; a
    placer whose share has no room takes the best of all, so a cluster with room is
    never answered as full."""
    views = [node(f"n{i}", cpu=2000 * (i + 1), mem=4096 * (i + 1)) for i in range(12)]
    ranked = [p.node.node_id for p in placements(views, SMALL, policy="pack")]
    assert best_placement(views, SMALL, policy="pack").node.node_id == ranked[0]
    picks = [best_placement(views, SMALL, policy="pack", share=(i, 3)).node.node_id
             for i in range(3)]
    assert len(set(picks)) == 3  # three placers, three nodes
    for i, pick in enumerate(picks):
        own = [n for n in ranked if in_share(n, i, 3)]
        assert own and pick == own[0]  # the best of its own share
    assert sorted(n for i in range(3) for n in ranked if in_share(n, i, 3)) == sorted(ranked)
    lone = [node("only", cpu=2000, mem=4096)]
    (outside,) = [i for i in range(2) if not in_share("only", i, 2)]
    assert best_placement(lone, SMALL, policy="pack", share=(outside, 2)).node.node_id == "only"


def test_the_placement_cost_bench_prints_a_row_per_size() -> None:
    from click.testing import CliRunner

    from roost.bench.placement_cost import placement_cost

    out = CliRunner().invoke(placement_cost, ["--nodes", "20", "--nodes", "40",
                                              "--launches", "10"])
    assert out.exit_code == 0, out.output
    rows = [line for line in out.output.splitlines() if line.startswith("| 20 |")
            or line.startswith("| 40 |")]
    assert len(rows) == 2 and all(line.endswith("x |") for line in rows)
