"""Fault drills through the EC2 API, with real processes: each asserts no lost instance,
no leaked capacity, no duplicate launch and no false InsufficientInstanceCapacity, and
prints how long the cluster took to recover (``pytest -m fault -s`` shows the figures).

- NATS killed (SIGKILL) under a launch/terminate load, then started again on the same
  port and store;
- the instances bucket deleted under a launch load (every KV write fails), then back;
- a node agent process `kill -9`'d mid-burst, then started again;
- a node gone for good, forgotten with `roost node forget` (and coming back after all);
- one server of a 3-server NATS cluster `kill -9`'d under a launch/terminate load;
- a gateway process `kill -9`'d mid-launch with a ClientToken in flight, the request
  retried against another gateway;
- launch/terminate churn: a 100-pair smoke here; the 20,000-pair run is a benchmark
  (`roost bench churn`), too slow for CI on shared cores (about 7 minutes at ~45 pairs/s).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, EndpointConnectionError

from roost.bench.churn import churn, settled_capacity
from roost.bench.launch import Signer
from roost.bus import subjects
from roost.bus.connect import key_value
from roost.bus.contents import live_entries
from roost.embedded import NatsCluster
from roost.embedded.proc import free_port
from tests.e2e.conftest import IMAGE, ThreadedCluster, make_cluster
from tests.e2e.test_boto3 import wait_state
from tests.polling import wait_until

pytestmark = pytest.mark.fault


@pytest.fixture
def fcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedCluster]:
    # Room for 768 t3.micro: the load keeps about half of what it launches, and must
    # never fill the cluster, so that any InsufficientInstanceCapacity is a false one.
    c = make_cluster(tmp_path_factory.mktemp("faults"), nodes=3, capacity="1024vcpu,4TiB")
    try:
        yield c
    finally:
        c.stop()


class Load:
    """A client thread that launches (with a ClientToken, as boto3 does) and
    terminates in a loop, counting each answer by its EC2 code."""

    def __init__(self, cluster: ThreadedCluster) -> None:
        self.ec2 = cluster.client()
        self.outcomes: Counter[str] = Counter()
        self.messages: dict[str, str] = {}  # the first message of each error code
        self.launched: dict[str, str] = {}  # ClientToken -> instance id
        self.ok_times: list[float] = []
        self.failed_times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set() and n < 600:  # bounded, whatever the timing
            n += 1
            token = f"fault-{n}"
            try:
                out = self.ec2.run_instances(ImageId=IMAGE, InstanceType="t3.micro",
                                             MinCount=1, MaxCount=1, ClientToken=token)
            except ClientError as exc:
                code = exc.response["Error"]["Code"]
                self.outcomes[code] += 1
                self.messages.setdefault(code, exc.response["Error"]["Message"])
                self.failed_times.append(time.monotonic())
                time.sleep(0.05)
                continue
            except EndpointConnectionError:
                self.outcomes["connection"] += 1
                continue
            iid = out["Instances"][0]["InstanceId"]
            self.launched[token] = iid
            self.outcomes["ok"] += 1
            self.ok_times.append(time.monotonic())
            if n % 2 == 0:  # half are terminated again under the load
                try:
                    self.ec2.terminate_instances(InstanceIds=[iid])
                except ClientError as exc:
                    self.outcomes[f"terminate:{exc.response['Error']['Code']}"] += 1

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        # the counts are read after this: never while the thread still writes them
        assert kind is not None or not self._thread.is_alive(), \
            "the load's last request did not end within 30 s"


def settle(cluster: ThreadedCluster, ec2: Any, ids: list[str]) -> None:
    """Terminate everything, then check the ledgers are exactly empty again. A 503
    (a node still reconnecting after the fault answers late) is retried, as boto3's
    default retry mode does; the drills' clients retry nothing, to count every answer."""
    for i in range(0, len(ids), 100):
        for attempt in range(5):
            try:
                ec2.terminate_instances(InstanceIds=ids[i:i + 100])
                break
            except ClientError as exc:
                if exc.response["Error"]["Code"] != "ServiceUnavailable" or attempt == 4:
                    raise
                time.sleep(1.0)
    for iid in ids:
        wait_state(ec2, iid, "terminated", timeout=30)
    wait_until("capacity given back", lambda: not any(cluster.allocations().values()), 10, 0.1,
               detail=lambda: f"leaked capacity: {cluster.allocations()}")


