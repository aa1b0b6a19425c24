"""How far pools may grow: node memory and CPU headroom and the database connection budget.

Caps bound *growth* only. A pool already past a cap is not shrunk by it: shrinking is
demand's job and goes through a drain, so a cap never kills in-flight work. Pools that
share nodes, and every pool, share the database budget, so growth is handed out one
replica per pool per round (pool ids in order) until each pool has what it asked for or
hits a cap. That is fair between pools and deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from roost.decide.snapshot import DbHealth, NodeFigures, PlanSettings

# Reasons growth stopped short, in the order they are checked.
DB_BUDGET = "db_budget"
NO_NODES = "no_nodes"
MEMORY_TARGET = "memory_target"
CPU_TARGET = "cpu_target"
MEMORY_PRESSURE = "memory_pressure"
NODE_FIT = "node_fit"
MEMORY_HARD = "memory_hard"


def db_worker_budget(db: DbHealth, settings: PlanSettings) -> int:
    """Connections all workers of all pools may hold together.

    ``total - non-worker - sync peers x per-peer``. The total is the server's
    max_connections less its reserved slots unless the operator gives one (a pooler in
    front changes it). Each synchronous replication peer holds connections on the
    primary (its walsender, plus the HA manager's), and they must never be the ones a
    worker pool takes, or replication stalls and every commit with it.
    """
    total = settings.db_total_connections
    if total is None:
        total = db.max_connections - db.reserved_connections
    peers = max(db.sync_peers, settings.db_expected_sync_peers)
    replication = peers * settings.db_connections_per_sync_peer
    return total - settings.db_non_worker_connections - replication


@dataclass(frozen=True, slots=True)
class GrowthAsk:
    pool_id: str
    want: int
    worker_cpu_milli: int
    worker_mem_mib: int
    db_pool_size: int
    nodes: tuple[NodeFigures, ...]


@dataclass(frozen=True, slots=True)
class Growth:
    granted: int
    capped_by: tuple[str, ...] = ()


class _Node:
    """A node's figures while growth is handed out: placements add to ``used``."""

    __slots__ = ("alloc_cpu", "alloc_mem", "node_id", "pressure", "used_cpu", "used_mem")

    def __init__(self, n: NodeFigures) -> None:
        self.node_id = n.node_id
        self.alloc_cpu = n.allocatable_cpu_milli
        self.alloc_mem = n.allocatable_mem_mib
        self.used_cpu = n.used_cpu_milli
        self.used_mem = n.used_mem_mib
        self.pressure = n.memory_pressure


def _place(ask: GrowthAsk, nodes: list[_Node], settings: PlanSettings) -> tuple[str, ...]:
    """Place one more worker of ``ask`` on ``nodes``; return why not, or () on success."""
    if not nodes:
        return (NO_NODES,)
    cpu, mem = ask.worker_cpu_milli, ask.worker_mem_mib
    alloc_mem = sum(n.alloc_mem for n in nodes)
    alloc_cpu = sum(n.alloc_cpu for n in nodes)
    if (sum(n.used_mem for n in nodes) + mem) * 100 > settings.memory_target_percent * alloc_mem:
        return (MEMORY_TARGET,)
    if (sum(n.used_cpu for n in nodes) + cpu) * 100 > settings.cpu_target_percent * alloc_cpu:
        return (CPU_TARGET,)
    best: _Node | None = None
    reasons: set[str] = set()
    for n in nodes:
        if n.pressure:
            reasons.add(MEMORY_PRESSURE)
        elif cpu > n.alloc_cpu - n.used_cpu or mem > n.alloc_mem - n.used_mem:
            reasons.add(NODE_FIT)
        elif (n.used_mem + mem) * 100 > settings.memory_hard_percent * n.alloc_mem:
            reasons.add(MEMORY_HARD)
        elif best is None or (n.alloc_mem - n.used_mem, best.node_id) > (
            best.alloc_mem - best.used_mem, n.node_id
        ):
            # The orchestrator's scheduler picks the real node; the emptiest one is a
            # fair guess (the spread most schedulers default to) and keeps this estimate
            # from over-promising on any single node.
            best = n
    if best is None:
        return tuple(sorted(reasons))
    best.used_cpu += cpu
    best.used_mem += mem
    return ()


def allocate_growth(
    asks: Sequence[GrowthAsk], *, db_room: int, settings: PlanSettings
) -> dict[str, Growth]:
    """Hand out growth to ``asks`` within node headroom and ``db_room`` connections.

    ``db_room`` is the worker budget less what every pool's current replicas hold; it
    may be negative, and then only pools whose workers open no connections can grow.
    """
    shared: dict[str, _Node] = {}
    pool_nodes: dict[str, list[_Node]] = {}
    for ask in asks:
        pool_nodes[ask.pool_id] = [
            shared.setdefault(n.node_id, _Node(n)) for n in ask.nodes
        ]
    granted = {ask.pool_id: 0 for ask in asks}
    capped: dict[str, tuple[str, ...]] = {}
    active = sorted((a for a in asks if a.want > 0), key=lambda a: a.pool_id)
    room = db_room
    while active:
        still: list[GrowthAsk] = []
        for ask in active:
            why: tuple[str, ...]
            if ask.db_pool_size > room:
                why = (DB_BUDGET,)
            else:
                why = _place(ask, pool_nodes[ask.pool_id], settings)
            if why:
                capped[ask.pool_id] = why
                continue
            room -= ask.db_pool_size
            granted[ask.pool_id] += 1
            if granted[ask.pool_id] < ask.want:
                still.append(ask)
        active = still
    return {pid: Growth(n, capped.get(pid, ())) for pid, n in granted.items()}
