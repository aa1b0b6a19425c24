"""Catalog, resources, host reserve and GPU fit rules."""

from __future__ import annotations

import pytest

from roost.domain.catalog import BUILTIN, InstanceType, parse_types_toml
from roost.domain.fit import FreeCapacity, assign_gpus, fit_count, fits, give, take
from roost.domain.host import (
    DEFAULT_RESERVE,
    HostCapacity,
    mem_total_mib,
    parse_gpus,
    physical_cores,
)
from roost.domain.resources import GpuDevice, Resources, parse_quantity


@pytest.mark.parametrize(
    ("name", "vcpu", "gib", "gpus", "gpu_milli"),
    [
        ("t3.nano", 2, 0.5, 0, 0),
        ("t3.2xlarge", 8, 32, 0, 0),
        ("m7i.large", 2, 8, 0, 0),
        ("c7i.24xlarge", 96, 192, 0, 0),
        ("r7i.xlarge", 4, 32, 0, 0),
        ("m8a.16xlarge", 64, 256, 0, 0),
        ("g5.12xlarge", 48, 192, 4, 0),
        ("gs1.half", 4, 16, 0, 500),
    ],
)
def test_catalog_sizes(name: str, vcpu: int, gib: float, gpus: int, gpu_milli: int) -> None:
    t = BUILTIN[name]
    assert (t.cpu_milli, t.mem_mib) == (vcpu * 1000, round(gib * 1024))
    assert (t.gpu_count, t.gpu_milli) == (gpus, gpu_milli)


def test_catalog_families_complete() -> None:
    sizes = ["large", "xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge",
             "24xlarge"]
    for fam in ("m7i", "c7i", "r7i", "m8a"):
        assert all(f"{fam}.{s}" in BUILTIN for s in sizes)
    assert [n for n in BUILTIN if n.startswith("t3.")] == [
        "t3.nano", "t3.micro", "t3.small", "t3.medium", "t3.large", "t3.xlarge", "t3.2xlarge"]


def test_operator_types_from_toml() -> None:
    types = parse_types_toml("""
        [types."x1.big"]
        vcpu = 12
        memory_gib = 48
        [types."x1.slice"]
        cpu_milli = 500
        memory_mib = 512
        gpu_fraction = 0.25
        gpu_model = "T4"
    """)
    cat = BUILTIN.with_types(types)
    assert cat["x1.big"].resources == Resources(12000, 49152)
    assert (cat["x1.slice"].gpu_milli, cat["x1.slice"].gpu_models) == (250, ("T4",))
    assert len(cat) == len(BUILTIN) + 2


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[types.x]\nvcpu = 1\nmemory_gib = 1", "family.size"),
        ('[types."a.b"]\nvcpu = 1', "memory_gib"),
        ('[types."a.b"]\nvcpu = "x"\nmemory_gib = 1', "numbers"),
        ('[types."a.b"]\nvcpu = 1\nmemory_gib = 1\ngpus = 1\ngpu_fraction = 0.5', "not both"),
        ("not toml [", "invalid TOML"),
    ],
)
def test_bad_operator_types_name_the_fault(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        parse_types_toml(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("8vcpu,32GiB", Resources(8000, 32768)), ("500m, 512MiB", Resources(500, 512)),
     ("1.5cpu,1TiB", Resources(1500, 1048576))],
)
def test_parse_quantity(text: str, expected: Resources) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("text", ["8vcpu", "32GiB", "8 cores,1GiB", "-1vcpu,1GiB"])
def test_parse_quantity_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_quantity(text)


def test_reserve_defaults_to_two_vcpu_two_gib_and_floors_at_zero() -> None:
    assert DEFAULT_RESERVE == Resources(2000, 2048)
    assert HostCapacity(Resources(8000, 16384)).allocatable == Resources(6000, 14336)
    assert HostCapacity(Resources(1000, 1024)).allocatable == Resources(0, 0)


CPUINFO_HT = "\n".join(
    f"processor\t: {i}\nphysical id\t: 0\ncore id\t\t: {i % 2}\n" for i in range(4)
)


