"""Capacity through the whole stack: a cluster with room anywhere never answers
InsufficientInstanceCapacity, a full one answers it at once, and MinCount/MaxCount
span nodes or roll back completely."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.e2e.conftest import IMAGE, ThreadedCluster, make_cluster
from tests.e2e.test_boto3 import wait_state
from tests.polling import wait_until

# t3.nano asks for 2 vCPU and 512 MiB: nodes of 80, 120 and 200 vCPU hold exactly 200.
CAPACITIES = ["80vcpu,64GiB", "120vcpu,64GiB", "200vcpu,128GiB"]
FULL = 200


def launch(ec2: Any, itype: str = "t3.nano", n: int = 1, min_count: int | None = None
           ) -> list[str] | str:
    """Instance ids, or the EC2 error code."""
    try:
        out = ec2.run_instances(ImageId=IMAGE, InstanceType=itype, MinCount=min_count or n,
                                MaxCount=n)
    except ClientError as exc:
        return str(exc.response["Error"]["Code"])
    return [i["InstanceId"] for i in out["Instances"]]


@pytest.fixture
def mixed(tmp_path: Path) -> Any:
    c = make_cluster(tmp_path, capacities=CAPACITIES)
    try:
        yield c
    finally:
        c.stop()


def test_200_concurrent_launches_at_exact_capacity(mixed: ThreadedCluster) -> None:
    ec2 = mixed.client(pool=FULL)
    with ThreadPoolExecutor(max_workers=FULL) as pool:
        results = list(pool.map(lambda _: launch(ec2), range(FULL)))
    errors = Counter(r for r in results if isinstance(r, str))
    assert errors == Counter(), f"launches failed: {errors}"
    assert mixed.allocations() == {"n1": 40, "n2": 60, "n3": 100}

    assert launch(ec2) == "InsufficientInstanceCapacity"
    first = results[0]
    assert isinstance(first, list)
    ec2.terminate_instances(InstanceIds=first)
    wait_state(ec2, first[0], "terminated")
    again = launch(ec2)
    assert isinstance(again, list) and len(again) == 1


def test_max_count_spans_nodes_and_min_count_rolls_back(cluster: ThreadedCluster) -> None:
    ec2 = cluster.client()
    before = cluster.allocations()
    spread = launch(ec2, "t3.micro", n=10)  # 2 vCPU each: 4 fit per 8-vCPU node
    assert isinstance(spread, list) and len(spread) == 10
    gained = Counter({k: v - before[k] for k, v in cluster.allocations().items()})
    assert sum(gained.values()) == 10 and len(+gained) == 3  # every node took some
    ec2.terminate_instances(InstanceIds=spread)
    for iid in spread:
        wait_state(ec2, iid, "terminated")

    free = 12 - sum(cluster.allocations().values())
    assert launch(ec2, "t3.micro", n=free + 5, min_count=free + 1) == (
        "InsufficientInstanceCapacity")
    wait_until("the rollback leaves no instance behind",
               lambda: sum(cluster.allocations().values()) == 0, detail=cluster.allocations)

    partial = launch(ec2, "t3.micro", n=free + 5, min_count=2)
    assert isinstance(partial, list) and len(partial) == free  # as many as fit, >= MinCount
    ec2.terminate_instances(InstanceIds=partial)
    for iid in partial:
        wait_state(ec2, iid, "terminated")
