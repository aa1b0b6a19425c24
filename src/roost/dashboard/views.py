"""Each page's numbers, from a state, the history and the query string: plain dicts the
templates read. No HTTP here, so tests and the benchmark call these directly."""

from __future__ import annotations

import itertools
import math
import operator
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from roost.bus.schemas import InstanceRecord
from roost.dashboard import fmt
from roost.dashboard.history import History
from roost.dashboard.model import (
    ClusterState,
    NodeState,
    capacity,
    fits_now,
    gpu_strips,
    instance_counts,
    node_counts,
)
from roost.domain.catalog import BUILTIN

PAGE_SIZE = 50


@dataclass(frozen=True, slots=True)
class Page:
    number: int
    pages: int
    total: int
    first: int  # 1-based index of the first row shown, 0 when empty
    last: int


def paginate(total: int, page: int, size: int = PAGE_SIZE) -> tuple[Page, slice]:
    pages = max(1, math.ceil(total / size))
    number = min(max(1, page), pages)
    start = (number - 1) * size
    stop = min(total, start + size)
    return Page(number, pages, total, start + 1 if total else 0, stop), slice(start, stop)


def _int(q: Mapping[str, str], key: str, default: int = 1) -> int:
    try:
        return int(q.get(key, default))
    except ValueError:
        return default


def controller_summary(state: ClusterState) -> dict[str, Any]:
    doc = state.controller
    if doc is None:
        return {"reachable": False, "error": state.controller_error}
    return {
        "reachable": True,
        "leader": bool(doc.get("leader")),
        "holder": doc.get("holder") or fmt.NONE,
        "epoch": doc.get("epoch"),
        "shadow": bool(doc.get("shadow")),
        "ready": bool(doc.get("ready")),
        "last_tick": fmt.iso_age(doc.get("lastRunAt"), state.at),
        "last_error": doc.get("lastError") or "",
        "lost_reason": doc.get("lostLeadershipReason") or "",
    }


def overview(state: ClusterState, history: History) -> dict[str, Any]:
    cap = capacity(state.nodes)
    per_min, errors_per_min, p99 = history.launch_rates()
    return {
        "cap": cap,
        "cpu_pct": fmt.pct(cap.cpu_used, cap.cpu_alloc),
        "mem_pct": fmt.pct(cap.mem_used, cap.mem_alloc),
        "gpu_pct": fmt.pct(cap.gpu_used, cap.gpu_total),
        "stranded_pct": fmt.pct(cap.gpu_stranded, cap.gpu_total),
        "nodes": node_counts(state.nodes),
        "instances": instance_counts(state.instances.values()),
        "instances_total": len(state.instances),
        "launches_per_min": per_min,
        "errors_per_min": errors_per_min,
        "p99": p99,
        "launch_totals": state.launches,
        "controller": controller_summary(state),
    }


def _node_row(n: NodeState) -> dict[str, Any]:
    s = n.snap
    cpu_used = s.alloc_cpu_milli - s.free_cpu_milli
    mem_used = s.alloc_mem_mib - s.free_mem_mib
    return {
        "id": s.node_id, "zone": s.availability_zone, "status": n.status,
        "age": n.age_seconds, "heartbeat": s.heartbeat_seconds,
        "cpu_used": cpu_used, "cpu_alloc": s.alloc_cpu_milli,
        "cpu_pct": fmt.pct_num(cpu_used, s.alloc_cpu_milli),
        "mem_used": mem_used, "mem_alloc": s.alloc_mem_mib,
        "mem_pct": fmt.pct_num(mem_used, s.alloc_mem_mib),
        "gpus": gpu_strips(s, BUILTIN),
        "fit": sorted(((t, c) for t, c in s.fit.items() if c > 0), key=lambda x: (-x[1], x[0])),
        "instances": s.instances,
        "isolation": s.isolation or "unreported",
        "isolation_note": s.isolation_note,
    }


