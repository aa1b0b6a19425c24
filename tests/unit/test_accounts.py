"""Quota classes and the quota decision (pure), and sealing secrets with the operator
key."""

from __future__ import annotations

import pytest
from cryptography.exceptions import InvalidTag

from roost.domain.accounts import (
    HOLD_TTL,
    Held,
    Quotas,
    Usage,
    check,
    demand,
    quota_class,
)
from roost.domain.catalog import BUILTIN
from roost.domain.errors import InstanceLimitExceeded, VcpuLimitExceeded
from roost.gateway.accounts import load_operator_key, new_operator_key, seal, unseal


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


def test_a_launch_past_the_vcpu_quota_is_refused_with_ec2s_message() -> None:
    micro = BUILTIN.get("t3.micro")
    usage = Usage(instances={"i-1": demand(micro, 2, 0.0)})  # 4 vCPUs held
    check(Quotas(vcpus={"standard": 6}), usage, demand(micro, 1, 0.0), now=1.0)
    with pytest.raises(VcpuLimitExceeded, match="current vCPU limit of 5 allows"):
        check(Quotas(vcpus={"standard": 5}), usage, demand(micro, 1, 0.0), now=1.0)
    # Another class's limit does not apply, nor does an absent one.
    check(Quotas(vcpus={"g": 0}), usage, demand(micro, 50, 0.0), now=1.0)


def test_instance_count_and_gpu_quotas() -> None:
    g5 = BUILTIN.get("g5.12xlarge")  # 4 GPUs
    usage = Usage(holds={"r-1": demand(g5, 1, 100.0)})
    with pytest.raises(InstanceLimitExceeded, match="allows for 1 more running instance"):
        check(Quotas(instances=2), usage, demand(g5, 2, 100.0), now=101.0)
    with pytest.raises(VcpuLimitExceeded, match="GPU limit of 6"):
        check(Quotas(gpus_milli=6000), usage, demand(g5, 1, 100.0), now=101.0)
    # A hold from a launch that never finished lapses.
    check(Quotas(gpus_milli=6000), usage, demand(g5, 1, 0.0), now=100.0 + HOLD_TTL)


def test_usage_sums_instances_and_live_holds() -> None:
    usage = Usage(instances={"i-1": Held("standard", 2, 0, 1)},
                  holds={"r-1": Held("g", 4, 1000, 1, at=10.0),
                         "r-old": Held("g", 8, 1000, 1, at=-HOLD_TTL)})
    assert usage.vcpus_by_class(11.0) == {"standard": 2, "g": 4}
    assert usage.totals(11.0) == Held("", 6, 1000, 2)


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