def test_nats_killed_and_restarted_under_load(fcluster: ThreadedCluster) -> None:
    ec2 = fcluster.client()
    server = fcluster.nats.server
    with Load(fcluster) as load:
        time.sleep(2.0)
        before = load.outcomes["ok"]
        server.kill()
        killed = time.monotonic()
        time.sleep(2.0)
        server.start()
        restarted = time.monotonic()
        wait_for("a launch succeeds after the restart",
                 lambda: load.ok_times and load.ok_times[-1] >= restarted, 30,
                 lambda: f"outcomes {dict(load.outcomes)}")
        recovered = load.ok_times[-1] - restarted
        time.sleep(1.0)
    print(f"\nNATS down {restarted - killed:.1f} s; first launch after restart "
          f"{recovered:.2f} s later; outcomes {dict(load.outcomes)} {load.messages}")
    assert before > 0
    # Only "unavailable" while the bus was down: never a capacity answer, never a 500.
    refused = {k for k in load.outcomes if k not in ("ok",)}
    assert refused <= {"ServiceUnavailable", "terminate:ServiceUnavailable", "connection"}
    # No duplicates, nothing lost: every token launched one instance, still describable.
    ids = list(load.launched.values())
    assert len(set(ids)) == len(ids)
    described = {i["InstanceId"] for r in ec2.describe_instances()["Reservations"]
                 for i in r["Instances"]}
    assert set(ids) <= described
    settle(fcluster, ec2, ids)


def test_kv_writes_failing_during_launches(fcluster: ThreadedCluster) -> None:
    ec2 = fcluster.client()

    async def drop_bucket() -> None:
        await fcluster.cluster.nodes[0]._nc.jetstream().delete_key_value(  # type: ignore[union-attr]
            subjects.INSTANCES_BUCKET)

    async def bring_back() -> None:
        nc = fcluster.cluster.nodes[0]._nc
        assert nc is not None
        await key_value(nc, subjects.INSTANCES_BUCKET)

    fcluster.run(drop_bucket())
    ids = []
    for _ in range(20):  # every node's KV put fails meanwhile; launches still answer
        out = ec2.run_instances(ImageId=IMAGE, InstanceType="t3.micro", MinCount=1, MaxCount=1)
        ids.append(out["Instances"][0]["InstanceId"])
    nodes = fcluster.cluster.nodes
    assert sum(len(n._unpublished) for n in nodes) == len(ids)  # held in the outbox
    fcluster.run(bring_back())
    started = time.monotonic()
    published = wait_for("records reach the bucket",
                         lambda: not any(n._unpublished for n in nodes), 20)
    # The gateways' mirror follows the new bucket at once (it re-watches on JetStream's
    # stream-created advisory): every instance shows as running.
    for iid in ids:
        wait_state(ec2, iid, "running", timeout=20)
    mirrored = time.monotonic() - started
    assert mirrored < 10, f"the gateway took {mirrored:.1f} s to follow the new bucket"
    print(f"\nrecords back in the bucket {published:.2f} s after it was; gateway "
          f"describes them all running {time.monotonic() - started:.2f} s after")

    async def keys() -> set[str]:
        nc = nodes[0]._nc
        assert nc is not None
        kv = await key_value(nc, subjects.INSTANCES_BUCKET)
        return set(await live_entries(kv, timeout=30))

    assert set(ids) <= fcluster.run(keys())
    settle(fcluster, ec2, ids)


# --- node agents as processes --------------------------------------------------------

class NodeProcs:
    """``roost node`` agents as child processes (sim driver, 0.5 s heartbeat), each
    killed or stopped by its pid."""

    def __init__(self, cluster: ThreadedCluster, base: Path) -> None:
        self.url = cluster.nats.url
        self.base = base
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, node_id: str) -> None:
        with (self.base / f"{node_id}.log").open("ab") as log:
            self.procs[node_id] = subprocess.Popen(
                [sys.executable, "-m", "roost", "node", "--nats", self.url, "--node-id",
                 node_id, "--data-dir", str(self.base / node_id), "--capacity",
                 "1024vcpu,4TiB", "--reserve", "0vcpu,0GiB", "--driver", "sim",
                 "--heartbeat-seconds", "0.5", "--stop-grace-seconds", "1"],
                stdout=log, stderr=log)

    def kill(self, node_id: str) -> None:
        proc = self.procs.pop(node_id)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.procs.clear()


