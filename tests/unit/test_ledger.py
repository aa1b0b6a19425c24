"""The node ledger never commits beyond capacity, and returns to zero."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from hypothesis import given, settings
from hypothesis import strategies as st

from roost.domain.catalog import BUILTIN
from roost.domain.fit import assign_gpus
from roost.domain.host import HostCapacity
from roost.domain.resources import GPU_MILLI, GpuDevice, Resources
from roost.node.ledger import Ledger

HOST = HostCapacity(Resources(16000, 65536), gpus=(GpuDevice(0, "A10G"), GpuDevice(1, "A10G")),
                    reserve=Resources(0, 0))
TYPES = ["t3.micro", "m7i.large", "m7i.2xlarge", "r7i.large", "g5.xlarge", "gs1.quarter",
         "gs1.half", "gs1.eighth", "c7i.4xlarge"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from(TYPES), st.integers(0, 15)),
                max_size=60))
def test_random_allocate_release_never_exceeds_capacity(
    ops: list[tuple[bool, str, int]],
) -> None:
    ledger = Ledger(HOST, BUILTIN)
    for alloc, tname, slot in ops:
        iid = f"i-{slot}"
        if alloc:
            before = ledger.fitting_types()
            got = ledger.allocate(iid, BUILTIN[tname])
            assert (got is not None) == (tname in before or iid in ledger.allocations)
        else:
            ledger.release(iid)
        free = ledger.free
        assert not free.resources.is_negative()
        assert all(0 <= g <= GPU_MILLI for g in free.gpu_free)
        used = sum((a.itype.resources for a in ledger.allocations.values()), Resources())
        assert used + free.resources == HOST.allocatable
    for iid in list(ledger.allocations):
        assert ledger.release(iid)
    assert ledger.free == HOST.empty()


def test_threads_racing_for_the_last_slots() -> None:
    ledger = Ledger(HostCapacity(Resources(8000, 32768), reserve=Resources(0, 0)), BUILTIN)
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda i: ledger.allocate(f"i-{i}", BUILTIN["m7i.large"]),
                                range(50)))
    assert sum(r is not None for r in results) == 4
    assert ledger.free.resources == Resources(0, 0)


def test_double_allocate_and_release_are_idempotent() -> None:
    ledger = Ledger(HOST, BUILTIN)
    a = ledger.allocate("i-1", BUILTIN["m7i.large"])
    assert ledger.allocate("i-1", BUILTIN["m7i.large"]) == a
    assert ledger.count == len(ledger.allocations) == 1
    assert ledger.release("i-1") and not ledger.release("i-1")
    assert ledger.free == HOST.empty() and ledger.count == 0


def test_the_gateways_device_choice_is_followed_when_it_still_holds() -> None:
    ledger = Ledger(HOST, BUILTIN)
    quarter, half = BUILTIN["gs1.quarter"], BUILTIN["gs1.half"]
    assert ledger.allocate("i-1", quarter).gpus == ((0, 250),)  # no hint: best fit
    # Best fit would put the next quarter beside the first (device 0, 750 free); the
    # placement chose device 1, and device 1 can hold it.
    assert ledger.allocate("i-2", quarter, devices=[1]).gpus == ((1, 250),)
    ledger.allocate("i-3", BUILTIN["gs1.half"], devices=[1])
    # Device 1 has 250 left: a half there can't fit, so the node picks its own (0).
    assert ledger.allocate("i-4", half, devices=[1]).gpus == ((0, 500),)
    # Hints that make no sense for the type are ignored, never trusted: best fit instead.
    eighth = BUILTIN["gs1.eighth"]
    for i, bad in enumerate(([7], [0, 1], [-1], [1, 1])):
        best = assign_gpus(ledger.free, eighth)
        alloc = ledger.allocate(f"i-x{i}", eighth, devices=bad)
        assert alloc is not None and alloc.gpus == best
        ledger.release(f"i-x{i}")
    assert ledger.allocate("i-5", BUILTIN["g5.xlarge"], devices=[1]) is None  # no whole GPU


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from(TYPES), st.integers(0, 15)),
                max_size=40))
def test_fit_counts_follow_every_change(ops: list[tuple[bool, str, int]]) -> None:
    # Kept between changes: each answer equals a ledger rebuilt from the same allocations.
    ledger = Ledger(HOST, BUILTIN)
    for alloc, tname, slot in ops:
        if alloc:
            ledger.allocate(f"i-{slot}", BUILTIN[tname])
        else:
            ledger.release(f"i-{slot}")
        fresh = Ledger(HOST, BUILTIN)
        for iid, a in ledger.allocations.items():
            fresh.adopt(iid, a.itype, a.gpus)
        counts = ledger.fit_counts()
        assert counts == fresh.fit_counts()
        counts.clear()  # a caller's copy: the kept answer is not touched
        assert ledger.fit_counts() == fresh.fit_counts()
