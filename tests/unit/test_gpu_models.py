"""GPU-model sets: a type that accepts any of several models, through the fit rule, the
node ledger, the fragmentation measures and every placement policy. An empty set means
any model."""

from __future__ import annotations

import pytest

from roost.decide.placement import POLICIES, NodeView, gpu_inventory, placements, rank
from roost.decide.workload import (
    Demand,
    GpuFragmentation,
    UsableCapacity,
    Workload,
    scarcity,
)
from roost.domain.catalog import BUILTIN, InstanceType, parse_types_toml
from roost.domain.fit import (
    FreeCapacity,
    assign_gpus,
    assignment_on,
    fit_count,
    fits,
    gpu_choices,
    take,
)
from roost.domain.host import HostCapacity, parse_gpus
from roost.domain.resources import Resources
from roost.node.ledger import Ledger

ROOMY = Resources(64_000, 1 << 20)
V100S = ("V100M16", "V100M32")


def whole(n: int, *models: str) -> InstanceType:
    return InstanceType("x.whole", 1000, 1024, gpu_count=n, gpu_models=models)


def part(milli: int, *models: str) -> InstanceType:
    return InstanceType("x.part", 1000, 1024, gpu_milli=milli, gpu_models=models)


def cap(*devices: tuple[str, int]) -> FreeCapacity:
    return FreeCapacity(ROOMY, tuple(f for _, f in devices), tuple(m for m, _ in devices))


T4, M16, M32 = ("T4", 1000), ("V100M16", 1000), ("V100M32", 1000)


# -- the type: a sorted set, from TOML as one model or a list -------------------------


def test_a_model_set_is_sorted_without_repeats_and_compares_as_a_set() -> None:
    t = whole(1, "V100M32", "V100M16", "V100M32")
    assert t.gpu_models == V100S
    assert t == whole(1, *V100S)
    assert t.accepts_model("V100M16") and not t.accepts_model("T4")
    assert whole(1).accepts_model("anything")
    with pytest.raises(TypeError):
        InstanceType("x.y", 1000, 1024, gpu_count=1, gpu_models="T4")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "models"),
    [
        ('gpu_model = "T4"', ("T4",)),
        ('gpu_model = ""', ()),
        ('gpu_models = ["V100M32", "V100M16"]', V100S),
        ("gpu_models = []", ()),
        ("", ()),
    ],
)
def test_types_toml_takes_one_model_or_a_list(fields: str, models: tuple[str, ...]) -> None:
    [t] = parse_types_toml(f'[types."x.y"]\nvcpu = 1\nmemory_gib = 1\ngpus = 1\n{fields}\n')
    assert t.gpu_models == models


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ('gpu_model = "T4"\ngpu_models = ["T4"]', "not both"),
        ('gpu_models = "T4"', "list of strings"),
        ("gpu_models = [1]", "list of strings"),
        ("gpu_model = 4", "must be a string"),
        ('gpu_models = ["A|B"]', "without '|'"),
        ('gpu_models = [""]', "non-empty"),
    ],
)
def test_bad_model_sets_name_the_fault(fields: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        parse_types_toml(f'[types."x.y"]\nvcpu = 1\nmemory_gib = 1\ngpus = 1\n{fields}\n')


# -- the fit rule ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("devices", "itype", "assigned", "count"),
    [
        # A device qualifies when its model is in the set; an empty set takes any.
        ((T4, M16, M32), whole(1, *V100S), ((1, 1000),), 2),
        ((T4, M16, M32), whole(2, *V100S), ((1, 1000), (2, 1000)), 1),
        ((T4, M16, M32), whole(3, *V100S), None, 0),
        ((T4, M16, M32), whole(3), ((0, 1000), (1, 1000), (2, 1000)), 1),
        ((T4, T4), whole(1, *V100S), None, 0),
        ((T4, M32), whole(1, "V100M16"), None, 0),
        # Slices: best fit among the devices of the set only.
        ((("T4", 300), ("V100M16", 600), ("V100M32", 400)), part(250, *V100S), ((2, 250),), 3),
        ((("T4", 300), ("V100M16", 600)), part(250, "T4", "V100M16"), ((0, 250),), 3),
        ((("T4", 300), ("V100M16", 100)), part(250, *V100S), None, 0),
    ],
)
def test_fit_honours_the_model_set(
    devices: tuple[tuple[str, int], ...],
    itype: InstanceType,
    assigned: object,
    count: int,
) -> None:
    c = cap(*devices)
    assert assign_gpus(c, itype) == assigned
    assert fits(c, itype) == (assigned is not None)
    assert fit_count(c, itype) == count
    for choice in gpu_choices(c, itype):
        assert all(itype.accepts_model(c.gpu_models[i]) for i, _ in choice)