@pytest.fixture(scope="module")
def pcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ThreadedCluster,
                                                                         NodeProcs]]:
    """A gateway (in this process) and NATS, with three node agents as processes. Shared
    by the node drills (each leaves every node running and holding nothing)."""
    tmp = tmp_path_factory.mktemp("pfaults")
    c = make_cluster(tmp, nodes=0)
    procs = NodeProcs(c, tmp)
    try:
        for node_id in ("p1", "p2", "p3"):
            procs.start(node_id)
        c.wait_nodes(3, timeout=30)
        yield c, procs
    finally:
        procs.stop()
        c.stop()


def view(cluster: ThreadedCluster) -> Any:
    service = cluster.cluster.gateway.service
    assert service is not None
    return service.view


def wait_for(what: str, check: Callable[[], object], timeout: float,
             detail: Callable[[], object] | None = None) -> float:
    """``wait_until``, timed: the seconds it took. ``detail`` says what was seen,
    should it never come."""
    started = time.monotonic()
    wait_until(what, check, timeout, detail=detail)
    return time.monotonic() - started


def statuses(ec2: Any, ids: list[str]) -> dict[str, str]:
    out = ec2.describe_instance_status(InstanceIds=ids, IncludeAllInstances=True)
    return {s["InstanceId"]: s["SystemStatus"]["Status"] for s in out["InstanceStatuses"]}


def held_by_nodes(cluster: ThreadedCluster) -> dict[str, int]:
    """Instances each live node's last snapshot says it holds."""
    return {n.snap.node_id: n.snap.instances for n in view(cluster).status() if n.live}


def settle_procs(cluster: ThreadedCluster, ec2: Any, ids: list[str]) -> None:
    """Terminate everything; then every node's snapshot must say it holds nothing."""
    for i in range(0, len(ids), 100):
        ec2.terminate_instances(InstanceIds=ids[i:i + 100])
    for iid in ids:
        wait_state(ec2, iid, "terminated", timeout=30)
    wait_for("capacity given back", lambda: not any(held_by_nodes(cluster).values()), 10)


def described(ec2: Any) -> list[dict[str, Any]]:
    return [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]]


def no_duplicates(ec2: Any) -> None:
    """No ClientToken has two instances: a launch retried elsewhere never ran twice."""
    tokens = Counter(i.get("ClientToken") for i in described(ec2) if i.get("ClientToken"))
    assert [t for t, n in tokens.items() if n > 1] == []


def test_node_killed_mid_burst_and_back(pcluster: tuple[ThreadedCluster, NodeProcs]) -> None:
    cluster, procs = pcluster
    ec2 = cluster.client()
    with Load(cluster) as load:
        time.sleep(1.5)
        wait_for("launches", lambda: load.launched, 20)
        # The node placement has put most of the burst on (a packing policy fills one).
        homes = Counter(r.node_id for r in map(cluster.record, list(load.launched.values()))
                        if r is not None)
        victim = homes.most_common(1)[0][0]
        procs.kill(victim)
        killed = time.monotonic()
        on_victim = []
        for iid in list(load.launched.values()):
            rec = cluster.record(iid)
            if rec is not None and rec.node_id == victim and rec.state == "running":
                on_victim.append(iid)
        assert on_victim, f"the burst put nothing on {victim}"
        impaired = wait_for("the victim's instances impaired", lambda: set(
            statuses(ec2, on_victim).values()) == {"impaired"}, 10)
        doomed, kept = on_victim[:3], on_victim[3:]
        out = ec2.terminate_instances(InstanceIds=doomed)["TerminatingInstances"]
        assert {c["CurrentState"]["Name"] for c in out} == {"shutting-down"}
        time.sleep(1.0)
        procs.start(victim)
        restarted = time.monotonic()
        back = wait_for(f"{victim} back", lambda: not view(cluster).lost(victim), 30)
        wait_for("deferred terminations carried out", lambda: all(
            cluster.record(i) is not None and cluster.record(i).state == "terminated"  # type: ignore[union-attr]
            for i in doomed), 10)
        done = time.monotonic() - restarted
        assert set(statuses(ec2, kept).values()) <= {"ok"}
        time.sleep(1.0)
    print(f"\n{victim} killed with {len(on_victim)} instances: impaired after {impaired:.2f} s; "
          f"restarted, live again {back:.2f} s and its {len(doomed)} deferred terminations "
          f"done {done:.2f} s after; outcomes {dict(load.outcomes)} {load.messages}")
    refused = {k for k in load.outcomes if k != "ok"}
    assert refused <= {"ServiceUnavailable", "terminate:ServiceUnavailable", "connection"}
    ids = list(load.launched.values())
    assert len(set(ids)) == len(ids)
    alive = {i["InstanceId"] for i in described(ec2)}
    assert set(ids) <= alive  # nothing lost
    no_duplicates(ec2)
    settle_procs(cluster, ec2, [i for i in ids if i not in doomed])
    assert time.monotonic() - killed < 60


