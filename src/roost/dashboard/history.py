"""A short in-process memory: one sample per tick for the charts, and an event log made
by comparing each state with the one before.

About an hour at 5 s (720 samples) so the charts work without Prometheus. The event log
merges what changed (instances, nodes, the controller's leadership and errors) with the
controller's own scale actions, newest first. Both are bounded deques: memory stays
flat however long the dashboard runs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from roost.bus.schemas import InstanceRecord
from roost.dashboard.model import (
    ClusterState,
    LaunchCounters,
    NodeState,
    bucket_delta,
    capacity,
    quantile,
)

HISTORY_SAMPLES = 720
EVENTS_KEPT = 5000


@dataclass(frozen=True, slots=True)
class PoolSample:
    demand: int  # queued + running tasks
    desired: int | None
    current: int | None


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    cpu_used: int
    cpu_alloc: int
    mem_used: int
    mem_alloc: int
    gpu_used: int
    gpu_total: int
    gpu_stranded: int
    instances_active: int
    launched: float
    insufficient: float
    launch_buckets: tuple[tuple[float, float], ...] = ()
    pools: Mapping[str, PoolSample] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Event:
    at: float
    kind: str  # "instance", "node", "controller", "scale"
    subject: str  # an instance id, a node id, a pool
    text: str


def _pools(doc: Mapping[str, Any] | None) -> dict[str, PoolSample]:
    if not doc:
        return {}
    plan = (doc.get("plan") or {}).get("pools") or {}
    queue = doc.get("queue") or {}
    out = {}
    for pid in sorted(set(plan) | set(queue)):
        q = queue.get(pid) or {}
        p = plan.get(pid) or {}
        out[pid] = PoolSample(int(q.get("queued", 0)) + int(q.get("running", 0)),
                              p.get("desiredReplicas"), p.get("currentReplicas"))
    return out


_ACTIVE = frozenset({"pending", "running", "stopping", "shutting-down"})


def sample(state: ClusterState) -> Sample:
    cap = capacity(state.nodes)
    lc = state.launches or LaunchCounters()
    active = sum(1 for r in state.instances.values() if r.state in _ACTIVE)
    return Sample(
        at=state.at, cpu_used=cap.cpu_used, cpu_alloc=cap.cpu_alloc, mem_used=cap.mem_used,
        mem_alloc=cap.mem_alloc, gpu_used=cap.gpu_used, gpu_total=cap.gpu_total,
        gpu_stranded=cap.gpu_stranded, instances_active=active, launched=lc.launched,
        insufficient=lc.insufficient_capacity, launch_buckets=lc.latency_buckets,
        pools=_pools(state.controller),
    )


def _parse_iso(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class History:
    def __init__(self, *, samples: int = HISTORY_SAMPLES, events: int = EVENTS_KEPT) -> None:
        self.samples: deque[Sample] = deque(maxlen=samples)
        self.events: deque[Event] = deque(maxlen=events)
        self._instances: dict[str, InstanceRecord] = {}
        self._nodes: dict[str, str] = {}
        self._controller: tuple[object, ...] | None = None
        self._actions_seen: set[tuple[str, str, str, str]] = set()
        self._first = True

    def record(self, state: ClusterState) -> Sample:
        s = sample(state)
        self.samples.append(s)
        self._diff(state)
        return s

    def _log(self, at: float, kind: str, subject: str, text: str) -> None:
        self.events.appendleft(Event(at, kind, subject, text))

    def _diff(self, state: ClusterState) -> None:
        at, first = state.at, self._first
        self._first = False
        self._diff_nodes(at, state.nodes, first)
        self._diff_instances(at, state.instances, first)
        self._diff_controller(at, state.controller, state.controller_error)

    def _diff_nodes(self, at: float, nodes: Iterable[NodeState], first: bool) -> None:
        seen: dict[str, str] = {}
        for n in nodes:
            nid = n.snap.node_id
            seen[nid] = n.status
            before = self._nodes.get(nid)
            if before is None:
                self._log(at, "node", nid, f"node {nid} joined ({n.status})" if not first
                          else f"node {nid} is {n.status}")
            elif before != n.status:
                self._log(at, "node", nid, f"node {nid}: {before} \u2192 {n.status}")
        for nid in self._nodes.keys() - seen.keys():
            self._log(at, "node", nid, f"node {nid} left the view (silent for 60 s)")
        self._nodes = seen

    def _diff_instances(self, at: float, instances: Mapping[str, InstanceRecord],
                        first: bool) -> None:
        old = self._instances
        for iid, r in instances.items():
            before = old.get(iid)
            if before is r:
                continue
            if before is None:
                if not first:
                    self._log(at, "instance", iid,
                              f"{iid} ({r.instance_type}) {r.state} on {r.node_id}")
            elif before.state != r.state:
                why = r.state_transition_reason or r.state_reason
                self._log(at, "instance", iid,
                          f"{iid} {before.state} \u2192 {r.state}{': ' + why if why else ''}")
        for iid in old.keys() - instances.keys():
            self._log(at, "instance", iid, f"{iid} expired from the instance index")
        self._instances = dict(instances)

    def _diff_controller(self, at: float, doc: Mapping[str, Any] | None, error: str) -> None:
        if doc is None:
            key: tuple[object, ...] = ("unreachable", error)
            if self._controller is not None and self._controller != key:
                self._log(at, "controller", "controller", f"controller unreachable: {error}")
            self._controller = key
            return
        key = (doc.get("leader"), doc.get("epoch"), doc.get("holder"), doc.get("lastError"))
        if self._controller != key:
            leader = "leader" if doc.get("leader") else "follower"
            text = f"controller {doc.get('holder', '?')}: {leader}, epoch {doc.get('epoch')}"
            if doc.get("lastError"):
                text += f"; last error: {doc['lastError']}"
            self._log(at, "controller", "controller", text)
        self._controller = key
        for a in reversed(list(doc.get("scaleActions") or [])):
            ident = (str(a.get("at")), str(a.get("pool")), str(a.get("kind")),
                     str(a.get("worker")))
            if ident in self._actions_seen:
                continue
            self._actions_seen.add(ident)
            when = _parse_iso(str(a.get("at", ""))) or at
            who = f" {a['worker']}" if a.get("worker") else ""
            n = f" to {a['replicas']}" if a.get("replicas") is not None else ""
            detail = f" ({a['detail']})" if a.get("detail") else ""
            self._log(when, "scale", str(a.get("pool")),
                      f"pool {a.get('pool')}: {a.get('kind')}{who}{n} \u2192 "
                      f"{a.get('outcome')}{detail}")
        if len(self._actions_seen) > 4 * EVENTS_KEPT:
            self._actions_seen.clear()

    # -- reading ---------------------------------------------------------------------

    def launch_rates(self, window: float = 60.0) -> tuple[float | None, float | None,
                                                         float | None]:
        """Launches per minute, capacity errors per minute and launch p99 (seconds) over
        the last ``window`` seconds of samples; None where there are too few."""
        if len(self.samples) < 2:
            return None, None, None
        last = self.samples[-1]
        first = last
        for s in reversed(self.samples):
            if last.at - s.at > window:
                break
            first = s
        if first is last:
            first = self.samples[-2]
        span = max(last.at - first.at, 1e-9) / 60.0
        p99 = quantile(bucket_delta(last.launch_buckets, first.launch_buckets), 0.99)
        return ((last.launched - first.launched) / span,
                (last.insufficient - first.insufficient) / span, p99)

    def instance_events(self, instance_id: str) -> list[Event]:
        return [e for e in self.events if e.subject == instance_id]