@pytest.mark.parametrize(
    ("devices", "itype", "choices"),
    [
        # One choice per accepted model that alone has enough devices...
        ((M16, T4, M32, M16), whole(1, *V100S), [((0, 1000),), ((2, 1000),)]),
        ((M16, T4, M32, M16), whole(2, *V100S), [((0, 1000), (3, 1000))]),
        # ...else the lowest-index mix.
        ((M16, T4, M32), whole(2, *V100S), [((0, 1000), (2, 1000))]),
        ((M16, M16), whole(1, *V100S), [((0, 1000),)]),
        # A slice: one choice per distinct (free, model) of the set.
        ((("T4", 500), ("V100M16", 500), ("V100M32", 500)), part(500, *V100S),
         [((1, 500),), ((2, 500),)]),
    ],
)
def test_gpu_choices_with_a_model_set(
    devices: tuple[tuple[str, int], ...], itype: InstanceType, choices: list[object]
) -> None:
    assert gpu_choices(cap(*devices), itype) == choices


def test_a_chosen_device_outside_the_set_is_refused() -> None:
    c = cap(T4, M16)
    assert assignment_on(c, whole(1, *V100S), [0]) is None
    assert assignment_on(c, whole(1, *V100S), [1]) == ((1, 1000),)


# -- the node ledger ------------------------------------------------------------------

HOST = HostCapacity(Resources(32_000, 65_536), gpus=parse_gpus("2xT4,1xV100M16,1xV100M32"),
                    reserve=Resources(0, 0))


@pytest.mark.parametrize(
    ("itype", "hint", "devices"),
    [
        (whole(1, *V100S), (), [(2, 1000)]),
        (whole(1, *V100S), (3,), [(3, 1000)]),  # a hint in the set is followed
        (whole(1, *V100S), (0,), [(2, 1000)]),  # a T4 hint is not
        (whole(2, *V100S), (), [(2, 1000), (3, 1000)]),
        (whole(1, "T4", "V100M32"), (3,), [(3, 1000)]),
        (part(500, "V100M32"), (), [(3, 500)]),
        (whole(3, *V100S), (), None),
    ],
)
def test_the_ledger_commits_only_devices_of_the_set(
    itype: InstanceType, hint: tuple[int, ...], devices: list[tuple[int, int]] | None
) -> None:
    ledger = Ledger(HOST, BUILTIN)
    got = ledger.allocate("i-1", itype, hint)
    assert (None if got is None else list(got.gpus)) == devices


def test_the_ledgers_fit_counts_follow_the_set() -> None:
    catalog = BUILTIN.with_types([
        InstanceType("v.one", 1000, 1024, gpu_count=1, gpu_models=V100S),
        InstanceType("t.one", 1000, 1024, gpu_count=1, gpu_models=("T4",)),
    ])
    ledger = Ledger(HOST, catalog)
    assert ledger.fit_counts()["v.one"] == 2
    ledger.allocate("i-1", catalog["v.one"])
    ledger.allocate("i-2", catalog["v.one"])
    assert "v.one" not in ledger.fitting_types() and ledger.fit_counts()["t.one"] == 2


# -- fragmentation and placement ------------------------------------------------------


def view(node_id: str, *devices: tuple[str, int]) -> NodeView:
    return NodeView(node_id, ROOMY, cap(*devices))


