"""Pure parts of the gateway: filters, pages and the capacity view (with a fake clock)."""

from __future__ import annotations

from typing import Any

import pytest

from roost.bus.schemas import CapacitySnapshot, InstanceRecord
from roost.domain.catalog import BUILTIN, InstanceType
from roost.domain.errors import InvalidPaginationToken, InvalidParameterValue
from roost.gateway.capacity import CapacityView
from roost.gateway.describe import (
    INSTANCE_FIELDS,
    apply_filters,
    paginate,
    wildcard_match,
)
from roost.gateway.requests import Filter, Page


@pytest.mark.parametrize(("pattern", "value", "hit"), [
    ("t3.*", "t3.micro", True), ("t3.*", "m7i.large", False), ("?3.micro", "t3.micro", True),
    ("t3.micr", "t3.micro", False), (r"a\*b", "a*b", True), (r"a\*b", "axb", False),
    ("[x]", "[x]", True), ("*", "", True),
])
def test_wildcards(pattern: str, value: str, hit: bool) -> None:
    assert wildcard_match(pattern, value) is hit


def rec(iid: str, state: str = "running", **tags: str) -> InstanceRecord:
    return InstanceRecord(instance_id=iid, node_id="n1", instance_type="t3.micro",
                          image_id="ami-1", state=state, launch_id="l", reservation_id="r-1",
                          launch_time="", availability_zone="roost-1a", tags=tags)


def test_filters_combine_and_within_or_across() -> None:
    recs = [rec("i-1", env="dev"), rec("i-2", "stopped", env="prod"), rec("i-3")]

    def ids(*filters: Filter) -> list[str]:
        out = apply_filters(recs, filters, INSTANCE_FIELDS, tags=lambda r: r.tags)
        return [r.instance_id for r in out]

    assert ids(Filter("instance-state-name", ("running",))) == ["i-1", "i-3"]
    assert ids(Filter("tag:env", ("dev", "prod"))) == ["i-1", "i-2"]
    assert ids(Filter("tag-key", ("env",)), Filter("instance-state-code", ("80",))) == ["i-2"]
    assert ids(Filter("tag-value", ("p*",))) == ["i-2"]
    with pytest.raises(InvalidParameterValue):
        ids(Filter("colour", ("red",)))


def test_exact_values_wildcards_and_escapes_mix_in_one_filter() -> None:
    recs = [rec("i-1", env="dev"), rec("i-2", env="a*b"), rec("i-3", env="axb"), rec("i-4")]

    def ids(*values: str) -> list[str]:
        out = apply_filters(recs, [Filter("tag:env", values)], INSTANCE_FIELDS,
                            tags=lambda r: r.tags)
        return [r.instance_id for r in out]

    assert ids("dev") == ["i-1"]
    assert ids("de") == []
    assert ids("nope", "de?") == ["i-1"]
    assert ids(r"a\*b") == ["i-2"]  # escaped: only the literal star
    assert ids("a*b", "dev") == ["i-1", "i-2", "i-3"]
    assert ids("*") == ["i-1", "i-2", "i-3"]  # a record without the tag has no value


