"""The cluster-wide half of a pool's state: nodes, what every pod on them requests, and
(when the metrics API answers) what they use.

It is read once and shared by every pool for ``cluster_view_ttl`` seconds: the
controller reads all pools at once each tick, and N pools must not mean N full pod
lists. The pool's own pods are never cached; the safety checks read them fresh.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lightkube import AsyncClient, operators
from lightkube.generic_resource import create_global_resource
from lightkube.models.core_v1 import Node, Pod
from lightkube.resources.core_v1 import Node as NodeResource
from lightkube.resources.core_v1 import Pod as PodResource

from roost.controller.adapters.k8s.pods import (
    Requests,
    allocatable,
    memory_pressure,
    name,
    pod_requests,
    resources,
    why_not_eligible,
)
from roost.decide.snapshot import NodeFigures

log = logging.getLogger("roost.controller.kubernetes")

NodeMetrics = create_global_resource("metrics.k8s.io", "v1beta1", "NodeMetrics", "nodes")
CHUNK = 500
METRICS_RETRY = 300.0
"""Seconds before asking a cluster without a metrics API again."""


@dataclass(frozen=True, slots=True)
class ClusterView:
    nodes: tuple[Node, ...]
    requested: Mapping[str, Requests]
    """Per node: what the pods bound to it request (terminating ones too: the scheduler
    counts them until they are gone)."""
    usage: Mapping[str, Requests] | None
    """Per node, from metrics.k8s.io; None when the metrics API did not answer."""
    usage_note: str = ""


@dataclass(frozen=True, slots=True)
class NodeChoice:
    figures: tuple[NodeFigures, ...]
    excluded: tuple[tuple[str, str], ...] = field(default=())
    """Nodes where the pool's pods run but no new one could go, with why."""


def node_figures(view: ClusterView, *, template: Pod | None, selector: Mapping[str, str],
                 pool_nodes: Sequence[str]) -> NodeChoice:
    """The nodes that could take one more of the pool's pods, in roost's units.

    Used is the larger of requests and measured usage when usage is known: requests are
    what the scheduler packs by, usage is what the kernel runs out of.
    """
    figures: list[NodeFigures] = []
    excluded: list[tuple[str, str]] = []
    running_on = set(pool_nodes)
    for node in view.nodes:
        node_id = name(node)
        why = why_not_eligible(node, template, selector)
        alloc = allocatable(node)
        if not why and (alloc.cpu_milli <= 0 or alloc.mem_bytes <= 0):
            why = "no allocatable CPU or memory"
        if why:
            if node_id in running_on:
                excluded.append((node_id, why))
            continue
        used = view.requested.get(node_id, Requests())
        if view.usage is not None and node_id in view.usage:
            used = used.max(view.usage[node_id])
        figures.append(NodeFigures(
            node_id=node_id,
            allocatable_cpu_milli=alloc.cpu_milli,
            allocatable_mem_mib=alloc.mem_bytes // 2**20,
            used_cpu_milli=used.cpu_milli,
            used_mem_mib=used.mem_mib,
            memory_pressure=memory_pressure(node),
        ))
    return NodeChoice(tuple(figures), tuple(excluded))


class ClusterReader:
    """Reads and shares the `ClusterView`; concurrent callers wait for one read."""

    def __init__(self, client: AsyncClient, *, ttl: float, use_metrics: bool,
                 clock: Callable[[], float] | None = None) -> None:
        self._client = client
        self._ttl = ttl
        self._use_metrics = use_metrics
        self._clock = clock
        self._lock = asyncio.Lock()
        self._view: ClusterView | None = None
        self._expires = 0.0
        self._metrics_back_at = 0.0

    def _time(self) -> float:
        return self._clock() if self._clock else asyncio.get_running_loop().time()

    def invalidate(self) -> None:
        self._view = None

    async def view(self) -> ClusterView:
        async with self._lock:
            if self._view is not None and self._time() < self._expires:
                return self._view
            view = await self._read()
            self._view, self._expires = view, self._time() + self._ttl
            return view

    async def _read(self) -> ClusterView:
        nodes = [n async for n in self._client.list(NodeResource, chunk_size=CHUNK)]
        requested: dict[str, Requests] = {}
        phases: dict[str, str | operators.BinaryOperator | operators.SequenceOperator] = {
            "status.phase": operators.not_in(["Succeeded", "Failed"])}
        async for pod in self._client.list(PodResource, namespace="*", fields=phases,
                                           chunk_size=CHUNK):
            node_id = pod.spec.nodeName if pod.spec else None
            if node_id:
                requested[node_id] = requested.get(node_id, Requests()) + pod_requests(pod)
        usage, note = await self._usage()
        return ClusterView(tuple(nodes), requested, usage, note)

    async def _usage(self) -> tuple[dict[str, Requests] | None, str]:
        if not self._use_metrics:
            return None, "metrics.k8s.io not used (use_metrics off)"
        if self._time() < self._metrics_back_at:
            return None, "metrics.k8s.io unavailable"
        try:
            items: list[Any] = [m async for m in self._client.list(NodeMetrics)]
        except Exception as exc:  # optional input: any failure means "requests only"
            self._metrics_back_at = self._time() + METRICS_RETRY
            log.info("metrics.k8s.io unavailable (%s); using requests only for %gs",
                     type(exc).__name__, METRICS_RETRY)
            return None, "metrics.k8s.io unavailable"
        usage: dict[str, Requests] = {}
        for item in items:
            meta = item.metadata
            node_id = meta.name if meta else None
            if node_id:
                usage[node_id] = resources(item.get("usage"))
        return usage, "metrics.k8s.io"