def test_node_frozen_then_thawed_carries_out_what_was_ordered_meanwhile(
        pcluster: tuple[ThreadedCluster, NodeProcs]) -> None:
    """A node agent SIGSTOP'd past the lost threshold comes back without a restart: the
    gap in its heartbeat makes it read its orders, so a terminate given while it was
    lost is carried out then, not at its next restart."""
    cluster, procs = pcluster
    ec2 = cluster.client()
    iid = ec2.run_instances(ImageId=IMAGE, InstanceType="t3.nano", MinCount=1,
                            MaxCount=1)["Instances"][0]["InstanceId"]
    wait_for("the record mirrored", lambda: cluster.record(iid) is not None, 10)
    node = cluster.record(iid).node_id  # type: ignore[union-attr]
    pid = procs.procs[node].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(f"{node} lost", lambda: statuses(ec2, [iid]) == {iid: "impaired"}, 10)
        out = ec2.terminate_instances(InstanceIds=[iid])["TerminatingInstances"]
        assert out[0]["CurrentState"]["Name"] == "shutting-down"
    finally:
        os.kill(pid, signal.SIGCONT)
    thawed = wait_for("the ordered termination carried out after the thaw", lambda: (
        (rec := cluster.record(iid)) is not None and rec.state == "terminated"), 15)
    print(f"\n{node} thawed: the terminate ordered while it was lost done {thawed:.2f} s later")
    wait_for(f"{node} live again", lambda: not view(cluster).lost(node), 10)


def test_node_gone_for_good_is_forgotten(
        pcluster: tuple[ThreadedCluster, NodeProcs]) -> None:
    cluster, procs = pcluster
    ec2 = cluster.client()
    out = ec2.run_instances(ImageId=IMAGE, InstanceType="t3.micro", MinCount=30, MaxCount=30)
    ids = [i["InstanceId"] for i in out["Instances"]]
    homes = Counter(cluster.record(i).node_id for i in ids)  # type: ignore[union-attr]
    gone = homes.most_common(1)[0][0]
    on_gone = [i for i in ids if cluster.record(i).node_id == gone]  # type: ignore[union-attr]
    alive = subprocess.run([sys.executable, "-m", "roost", "node", "--nats", procs.url,
                            "forget", gone, "--listen", "1.5"], capture_output=True, text=True)
    assert alive.returncode != 0 and "is alive" in alive.stderr  # a live node is refused
    procs.kill(gone)
    wait_for("lost", lambda: view(cluster).lost(gone), 10)
    started = time.monotonic()
    forgot = subprocess.run([sys.executable, "-m", "roost", "node", "--nats", procs.url,
                             "forget", gone, "--listen", "1.5"], capture_output=True, text=True)
    assert forgot.returncode == 0, forgot.stderr
    assert f"{len(on_gone)} instances marked terminated" in forgot.stdout
    wait_for("its instances terminated", lambda: all(
        cluster.record(i).state == "terminated" for i in on_gone), 10)  # type: ignore[union-attr]
    took = time.monotonic() - started
    rec = cluster.record(on_gone[0])
    assert rec is not None and rec.state_reason == "Server.InternalError"
    assert "declared lost" in rec.state_transition_reason
    assert gone not in {n.snap.node_id for n in view(cluster).status()}
    # The cluster carries on: a new burst fits on the two nodes left, no false ICE.
    more = ec2.run_instances(ImageId=IMAGE, InstanceType="t3.micro", MinCount=30, MaxCount=30)
    more_ids = [i["InstanceId"] for i in more["Instances"]]
    assert {cluster.record(i).node_id for i in more_ids} <= {"p1", "p2", "p3"} - {gone}  # type: ignore[union-attr]
    # The host comes back after all: its agent terminates what survived and rejoins
    # holding nothing, so the forgotten instances never run again.
    procs.start(gone)
    wait_for("rejoins empty", lambda: held_by_nodes(cluster).get(gone) == 0, 30)
    print(f"\nforget of {gone} ({len(on_gone)} instances): terminated everywhere {took:.2f} s "
          f"after the command started (incl. 1.5 s listening and Python start-up)")
    survivors = [i for i in ids + more_ids if i not in on_gone]
    settle_procs(cluster, ec2, survivors)
    assert all(cluster.record(i).state == "terminated" for i in on_gone)  # type: ignore[union-attr]


