"""A cluster that places requests one by one with a `decide.placement` policy, fast.

It picks exactly the node `rank(...)[0]` would pick (the best score, ties to the lowest
node id; uniformly at random among the nodes that fit for a randomized policy) and
commits with `roost.domain.fit.take`, but it does not rescore every node for every
request. A policy's choice depends only on the node's capacity and the request (see
`roost.decide.placement`), so the replay keeps, per request shape, each node's last
`Policy.choose` result and calls the policy again only for nodes whose capacity changed
since. A memo keyed by capacity lets identical nodes share one call. The policy code
that scores each node is the gateway's, unchanged.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from roost.decide.placement import Choice, NodeView, Policy
from roost.decide.workload import Workload
from roost.domain.catalog import InstanceType
from roost.domain.fit import GpuAssignment, give, take

_NEG_INF = float("-inf")

_Key = tuple[object, ...]


def capacity_key(node: NodeView) -> _Key:
    """Everything a policy may look at: allocatable, free capacity, draining."""
    a, f = node.allocatable, node.free
    return (a.cpu_milli, a.mem_mib, f.resources.cpu_milli, f.resources.mem_mib, f.gpu_free,
            f.gpu_models, node.draining)


class _Shape:
    __slots__ = ("choices", "memo", "scores", "stamp")

    def __init__(self, n: int) -> None:
        self.scores: npt.NDArray[np.float64] = np.full(n, _NEG_INF)
        self.stamp: npt.NDArray[np.int64] = np.full(n, -1, dtype=np.int64)
        self.choices: list[Choice | None] = [None] * n
        self.memo: dict[_Key, Choice | None] = {}


@dataclass(frozen=True, slots=True)
class Placed:
    node: int  # index into ReplayCluster.nodes
    gpus: GpuAssignment


class ReplayCluster:
    """Nodes (sorted by id), a policy, and the incremental bookkeeping."""

    def __init__(
        self, nodes: Sequence[NodeView], policy: Policy, *, rng: random.Random | None = None
    ) -> None:
        self.nodes = sorted(nodes, key=lambda v: v.node_id)
        self.policy = policy
        self.policy_workload: Workload | None = None
        self.rng = rng or random.Random(0)
        self._version: npt.NDArray[np.int64] = np.zeros(len(self.nodes), dtype=np.int64)
        self._keys = [capacity_key(v) for v in self.nodes]
        self._shapes: dict[InstanceType, _Shape] = {}
        self.policy_calls = 0

    def _refresh(self, itype: InstanceType) -> _Shape:
        shape = self._shapes.get(itype)
        if shape is None:
            shape = self._shapes[itype] = _Shape(len(self.nodes))
        dirty = np.flatnonzero(shape.stamp != self._version)
        if dirty.size:
            memo, keys, nodes = shape.memo, self._keys, self.nodes
            scores, choices = shape.scores, shape.choices
            choose = self.policy.choose
            for i in dirty.tolist():
                key = keys[i]
                if key in memo:
                    c = memo[key]
                else:
                    c = memo[key] = choose(nodes[i], itype)
                    self.policy_calls += 1
                choices[i] = c
                scores[i] = _NEG_INF if c is None else c.score
            shape.stamp[dirty] = self._version[dirty]
        return shape

    def set_policy(self, policy: Policy, *, workload: Workload | None = None) -> None:
        """Switch policy (e.g. one built on a fresher ``workload``); forgets every score."""
        self.policy = policy
        self.policy_workload = workload
        self._shapes.clear()

    def best(self, itype: InstanceType) -> Placed | None:
        """Where ``itype`` would go, without committing it."""
        shape = self._refresh(itype)
        if self.policy.randomized:
            fit = np.flatnonzero(shape.scores > _NEG_INF)
            if not fit.size:
                return None
            i = int(fit[self.rng.randrange(fit.size)])
        else:
            i = int(np.argmax(shape.scores))  # first of equal maxima: the lowest node id
            if shape.scores[i] == _NEG_INF:
                return None
        choice = shape.choices[i]
        assert choice is not None
        return Placed(i, choice.gpus)

    def place(self, itype: InstanceType) -> Placed | None:
        """Place ``itype`` on the best node and commit it; None when nothing fits."""
        placed = self.best(itype)
        if placed is not None:
            node = self.nodes[placed.node]
            self._set(placed.node, replace(node, free=take(node.free, itype, placed.gpus)))
        return placed

    def release(self, placed: Placed, itype: InstanceType) -> None:
        node = self.nodes[placed.node]
        self._set(placed.node, replace(node, free=give(node.free, itype, placed.gpus)))

    def _set(self, i: int, node: NodeView) -> None:
        self.nodes[i] = node
        self._keys[i] = capacity_key(node)
        self._version[i] += 1