def test_a_shape_that_accepts_a_model_can_use_its_free_gpus() -> None:
    """F counts free GPU a shape can't use: a T4 is stranded for a V100-only shape, not
    for one that also takes T4s."""
    v100_only = Workload.of(whole(1, *V100S))
    t4_too = Workload.of(whole(1, "T4", *V100S))
    assert GpuFragmentation(v100_only)(64_000, 0, (1000,), ("T4",)) == 1000
    assert GpuFragmentation(t4_too)(64_000, 0, (1000,), ("T4",)) == 0
    assert UsableCapacity(v100_only).weighted(cap(T4)) == 0
    assert UsableCapacity(t4_too).weighted(cap(T4)) > 0
    assert Demand.of(whole(1, "V100M32", "V100M16")).gpu_models == V100S


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_offers_only_nodes_with_a_device_of_the_set(policy: str) -> None:
    nodes = [view("a-t4", T4, T4), view("b-m16", M16), view("c-m32", M32, T4),
             view("d-p100", ("P100", 1000))]
    found = placements(nodes, whole(1, *V100S), policy=policy,
                       workload=Workload.of(whole(1, *V100S)))
    assert sorted(p.node.node_id for p in found) == ["b-m16", "c-m32"]
    assert all(p.gpus == ((0, 1000),) for p in found)


def test_fgd_and_roost_keep_the_devices_only_the_set_can_use_for_it() -> None:
    """Most requests take T4 or V100; a few take only V100. A T4-or-V100 request should
    go to the T4 node and leave the V100 for the requests nothing else serves."""
    either = whole(1, "T4", "V100M16")
    only = whole(1, "V100M16")
    workload = Workload.from_requests([either] * 3 + [only])
    nodes = [view("a-v100", M16), view("b-t4", T4)]
    for policy in ("fgd", "roost"):
        assert rank(nodes, either, policy=policy, workload=workload)[0].node_id == "b-t4"


# -- scarcity: the cluster's device mix against the workload's model sets -------------


@pytest.mark.parametrize(
    ("models", "factor"),
    [
        ((), 1.0),  # any model
        (("G2",), 10 / 8),
        (("P100",), 10 / 2),
        (("P100", "T4"), 10 / 2),  # no T4 in the cluster: P100s are all it may use
        (("T4",), 1.0),  # fits nowhere: its weight is moot
    ],
)
def test_scarcity_is_all_devices_over_those_a_shape_may_use(
    models: tuple[str, ...], factor: float
) -> None:
    inventory = (("G2", 8), ("P100", 2))
    assert scarcity(Demand.of(whole(1, *models)), inventory) == factor


def test_the_inventory_counts_devices_free_or_not() -> None:
    nodes = [view("a", ("G2", 0), ("G2", 1000)), view("b", ("P100", 250)), view("c")]
    assert gpu_inventory(nodes) == (("G2", 2), ("P100", 1))


def test_without_model_sets_the_inventory_changes_nothing() -> None:
    workload = Workload.from_requests([whole(1), whole(2), part(500)])
    c = cap(M16, ("T4", 500), T4)
    plain = UsableCapacity(workload)
    weighed = UsableCapacity(workload, (("T4", 100), ("V100M16", 3)))
    assert plain.weighted(c) == weighed.weighted(c)
    assert plain.total_weight == weighed.total_weight


def test_usable_capacity_weighs_room_for_a_scarce_model_more() -> None:
    """Half the requests take any GPU, half only P100s, which are 1 in 10 of the
    cluster's GPUs. Without the inventory a request for any GPU costs as much usable
    capacity on a P100 node as on a G2 one; with it, the P100 node's room is worth 10x
    to the P100 requests, so the G2 node costs less."""
    anywhere, p100 = whole(1), whole(1, "P100")
    workload = Workload.from_requests([anywhere, p100])
    inventory = (("G2", 18), ("P100", 2))
    on_p100, on_g2 = cap(("P100", 1000), ("P100", 1000)), cap(("G2", 1000), ("G2", 1000))

    def loss(u: UsableCapacity, c: FreeCapacity) -> int:
        gpus = assign_gpus(c, anywhere)
        assert gpus is not None
        return u.weighted(c) - u.weighted(take(c, anywhere, gpus))

    plain, weighed = UsableCapacity(workload), UsableCapacity(workload, inventory)
    assert loss(plain, on_p100) == 2 * loss(plain, on_g2)  # P100 requests lose one too
    assert loss(weighed, on_p100) == 11 * loss(weighed, on_g2)  # ...worth 10 each