def test_pages_follow_the_last_key() -> None:
    items = [f"k{i:02d}" for i in range(12)]
    first = paginate(items, Page(5), key=str, kind="t")
    assert first.items == tuple(items[:5]) and first.next_token
    second = paginate([*items, "k00a"], Page(5, first.next_token), key=str, kind="t")
    assert second.items[0] == "k05"  # an insert before the cursor does not shift pages
    tenth = paginate(items, Page(10), key=str, kind="t").next_token
    last = paginate(items, Page(5, tenth), key=str, kind="t")
    assert last.items == ("k10", "k11") and last.next_token is None
    for bad in ("not a token", tenth):  # the second, another kind's
        with pytest.raises(InvalidPaginationToken):
            paginate(items, Page(5, bad), key=str, kind="u")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def snap(node: str, seq: int, *, cpu: int = 8000, boot: str = "b1", sent: float = 0.0,
         **kw: Any) -> CapacitySnapshot:
    kw = {"draining": False, "fit": {"t3.micro": cpu // 2000}, **kw}
    return CapacitySnapshot(node_id=node, boot_id=boot, seq=seq, availability_zone="roost-1a",
                            alloc_cpu_milli=8000, alloc_mem_mib=32768,
                            free_cpu_milli=cpu, free_mem_mib=32768, heartbeat_seconds=1.0,
                            sent_at=sent, **kw)


def test_snapshots_are_ordered_by_seq_within_a_boot() -> None:
    view = CapacityView(Clock())
    assert view.apply(snap("n1", 2, cpu=4000))
    assert not view.apply(snap("n1", 1, cpu=8000))  # reordered: older
    assert view.nodes()[0].free.resources.cpu_milli == 4000
    assert view.apply(snap("n1", 1, cpu=8000, boot="b2", sent=5.0))  # a restart wins
    assert not view.apply(snap("n1", 9, cpu=0, boot="b1", sent=1.0))  # late, old boot
    assert view.nodes()[0].free.resources.cpu_milli == 8000


def test_silent_nodes_leave_the_candidates_then_the_view() -> None:
    clock = Clock()
    view = CapacityView(clock)
    view.apply(snap("n1", 1))
    clock.now += 2.9
    assert [n.node_id for n in view.nodes()] == ["n1"]
    clock.now += 0.2
    assert view.nodes() == [] and view.status()[0].live is False
    clock.now += 60
    assert view.status() == []


def test_a_node_is_lost_after_missed_heartbeats_or_never_heard_from() -> None:
    clock = Clock()
    view = CapacityView(clock, full_after=6.0)
    view.apply(snap("n1", 1))
    assert not view.lost("n1") and not view.lost("n9")  # n9: not listened long enough
    clock.now += 3.1  # three 1 s heartbeats missed
    assert view.lost("n1") and view.silent_for("n1") == pytest.approx(3.1)
    view.apply(snap("n1", 2))
    assert not view.lost("n1")
    clock.now += 6.0
    view.apply(snap("n1", 3))
    assert view.lost("n9") and view.silent_for("n9") is None
    view.forget("n1")  # roost node forget: out of the view at once
    assert view.status() == [] and view.lost("n1")
    view.apply(snap("n1", 1, boot="b2", sent=1.0))  # ...until it is heard again
    assert not view.lost("n1")


def test_holds_subtract_in_flight_launches_until_a_snapshot_covers_them() -> None:
    view = CapacityView(Clock())
    view.apply(snap("n1", 1, sent=10.0))
    micro = BUILTIN["t3.micro"]
    assert view.nodes()[0].free.resources.cpu_milli == 8000  # read (and kept) before
    hold = view.hold("n1", micro)
    assert view.nodes()[0].free.resources.cpu_milli == 6000
    view.settle(hold, launched=True, launched_at=11.0)
    assert view.nodes()[0].free.resources.cpu_milli == 6000  # not yet in a snapshot
    view.apply(snap("n1", 2, cpu=6000, sent=10.5))  # sent before the launch: still held
    assert view.nodes()[0].free.resources.cpu_milli == 4000
    view.apply(snap("n1", 3, cpu=6000, sent=11.5))
    assert view.nodes()[0].free.resources.cpu_milli == 6000

    failed = view.hold("n1", micro)
    view.settle(failed, launched=False)
    unknown = view.hold("n1", micro)
    view.settle(unknown, launched=True)  # a timeout: held until the next snapshot
    assert view.nodes()[0].free.resources.cpu_milli == 4000
    view.apply(snap("n1", 4, cpu=6000, sent=12.0))
    assert view.nodes()[0].free.resources.cpu_milli == 6000


def test_a_heartbeat_that_repeats_the_room_keeps_the_nodes_view() -> None:
    """Placement remembers its verdict on a node by the view's identity: a heartbeat
    saying the same must keep the object, and any change of room must replace it."""
    view = CapacityView(Clock())
    view.apply(snap("n1", 1, sent=1.0))
    first = view.nodes()[0]
    view.apply(snap("n1", 2, sent=2.0, fit={"t3.micro": 4, "t3.nano": 9}))
    assert view.nodes()[0] is first  # other fields than the room may differ
    for seq, change in enumerate([{"cpu": 6000}, {"draining": True},
                                  {"gpu_free": [1000], "gpu_models": ["T4"]}], start=3):
        view.apply(snap("n1", seq, sent=float(seq), **change))
        now = view.nodes()
        assert not now or now[0] is not first, change
        first = now[0] if now else first
    view.apply(snap("n1", 9, sent=9.0, boot="b2"))  # a restart with other room
    assert view.nodes()[0] is not first and view.nodes()[0].free.gpu_models == ()


@pytest.mark.parametrize(
    ("models", "devices", "free_after"),
    [
        (("V100M16", "V100M32"), (), (1000, 0, 1000)),  # the first device of the set
        (("V100M16", "V100M32"), (2,), (1000, 1000, 0)),  # placement chose device 2
        (("V100M16", "V100M32"), (0,), (1000, 0, 1000)),  # a T4 is not in the set
        ((), (), (0, 1000, 1000)),  # any model: the first device
    ],
)
def test_holds_with_a_gpu_model_set_take_devices_of_the_set(
    models: tuple[str, ...], devices: tuple[int, ...], free_after: tuple[int, ...]
) -> None:
    view = CapacityView(Clock())
    view.apply(snap("n1", 1, gpu_free=[1000] * 3, gpu_models=["T4", "V100M16", "V100M32"]))
    v100 = InstanceType("x.v100", 1000, 1024, gpu_count=1, gpu_models=models)
    view.hold("n1", v100, devices)
    assert view.nodes()[0].free.gpu_free == free_after


def test_the_view_says_full_only_on_every_live_nodes_own_word() -> None:
    clock = Clock()
    view = CapacityView(clock, full_after=2.0)
    micro = BUILTIN["t3.micro"]
    view.apply(snap("n1", 1, cpu=0))
    assert not view.says_full(micro)  # just started: others may not have spoken yet
    clock.now += 2.0
    assert view.says_full(micro)
    view = CapacityView(clock, full_after=0.0)
    assert not view.says_full(micro)  # an empty view knows nothing
    view.apply(snap("n1", 1, cpu=0))
    assert view.says_full(micro)
    assert view.says_full(micro, "roost-1a") and not view.says_full(micro, "roost-1b")
    view.apply(snap("n2", 1, cpu=2000))
    assert not view.says_full(micro)  # n2 fits one
    view.settle(view.hold("n2", micro), launched=True)  # held, but n2 has not said so
    assert not view.says_full(micro)
    view.apply(snap("n2", 2, cpu=0))
    assert view.says_full(micro)
    view.apply(snap("n3", 1, cpu=8000, draining=True, fit={}))  # draining: refuses all
    assert view.says_full(micro)
    assert view.says_full(BUILTIN["m7i.large"])  # a type no node lists fits nowhere

    clock.now += 2.0
    view.apply(snap("n1", 2, cpu=0))
    view.apply(snap("n3", 2, cpu=8000, draining=True, fit={}))
    clock.now += 1.5  # n2 has gone quiet: it may still be subscribed, so ask the bus
    assert [n.node_id for n in view.nodes()] == ["n1", "n3"]
    assert not view.says_full(micro)
    clock.now += 61  # ...until it is forgotten
    view.apply(snap("n1", 3, cpu=0))
    view.apply(snap("n3", 3, cpu=8000, draining=True, fit={}))
    assert view.says_full(micro)


def test_the_kept_listing_of_nodes_is_always_what_a_fresh_walk_finds() -> None:
    """`CapacityView.nodes` keeps its answer between launches and mends it for the
    nodes that changed; through snapshots (same room or not), holds, settles, nodes
    that go silent, come back, cannot launch or are forgotten, it must always be what
    walking every node finds (the one-zone call still walks), down to the view objects."""
    import random

    from roost.decide.placement import gpu_inventory

    rng = random.Random(11)
    now = [1000.0]
    view = CapacityView(lambda: now[0], full_after=0)
    seqs: dict[str, int] = {}
    holds = []
    small = BUILTIN["t3.micro"]

    def snap(node_id: str) -> CapacitySnapshot:
        seqs[node_id] = seqs.get(node_id, 0) + 1
        return CapacitySnapshot(
            node_id=node_id, boot_id="b", seq=seqs[node_id], availability_zone="roost-1a",
            draining=rng.random() < 0.05, alloc_cpu_milli=8000, alloc_mem_mib=32768,
            free_cpu_milli=rng.choice((2000, 4000, 8000)), free_mem_mib=16384,
            gpu_free=[1000] if node_id.endswith("7") else [],
            gpu_models=(["A10G"] if rng.random() < 0.5 else ["T4"]) if node_id.endswith("7")
            else [], heartbeat_seconds=2.0, sent_at=now[0],
            cannot_launch="no QEMU" if rng.random() < 0.03 else "")

    for step in range(600):
        node_id = f"n{rng.randrange(12)}"
        op = rng.random()
        if op < 0.5:
            view.apply(snap(node_id))
        elif op < 0.65:
            holds.append(view.hold(node_id, small))
        elif op < 0.8 and holds:
            view.settle(holds.pop(rng.randrange(len(holds))), launched=rng.random() < 0.5,
                        launched_at=now[0] + rng.choice((-1.0, 1.0)))
        elif op < 0.85:
            view.forget(node_id)
        else:
            now[0] += rng.choice((0.1, 1.0, 7.0))  # 7 s: every node goes silent
        kept = view.nodes()
        walked = view.nodes("roost-1a")
        assert {v.node_id: id(v) for v in kept} == {v.node_id: id(v) for v in walked}, step
        assert len(kept) == len(walked), step
        assert view.gpu_inventory() == gpu_inventory(walked), step
