"""Placement policies: given the live capacity view, which nodes to try, best first.

The gateway and `roost bench placement` call the same functions, so a benchmark figure
is a figure for the code that places real launches.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from roost.domain.catalog import InstanceType
from roost.domain.fit import FreeCapacity, fits
from roost.domain.resources import GPU_MILLI, Resources


@dataclass(frozen=True, slots=True)
class NodeView:
    """What placement knows of one node: its allocatable total and what is free now."""

    node_id: str
    allocatable: Resources
    free: FreeCapacity
    draining: bool = False

    @property
    def gpu_total_milli(self) -> int:
        return len(self.free.gpu_free) * GPU_MILLI


Scorer = Callable[[NodeView, InstanceType], float]
"""Higher is better. Only called for nodes that fit."""


def _used_share(node: NodeView, itype: InstanceType) -> float:
    """Mean share of CPU and memory (and GPU, when the node has GPUs) in use after
    placing ``itype``."""
    a, f = node.allocatable, node.free.resources
    shares = [
        1 - (f.cpu_milli - itype.cpu_milli) / a.cpu_milli if a.cpu_milli else 1.0,
        1 - (f.mem_mib - itype.mem_mib) / a.mem_mib if a.mem_mib else 1.0,
    ]
    if node.gpu_total_milli:
        free_gpu = sum(node.free.gpu_free) - itype.gpu_total_milli
        shares.append(1 - free_gpu / node.gpu_total_milli)
    return sum(shares) / len(shares)


def pack_score(node: NodeView, itype: InstanceType) -> float:
    """Best fit: the fullest node after placement first, keeping empty nodes empty."""
    return _used_share(node, itype)


def spread_score(node: NodeView, itype: InstanceType) -> float:
    """Least allocated: the emptiest node after placement first."""
    return -_used_share(node, itype)


SCORERS: dict[str, Scorer] = {"pack": pack_score, "spread": spread_score}
POLICIES = ("anycast", *SCORERS)
DEFAULT_POLICY = "pack"


def candidates(nodes: Sequence[NodeView], itype: InstanceType) -> list[NodeView]:
    return [n for n in nodes if not n.draining and fits(n.free, itype)]


def rank(
    nodes: Sequence[NodeView],
    itype: InstanceType,
    *,
    policy: str = DEFAULT_POLICY,
    rng: random.Random | None = None,
    scorers: Mapping[str, Scorer] = SCORERS,
) -> list[NodeView]:
    """Nodes that fit ``itype``, best first under ``policy``.

    ``anycast`` is a random order, which is what a NATS queue group does among the nodes
    subscribed to a type. Ties under a scoring policy break by node id, so the ranking is
    reproducible.
    """
    fit = candidates(nodes, itype)
    if policy == "anycast":
        (rng or random.Random()).shuffle(fit)
        return fit
    try:
        score = scorers[policy]
    except KeyError:
        known = ", ".join(POLICIES)
        raise ValueError(f"unknown placement policy {policy!r}; known: {known}") from None
    return sorted(fit, key=lambda n: (-score(n, itype), n.node_id))