def test_gateway_killed_mid_launch_token_retried_elsewhere(
        fcluster: ThreadedCluster, tmp_path: Path) -> None:
    """A RunInstances of 400 with a ClientToken, its gateway process killed halfway; the
    same request sent to a second gateway (the in-process one) takes the claim over once
    it has gone quiet for a lease, finds the launches already placed by their launch
    ids, places the rest, and answers with the first reservation: 400 instances, once."""
    port = free_port()
    with (tmp_path / "gateway.log").open("ab") as log:
        first = subprocess.Popen(
            [sys.executable, "-m", "roost", "gateway", "--nats", fcluster.nats.url,
             "--port", str(port), "--credentials", f"{fcluster.key}:{fcluster.secret}"],
            stdout=log, stderr=log)
    try:
        endpoint = f"http://127.0.0.1:{port}"
        ec2_first = boto3.client(
            "ec2", endpoint_url=endpoint, region_name=fcluster.spec.region,
            aws_access_key_id=fcluster.key, aws_secret_access_key=fcluster.secret,
            config=Config(retries={"total_max_attempts": 1}, read_timeout=120))
        wait_for("the gateway process serves", lambda: _serves(ec2_first), 30)
        token, count = "gateway-kill-1", 400
        request = {"ImageId": IMAGE, "InstanceType": "t3.nano", "MinCount": count,
                   "MaxCount": count, "ClientToken": token}
        answered: list[Any] = []
        sender = threading.Thread(target=lambda: answered.append(_try(ec2_first, request)),
                                  daemon=True)
        sender.start()
        index = fcluster.cluster.gateway.service.index  # type: ignore[union-attr]

        def placed() -> int:  # read on the loop, which goes on adding records
            return fcluster.read(lambda: sum(r.client_token == token for r in index.all()))

        wait_for("launches under way", lambda: placed() > 0, 20)
        os.kill(first.pid, signal.SIGKILL)
        killed = time.monotonic()
        seen = placed()
        first.wait(10)
        sender.join(30)
        ec2 = fcluster.client()
        out = ec2.run_instances(**request)
        took = time.monotonic() - killed
        ids = [i["InstanceId"] for i in out["Instances"]]
        print(f"\ngateway killed with {seen} of {count} launches seen placed; the retry "
              f"on the other gateway answered {len(ids)} in {took:.2f} s (claim lease 10 s)")
        assert 0 < seen < count, "the kill did not land mid-launch"
        assert len(ids) == count and len(set(ids)) == count
        mine = [i for i in described(ec2) if i.get("ClientToken") == token]
        assert sorted(i["InstanceId"] for i in mine) == sorted(ids)  # none launched twice
        assert took < 30
        again = ec2.run_instances(**request)  # and a further retry replays it
        assert sorted(i["InstanceId"] for i in again["Instances"]) == sorted(ids)
        assert again["ReservationId"] == out["ReservationId"]
        settle(fcluster, ec2, ids)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)


