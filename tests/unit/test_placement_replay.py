"""The benchmark's incremental replay picks exactly what `rank` picks, and the FGD
protocol and VM-trace pieces behave as documented."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roost.bench.fgd_protocol import arrivals, discrete_curve
from roost.bench.replay import ReplayCluster
from roost.bench.traces import Flavor, VmArrival, VmTrace, load_pods, pod_type
from roost.bench.vm_sim import Outcome, find_peak, flavor_types, lower_bound, min_hosts, replay
from roost.decide.placement import POLICIES, NodeView, make_policy, placements
from roost.decide.workload import Workload
from roost.domain.fit import FreeCapacity, take
from roost.domain.resources import Resources

SHAPES = [
    pod_type(4000, 8192, 0, 0, ""),
    pod_type(8000, 16_384, 1, 1000, ""),
    pod_type(2000, 4096, 1, 500, ""),
    pod_type(3000, 4096, 1, 250, ""),
    pod_type(16_000, 32_768, 2, 1000, ""),
    pod_type(12_000, 65_536, 4, 1000, ""),
]


def cluster() -> list[NodeView]:
    out = []
    for i, (cpu, gpus) in enumerate([(32_000, 4), (16_000, 2), (64_000, 8), (8000, 0)] * 3):
        res = Resources(cpu, cpu * 4)
        out.append(NodeView(f"n{i:02d}", res, FreeCapacity(res, (1000,) * gpus, ("G",) * gpus)))
    return out


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.sampled_from(range(len(SHAPES))), min_size=1, max_size=60),
    st.sampled_from([p for p in POLICIES if p != "anycast"]),
)
def test_replay_places_where_rank_would(picks: list[int], policy_name: str) -> None:
    pods = [SHAPES[i] for i in picks]
    policy = make_policy(policy_name, Workload.from_requests(pods))
    fast = ReplayCluster(cluster(), policy)
    slow = sorted(cluster(), key=lambda n: n.node_id)
    for itype in pods:
        got = fast.place(itype)
        want = placements(slow, itype, policy=policy)
        if not want:
            assert got is None
            continue
        assert got is not None
        assert fast.nodes[got.node].node_id == want[0].node.node_id
        assert got.gpus == want[0].gpus
        i = next(k for k, n in enumerate(slow) if n.node_id == want[0].node.node_id)
        slow[i] = NodeView(slow[i].node_id, slow[i].allocatable,
                           take(slow[i].free, itype, want[0].gpus))
    assert [n.free for n in fast.nodes] == [n.free for n in slow]


def test_anycast_replay_spreads_over_the_nodes_that_fit() -> None:
    fast = ReplayCluster(cluster(), make_policy("anycast"), rng=random.Random(1))
    used = {fast.place(SHAPES[0]).node for _ in range(12)}  # type: ignore[union-attr]
    assert len(used) > 3


def test_arrivals_follow_the_trace_then_resample_up_to_the_inflation() -> None:
    pods = [SHAPES[1], SHAPES[2], SHAPES[0]]
    seq = arrivals(pods, cluster_gpu_milli=10_000, inflation=1.3, seed=42)
    assert seq[:3] == pods
    total = sum(p.gpu_total_milli for p in seq)
    assert 13_000 - 1000 < total <= 13_000
    assert seq == arrivals(pods, cluster_gpu_milli=10_000, inflation=1.3, seed=42)
    shuffled = arrivals(pods * 5, cluster_gpu_milli=10_000, inflation=1.3, seed=42,
                        shuffled=True)
    assert shuffled[:15] != pods * 5


def test_discrete_curve_averages_by_rounded_arrival() -> None:
    curve = discrete_curve([(0.2, 0.2), (0.6, 0.5), (1.4, 1.0), (3.0, 2.0)])
    assert curve[0] == pytest.approx(0.2)
    assert curve[1] == pytest.approx(0.75)
    assert curve[2] == pytest.approx((0.75 * 2 + 2.0) / 3)  # none at 2: neighbours 1 and 3
    assert curve[3] == pytest.approx(2.0)
    assert curve[10] is None


def test_pod_types_follow_the_protocol() -> None:
    assert pod_type(1000, 10, 8, 1000, "").gpu_count == 8
    assert pod_type(1000, 10, 1, 1000, "").gpu_count == 1
    assert pod_type(1000, 10, 1, 470, "").gpu_milli == 470
    assert pod_type(1000, 10, 0, 0, "").gpu_total_milli == 0
    assert pod_type(1000, 10, 1, 470, "T4").gpu_models == ("T4",)
    # A spec with "|" is a set, any of which will do; upstream repeats a model at times.
    several = pod_type(1000, 10, 2, 1000, "V100M32|V100M16|V100M32")
    assert several.gpu_models == ("V100M16", "V100M32") and several.gpu_count == 2


def test_pods_with_the_same_model_set_share_one_type(tmp_path: Path) -> None:
    head = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time"
    rows = ["p0,1000,10,1,500,V100M16|V100M32,LS,Running,1",
            "p1,1000,10,1,500,V100M32|V100M16|V100M32,LS,Running,2",
            "p2,1000,10,1,500,V100M16,LS,Running,3"]
    path = tmp_path / "pods.csv"
    path.write_text("\n".join([head, *rows]) + "\n")
    a, b, c = load_pods(path)
    assert a is b and a.gpu_models == ("V100M16", "V100M32") and c.gpu_models == ("V100M16",)


def tiny_trace() -> VmTrace:
    flavors = (Flavor("a", 1, 2), Flavor("b", 4, 8))
    arrivals_ = (
        VmArrival(0, 1, 100),
        VmArrival(0, 1, 100),
        VmArrival(50, 0, None),
        VmArrival(100, 1, 200),  # arrives as the first two leave
        VmArrival(150, 0, 300),
    )
    return VmTrace(flavors, arrivals_, 300)


def test_vm_replay_releases_departures_before_arrivals() -> None:
    trace = tiny_trace()
    types = flavor_types(trace)
    peak = find_peak(trace, types)
    assert peak.cpu_used_milli == 9000 and peak.index == 2
    host = Resources(4000, 8192)
    assert lower_bound(peak, host) == 3
    policy = make_policy("pack")
    out, _ = replay(trace, types, policy, host=host, count=3)
    assert out.rejected == 0
    out, _ = replay(trace, types, policy, host=host, count=2)
    assert out.rejected == 1 and out.first_rejection == 2


def test_min_hosts_binary_search() -> None:
    def served(n: int) -> Outcome:
        return Outcome(n, 0 if n >= 137 else 1, None)

    assert min_hosts(served, lower=100).min_hosts == 137
    assert min_hosts(served, lower=137).min_hosts == 137


def test_pods_load_in_creation_order(tmp_path: Path) -> None:
    head = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time"
    rows = ["p0,1000,10,0,0,,BE,Running,30", "p1,2000,10,0,0,,BE,Running,10",
            "p2,3000,10,0,0,,BE,Running,30", "p3,4000,10,0,0,,BE,Running,20"]
    path = tmp_path / "pods.csv"
    path.write_text("\n".join([head, *rows]) + "\n")
    assert [p.cpu_milli for p in load_pods(path)] == [2000, 4000, 1000, 3000]