def test_physical_cores_ignore_hyperthreads() -> None:
    assert physical_cores(CPUINFO_HT) == 2
    assert physical_cores("processor : 0\n\nprocessor : 1\n") == 2  # no topology: count CPUs


def test_mem_total() -> None:
    assert mem_total_mib("MemFree: 1 kB\nMemTotal:       16384000 kB\n") == 16000
    with pytest.raises(ValueError):
        mem_total_mib("MemFree: 1 kB\n")


def test_parse_gpus() -> None:
    assert parse_gpus("2xA10G,T4") == (GpuDevice(0, "A10G"), GpuDevice(1, "A10G"),
                                       GpuDevice(2, "T4"))
    assert parse_gpus("") == ()


def gpu_node(*free: int) -> FreeCapacity:
    return FreeCapacity(Resources(64000, 262144), tuple(free), tuple("A10G" for _ in free))


def test_whole_gpus_take_fully_free_devices() -> None:
    g = BUILTIN["g5.12xlarge"]  # 4 GPUs
    assert assign_gpus(gpu_node(1000, 1000, 1000, 1000), g) == tuple((i, 1000) for i in range(4))
    assert assign_gpus(gpu_node(1000, 1000, 1000, 999), g) is None
    assert fit_count(gpu_node(*[1000] * 8), g) == 1  # CPU caps it: 48 of 64 vCPU


def test_fraction_goes_best_fit_on_one_device() -> None:
    half = BUILTIN["gs1.half"]
    cap = gpu_node(1000, 600, 500)
    assert assign_gpus(cap, half) == ((2, 500),)  # the tightest device that holds it
    assert assign_gpus(gpu_node(400, 400), half) is None  # 800 free, but not on one device
    assert fit_count(cap, half) == 4


def test_take_then_give_restores() -> None:
    cap = gpu_node(1000, 1000)
    t = BUILTIN["gs1.quarter"]
    gpus = assign_gpus(cap, t)
    assert gpus is not None
    after = take(cap, t, gpus)
    assert after.gpu_free == (1000, 750) or after.gpu_free == (750, 1000)
    assert give(after, t, gpus) == cap
    assert fits(cap, BUILTIN["g5.xlarge"])


def test_gpu_model_must_match() -> None:
    t4 = InstanceType("x.t4", 1000, 1024, gpu_count=1, gpu_models=("T4",))
    assert assign_gpus(gpu_node(1000), t4) is None


def test_one_error_tree_with_kinds_and_one_code_map() -> None:
    from roost.controller.adapters.k8s.errors import ScaleConflict
    from roost.controller.orchestrator import OrchestratorUnavailable, ScaleRejected
    from roost.domain import errors as e

    # Retry or answer is decided by the kind, for the gateway's and the controller's
    # errors alike; anything outside the tree is a bug: answered, not retried.
    assert e.is_transient(e.ServiceUnavailable("x")) and e.is_transient(
        e.RequestLimitExceeded("x"))
    assert not e.is_transient(e.InsufficientInstanceCapacity("x"))
    assert not e.is_transient(e.InvalidParameterValue("x"))
    assert not e.is_transient(e.InternalError("x")) and not e.is_transient(ValueError("x"))
    assert isinstance(OrchestratorUnavailable("x"), e.RoostError)
    assert e.is_transient(OrchestratorUnavailable("x")) and e.is_transient(ScaleConflict("x"))
    assert not e.is_transient(ScaleRejected("x"))
    # Every EC2 code maps back to its own class, in one place.
    todo: list[type[e.RoostError]] = [e.RoostError]
    seen = 0
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__ == e.__name__ and "code" in vars(cls) and cls is not e.RoostError:
            assert type(e.from_code(cls.code, "m")) is cls, cls
            seen += 1
    assert seen > 50
    assert type(e.from_code("Throttling")) is e.RequestLimitExceeded
    unknown = e.from_code("NoSuchCode", "")
    assert type(unknown) is e.InternalError and unknown.message == "NoSuchCode"