def _serves(ec2: Any) -> bool:
    try:
        ec2.describe_availability_zones()
    except (EndpointConnectionError, ClientError):
        return False
    return True


def _try(ec2: Any, request: dict[str, Any]) -> Any:
    try:
        return ec2.run_instances(**request)
    except Exception as exc:  # the gateway dies under it: any failure will do
        return exc


def test_one_server_of_a_nats_cluster_killed_under_load(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """The server the gateway is connected to is killed for good. The buckets are
    replicated to all three servers (`key_value`), so what remains keeps quorum;
    the gateway and the nodes on that server reconnect to the others."""
    with NatsCluster(3, base_dir=tmp_path_factory.mktemp("nats-cluster")) as nats:
        cluster = make_cluster(tmp_path_factory.mktemp("on-cluster"), nodes=3,
                               capacity="1024vcpu,4TiB", nats_urls=nats.urls)
        try:
            ec2 = cluster.client()
            gw_nc = cluster.cluster.gateway._nc
            assert gw_nc is not None and gw_nc.connected_url is not None
            port = gw_nc.connected_url.port
            victim = next(s for s in nats.servers if s.url.endswith(f":{port}"))
            with Load(cluster) as load:
                time.sleep(2.0)
                before = load.outcomes["ok"]
                victim.kill()
                killed = time.monotonic()
                time.sleep(1.0)

                recovery: list[float] = []  # seconds from the kill to the recovery

                def recovered_for_good() -> bool:
                    """A launch succeeded after the last refusal, and none came for
                    1.5 s: a bucket whose stream leader was on the killed server may
                    answer its first request late, after others have succeeded. Read
                    from copies: the load thread goes on appending, and the launch in
                    flight when it stops may still be refused late (that answer is
                    counted in the outcomes checked below)."""
                    oks, last = list(load.ok_times), max([killed, *load.failed_times])
                    if oks and oks[-1] > last and time.monotonic() - last > 1.5:
                        recovery.append(min(t for t in oks if t > last) - killed)
                        return True
                    return False

                def seen() -> str:
                    after = [round(x - killed, 2) for x in load.ok_times if x > killed]
                    fails = [round(x - killed, 2) for x in load.failed_times if x > killed]
                    return (f"outcomes {dict(load.outcomes)} {load.messages}; seconds after "
                            f"the kill of the launches that succeeded {after[:5]}..."
                            f"{after[-5:]}, that failed {fails[:5]}...{fails[-5:]}")

                wait_for("launches succeed again", recovered_for_good, 30, seen)
            recovered = recovery[0]
            print(f"\nNATS server {victim.name} (the gateway's) killed: launches succeed "
                  f"again {recovered:.2f} s after; outcomes {dict(load.outcomes)} {load.messages}")
            assert before > 0
            refused = {k for k in load.outcomes if k != "ok"}
            assert refused <= {"ServiceUnavailable", "terminate:ServiceUnavailable",
                               "connection"}
            ids = list(load.launched.values())
            assert len(set(ids)) == len(ids)
            assert set(ids) <= {i["InstanceId"] for i in described(ec2)}
            no_duplicates(ec2)
            settle(cluster, ec2, ids)
        finally:
            cluster.stop()


def test_churn_smoke_restores_capacity_exactly(fcluster: ThreadedCluster) -> None:
    signer = Signer(fcluster.endpoint, fcluster.key, fcluster.secret, fcluster.spec.region)
    started = time.monotonic()
    # The client runs on a loop of its own, not on the cluster's.
    rows = asyncio.run(churn(signer, pairs=100, concurrency=8, chunk=50))
    cap = asyncio.run(settled_capacity(fcluster.endpoint, fcluster.key, fcluster.secret,
                                       fcluster.spec.region))
    print(f"\nchurn of 100 pairs: {[r.pairs_per_second for r in rows]} pairs/s per chunk, "
          f"{time.monotonic() - started:.1f} s; capacity after: {cap}")
    assert [r.errors for r in rows] == [0, 0]
    assert cap.restored and cap.nodes == 3, cap
