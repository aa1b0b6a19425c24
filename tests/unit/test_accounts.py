"""Quota classes and the quota decision (pure), and sealing secrets with the operator
key."""

from __future__ import annotations

import time

import pytest
from cryptography.exceptions import InvalidTag

from roost.bus.schemas import InstanceRecord
from roost.domain.accounts import (
    HOLD_TTL,
    MIRRORED_GRACE,
    RECENT_TTL,
    Held,
    Quotas,
    StoredKey,
    Tally,
    Usage,
    check,
    demand,
    quota_class,
)
from roost.domain.catalog import BUILTIN
from roost.domain.errors import InstanceLimitExceeded, VcpuLimitExceeded
from roost.gateway.accounts import KeyBook, load_operator_key, new_operator_key, seal, unseal
from roost.gateway.index import InstanceIndex
from roost.gateway.quotas import weigher
from roost.gateway.tenancy import Caller


@pytest.mark.parametrize(("type_name", "cls"), [
    ("t3.micro", "standard"), ("m7i.large", "standard"), ("c7i.xlarge", "standard"),
    ("r7i.large", "standard"), ("z1d.large", "standard"), ("i4i.large", "standard"),
    ("d3.xlarge", "standard"), ("h1.2xlarge", "standard"), ("a1.large", "standard"),
    ("g5.xlarge", "g"), ("vt1.3xlarge", "g"), ("gs1.half", "g"), ("p4d.24xlarge", "p"),
    ("inf2.xlarge", "inf"), ("dl1.24xlarge", "dl"), ("trn1.2xlarge", "trn"),
    ("f1.2xlarge", "f"), ("x2idn.16xlarge", "x"), ("u-6tb1.metal", "hm"),
    ("mac2.metal", "standard"), ("k9.large", "other"),
])
def test_quota_classes_follow_ec2s_on_demand_buckets(type_name: str, cls: str) -> None:
    assert quota_class(type_name) == cls


def _tally(*held: Held) -> Tally:
    out = Tally()
    for h in held:
        out.add(h)
    return out


def _counted(usage: Usage, now: float, mirrored: Tally | None = None,
             states: dict[str, str] | None = None,
             launched: dict[str, int] | None = None) -> Tally:
    return usage.counted(now, mirrored or Tally(), (states or {}).get,
                         lambda rid: (launched or {}).get(rid, 0))


def test_a_launch_past_the_vcpu_quota_is_refused_with_ec2s_message() -> None:
    micro = BUILTIN.get("t3.micro")
    held = _tally(demand(micro, 2, 0.0))  # 4 vCPUs held
    check(Quotas(vcpus={"standard": 6}), held, demand(micro, 1, 0.0))
    with pytest.raises(VcpuLimitExceeded, match="current vCPU limit of 5 allows"):
        check(Quotas(vcpus={"standard": 5}), held, demand(micro, 1, 0.0))
    # Another class's limit does not apply, nor does an absent one.
    check(Quotas(vcpus={"g": 0}), held, demand(micro, 50, 0.0))


def test_instance_count_and_gpu_quotas() -> None:
    g5 = BUILTIN.get("g5.12xlarge")  # 4 GPUs
    usage = Usage(holds={"r-1": demand(g5, 1, 100.0)})
    held = _counted(usage, 101.0)
    with pytest.raises(InstanceLimitExceeded, match="allows for 1 more running instance"):
        check(Quotas(instances=2), held, demand(g5, 2, 100.0))
    with pytest.raises(VcpuLimitExceeded, match="GPU limit of 6"):
        check(Quotas(gpus_milli=6000), held, demand(g5, 1, 100.0))
    # A hold from a launch that never finished lapses.
    check(Quotas(gpus_milli=6000), _counted(usage, 100.0 + HOLD_TTL), demand(g5, 1, 0.0))


def test_usage_counts_the_mirror_plus_what_it_does_not_show_yet() -> None:
    """The mirror's tally, live holds less their instances the mirror already shows,
    and recent entries until the mirror shows their instance: none counted twice."""
    now = 1000.0
    usage = Usage(
        instances={"i-new": Held("standard", 2, 0, 1, at=now - 1),  # not mirrored yet
                   "i-seen": Held("standard", 2, 0, 1, at=now - 1),  # mirrored: counted there
                   "i-old": Held("standard", 2, 0, 1, at=now - RECENT_TTL - 1),
                   "i-start": Held("standard", 4, 0, 1, at=now - 1, starting=True)},
        holds={"r-1": Held("g", 8, 2000, 2, at=now - 1),  # 1 of its 2 in the mirror
               "r-old": Held("g", 8, 1000, 1, at=now - HOLD_TTL - 1)})
    mirrored = _tally(Held("standard", 2, 0, 1), Held("g", 4, 1000, 1))  # i-seen, r-1's
    states = {"i-seen": "running", "i-start": "stopped", "i-r1": "pending"}
    held = _counted(usage, now, mirrored, states, {"r-1": 1})
    assert held.vcpus == {"standard": 2 + 2 + 4, "g": 4 + 4}
    assert (held.gpus_milli, held.instances) == (2000, 5)
    # Once the start shows, the mirror counts it, and the entry no longer does.
    states["i-start"] = "pending"
    assert _counted(usage, now, mirrored, states, {"r-1": 1}).vcpus["standard"] == 4
    # A terminated instance counts nowhere, its entry included.
    assert _counted(Usage(instances={"i-t": Held("standard", 2, 0, 1, at=now)}), now,
                    states={"i-t": "terminated"}).instances == 0