def nodes(state: ClusterState, q: Mapping[str, str]) -> dict[str, Any]:
    want = q.get("status", "")
    rows = [n for n in state.nodes if not want or n.status == want]
    rows.sort(key=lambda n: n.snap.node_id)
    page, cut = paginate(len(rows), _int(q, "page"))
    return {"rows": [_node_row(n) for n in rows[cut]], "page": page,
            "counts": node_counts(state.nodes), "status": want}


_HAYSTACKS: dict[str, tuple[InstanceRecord, str]] = {}
"""Instance id -> (the record, its searchable text, lower-case): made once per record
version, so a text search over 100,000 instances is a dict lookup and a substring test
each."""


def _haystack(r: InstanceRecord) -> str:
    found = _HAYSTACKS.get(r.instance_id)
    if found is not None and found[0] is r:
        return found[1]
    hay = "\n".join((r.instance_id, r.instance_type, r.node_id, r.private_ip, r.state,
                     *(f"{k}={v}" for k, v in r.tags.items()))).lower()
    _HAYSTACKS[r.instance_id] = (r, hay)
    return hay


def _matches(r: InstanceRecord, *, state: str, itype: str, node: str, tag: str,
             text: str) -> bool:
    """``text`` is lower-case already."""
    if state and r.state != state:
        return False
    if itype and r.instance_type != itype:
        return False
    if node and r.node_id != node:
        return False
    if tag:
        key, sep, value = tag.partition("=")
        if key not in r.tags or (sep and r.tags[key] != value):
            return False
    return not text or text in _haystack(r)


def describe_command(endpoint: str, filters: Mapping[str, str]) -> str:
    """The AWS CLI command that lists what the instance table shows (the node filter has
    no EC2 equivalent and is left out)."""
    parts = ["aws", "ec2", "describe-instances", "--endpoint-url", endpoint]
    f = []
    if filters.get("state"):
        f.append(f"Name=instance-state-name,Values={filters['state']}")
    if filters.get("type"):
        f.append(f"Name=instance-type,Values={filters['type']}")
    if filters.get("tag"):
        key, sep, value = filters["tag"].partition("=")
        f.append(f"Name=tag:{key},Values={value}" if sep else f"Name=tag-key,Values={key}")
    if f:
        parts += ["--filters", *f]
    return shlex.join(parts)


_NEWEST = operator.attrgetter("launch_time", "instance_id")


def instances(state: ClusterState, q: Mapping[str, str], *, endpoint: str) -> dict[str, Any]:
    filters = {k: q.get(k, "").strip() for k in ("state", "type", "node", "tag", "q")}
    needle = filters["q"].lower()
    if len(_HAYSTACKS) > 2 * len(state.instances) + 1000:
        _HAYSTACKS.clear()  # records gone from the index
    if any(filters.values()):
        recs = [r for r in state.instances.values()
                if _matches(r, state=filters["state"], itype=filters["type"],
                            node=filters["node"], tag=filters["tag"], text=needle)]
    else:
        recs = list(state.instances.values())
    page, cut = paginate(len(recs), _int(q, "page"))
    # Newest first (ISO stamps sort as text). Records arrive roughly in launch order,
    # which timsort takes in near-linear time.
    shown = sorted(recs, key=_NEWEST, reverse=True)[cut]
    counts = instance_counts(state.instances.values())
    return {
        "rows": shown, "page": page, "filters": filters,
        "states": list(counts),
        "types": sorted({r.instance_type for r in state.instances.values()}),
        "node_ids": sorted(n.snap.node_id for n in state.nodes),
        "command": describe_command(endpoint, filters),
        "query": {k: v for k, v in filters.items() if v},
    }


def instance(state: ClusterState, history: History, instance_id: str, *,
             endpoint: str) -> dict[str, Any] | None:
    r = state.instances.get(instance_id)
    if r is None:
        return None
    return {
        "r": r,
        "events": history.instance_events(instance_id),
        "command": shlex.join(["aws", "ec2", "describe-instances", "--endpoint-url",
                               endpoint, "--instance-ids", instance_id]),
        "console_command": shlex.join(["aws", "ec2", "get-console-output", "--endpoint-url",
                                       endpoint, "--instance-id", instance_id, "--output",
                                       "text"]),
    }


def placement(state: ClusterState) -> dict[str, Any]:
    fits = fits_now(state.nodes)
    rows = []
    for name, t in BUILTIN.items():
        if name in fits:
            rows.append({"type": name, "vcpu": t.cpu_milli, "mem": t.mem_mib,
                         "gpu": t.gpu_total_milli, "fits": fits.pop(name)})
    rows += [{"type": name, "vcpu": None, "mem": None, "gpu": None, "fits": c}
             for name, c in sorted(fits.items())]
    cap = capacity(state.nodes)
    attempts = sorted((state.launches.attempts if state.launches else {}).items())
    return {"rows": rows, "cap": cap,
            "stranded_pct": fmt.pct(cap.gpu_stranded, cap.gpu_total),
            "attempts": [{"route": r, "outcome": o, "count": int(c)}
                         for (r, o), c in attempts]}


def pools(state: ClusterState) -> dict[str, Any]:
    doc = state.controller or {}
    plan = doc.get("plan") or {}
    queue = doc.get("queue") or {}
    actions = list(doc.get("scaleActions") or [])
    out = []
    for pid in sorted(set(plan.get("pools") or {}) | set(queue)):
        p = (plan.get("pools") or {}).get(pid) or {}
        qd = queue.get(pid) or {}
        out.append({
            "id": pid, "queued": qd.get("queued", 0), "running": qd.get("running", 0),
            "desired": p.get("desiredReplicas"), "current": p.get("currentReplicas"),
            "raw": p.get("rawDesired"), "reason": p.get("reason", ""),
            "frozen": p.get("frozenReason"), "action": p.get("action", ""),
            "capped_by": p.get("cappedBy") or [], "steps": p.get("steps") or [],
            "actions": [a for a in actions if a.get("pool") == pid][:50],
        })
    return {
        "controller": controller_summary(state), "pools": out,
        "plan_source": plan.get("source"), "plan_at": fmt.iso_age(plan.get("at"), state.at),
        "db_budget": plan.get("dbWorkerBudget"), "db_used": plan.get("dbConnectionsUsed"),
        "shadow": bool(doc.get("shadow")),
    }


def events(history: History, q: Mapping[str, str]) -> dict[str, Any]:
    kind = q.get("kind", "")
    text = q.get("q", "").strip().lower()
    rows = [e for e in history.events
            if (not kind or e.kind == kind) and (not text or text in e.text.lower())]
    page, cut = paginate(len(rows), _int(q, "page"), size=100)
    return {"rows": rows[cut], "page": page, "kind": kind, "q": q.get("q", ""),
            "kinds": ("instance", "node", "controller", "scale"),
            "query": {k: v for k, v in (("kind", kind), ("q", q.get("q", ""))) if v}}


def chart_series(history: History) -> dict[str, Any]:
    """The history as columns for uPlot: times first, then one list per series."""
    s = list(history.samples)
    pools: dict[str, dict[str, list[int | None]]] = {}
    for i, x in enumerate(s):
        for pid, ps in x.pools.items():
            col = pools.get(pid)
            if col is None:
                col = pools[pid] = {"demand": [None] * len(s), "desired": [None] * len(s),
                                    "current": [None] * len(s)}
            col["demand"][i], col["desired"][i], col["current"][i] = (
                ps.demand, ps.desired, ps.current)
    launches: list[float | None] = [None]
    for a, b in itertools.pairwise(s):
        span = (b.at - a.at) / 60.0
        launches.append(round((b.launched - a.launched) / span, 2) if span > 0 else None)
    return {
        "t": [round(x.at, 3) for x in s],
        "cpu": [fmt.pct_num(x.cpu_used, x.cpu_alloc) for x in s],
        "mem": [fmt.pct_num(x.mem_used, x.mem_alloc) for x in s],
        "gpu": [fmt.pct_num(x.gpu_used, x.gpu_total) if x.gpu_total else None for x in s],
        "stranded": [fmt.pct_num(x.gpu_stranded, x.gpu_total) if x.gpu_total else None
                     for x in s],
        "active": [x.instances_active for x in s],
        "launches": launches[:len(s)],
        "pools": pools,
    }