def test_tally_goes_back_to_nothing() -> None:
    held = _tally(Held("g", 4, 1000, 1), Held("standard", 2, 0, 1))
    held.add(Held("g", 4, 1000, 1), -1)
    held.add(Held("standard", 2, 0, 1), -1)
    assert (held.vcpus, held.gpus_milli, held.instances) == ({}, 0, 0)


def test_an_unlimited_account_is_not_limited() -> None:
    assert not Quotas().limited
    assert Quotas(vcpus={"g": 0}).limited and Quotas(instances=5).limited
    assert Quotas(gpus_milli=0).limited


def test_a_sealed_secret_opens_only_with_its_key_and_its_key_id() -> None:
    op = load_operator_key({"ROOST_OPERATOR_KEY": new_operator_key()})
    assert op is not None
    sealed = seal(op, "AKIAONE", "s3cret")
    assert "s3cret" not in sealed
    assert unseal(op, "AKIAONE", sealed) == "s3cret"
    with pytest.raises(InvalidTag):
        unseal(op, "AKIATWO", sealed)  # copied onto another key id
    with pytest.raises(InvalidTag):
        unseal(bytes(32), "AKIAONE", sealed)
    with pytest.raises(ValueError, match="32 bytes"):
        load_operator_key({"ROOST_OPERATOR_KEY": "c2hvcnQ="})


def test_the_key_book_opens_sealed_keys_and_ends_them_on_time() -> None:
    op = bytes(range(32))
    book = KeyBook({"AKIASTATIC": "static"}, operator_key=op)
    book._learn(StoredKey("AKIAONE", "123456789012", seal(op, "AKIAONE", "one"), 0.0))
    book._learn(StoredKey("AKIAOLD", "123456789012", seal(op, "AKIAOLD", "old"), 0.0,
                          expires=time.time() - 1))  # a rotated key past its grace
    book._learn(StoredKey("AKIABAD", "123456789012", seal(bytes(32), "AKIABAD", "x"), 0.0))
    assert book.get("AKIAONE") == "one" and book.caller("AKIAONE") == Caller("123456789012")
    assert book.get("AKIAOLD") is None
    assert book.get("AKIABAD") is None  # sealed under another operator key
    assert book.caller("AKIASTATIC") == Caller("000000000000", admin=True)


def test_usage_record_keeps_only_what_a_mirror_may_not_show() -> None:
    """Lapsed holds, entries past RECENT_TTL, and entries the writer's mirror has
    counted for MIRRORED_GRACE go: the record does not grow with the instances an
    account runs, however many it launched."""
    now = 10_000.0
    states = {"i-shown": "running", "i-shown-late": "running", "i-start": "stopped",
              "i-term": "terminated"}
    usage = Usage(instances={
        "i-shown": Held("standard", 2, 0, 1, at=now - MIRRORED_GRACE - 1),
        "i-shown-late": Held("standard", 2, 0, 1, at=now - 1),  # others may lag
        "i-unseen": Held("standard", 2, 0, 1, at=now - MIRRORED_GRACE - 1),
        "i-start": Held("standard", 2, 0, 1, at=now - MIRRORED_GRACE - 1, starting=True),
        "i-term": Held("standard", 2, 0, 1, at=now - MIRRORED_GRACE - 1),
        "i-gone": Held("standard", 2, 0, 1, at=now - RECENT_TTL - 1)},
        holds={"r-live": Held("g", 4, 0, 1, at=now), "r-lapsed": Held("g", 4, 0, 1, at=0.0)})
    pruned = usage.pruned(now, states.get)
    assert set(pruned.instances) == {"i-shown-late", "i-unseen", "i-start"}
    assert set(pruned.holds) == {"r-live"}
    many = Usage(instances={f"i-{n}": Held("standard", 2, 0, 1, at=now - 30)
                            for n in range(20_000)})
    assert many.pruned(now, lambda _iid: "running") == Usage()


def _rec(iid: str, state: str, at: str, *, rid: str = "r-1", owner: str = "111111111111",
         itype: str = "t3.micro") -> InstanceRecord:
    return InstanceRecord(instance_id=iid, node_id="n1", instance_type=itype,
                          image_id="ami-00000000000000001", state=state, launch_id=f"{rid}-0",
                          reservation_id=rid, launch_time=at, availability_zone="roost-1a",
                          owner_id=owner, updated_at=at)


def test_the_mirror_keeps_each_accounts_tally_as_records_change() -> None:
    """Counted states only, moved on every change, given back when the record goes;
    a type nobody knows counts nothing."""
    index = InstanceIndex(None, None, None)  # type: ignore[arg-type]  # no bus: upserts only
    index.weigh = weigher(BUILTIN.get)
    acct = "111111111111"
    index.upsert(_rec("i-1", "pending", "2026-01-01T00:00:01.000Z"))
    index.upsert(_rec("i-2", "running", "2026-01-01T00:00:01.000Z", itype="g5.xlarge"))
    index.upsert(_rec("i-3", "running", "2026-01-01T00:00:01.000Z", itype="zz9.huge"))
    assert index.tally(acct).vcpus == {"standard": 2, "g": 4}
    assert (index.tally(acct).instances, index.launched("r-1")) == (2, 3)
    index.upsert(_rec("i-1", "running", "2026-01-01T00:00:02.000Z"))
    index.upsert(_rec("i-2", "stopped", "2026-01-01T00:00:02.000Z", itype="g5.xlarge"))
    assert index.tally(acct).vcpus == {"standard": 2}
    index.upsert(_rec("i-1", "terminated", "2026-01-01T00:00:03.000Z"))
    assert index.tally(acct).instances == 0 and index.tally("222222222222").instances == 0
    assert index.launched("r-1") == 3  # terminated records stay until they expire
