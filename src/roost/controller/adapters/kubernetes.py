"""The ``kubernetes`` orchestrator: a pool is a Deployment, a replica is a pod.

- ``pool_state``: replicas from the Deployment's ``scale`` subresource; the pool's pods
  (found by the selector the scale subresource reports) with readiness and
  ``pod-deletion-cost``; the nodes that could take one more of them, with allocatable
  CPU/memory, what every pod on them requests (and uses, when metrics.k8s.io answers),
  and ``MemoryPressure``.
- ``scale_pool``: a merge PATCH of ``/scale`` carrying the resourceVersion just read.
  A 409 means someone else (an HPA, a person, another controller) wrote in between: it
  raises `ScaleConflict` and the next tick decides again from a fresh read. It never
  loops.
- ``set_instance_termination_priority``: annotates the pod with
  ``controller.kubernetes.io/pod-deletion-cost`` and reads the answer to confirm it
  landed; priority 0 removes the annotation.
- Safety (see `k8s.safety`): k replicas fewer only for k pods carrying roost's removal
  mark (a batch of drained workers, or one replica when none is marked), and only when
  every other pod is Ready, Running and scheduled, no rollout is mixing ReplicaSets, and
  every other pod costs strictly more to delete than every drained one, read back fresh;
  otherwise `UnsafeScaleDown`. After a scale-down the adapter watches which pods left
  and keeps the outcome (`removal_checks`), so a mismatch shows up in ``/status`` and in
  the log.

Beyond the Protocol the controller may call `report()` (JSON for ``/status``),
`removal_checks()` and `details()`; a drain aborted after its pod was marked is undone
with ``set_instance_termination_priority(..., priority=0)`` (or `abort_drain`).

Client library: **lightkube** (not kubernetes-asyncio). It is small and typed (py.typed,
models are msgspec structs, which roost already uses), its async client sits on an httpx
fork with timeouts and transports we can inject, it speaks the scale subresource and
merge patches directly, and it handles in-cluster service accounts (re-reading rotated
tokens) and kubeconfig files. kubernetes-asyncio is a generated client of ~1,700 files
on aiohttp, untyped for mypy's purposes, with a second HTTP stack to configure.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import httpx2
from lightkube import AsyncClient, operators
from lightkube.models.core_v1 import Pod
from lightkube.resources.apps_v1 import DeploymentScale
from lightkube.resources.core_v1 import Pod as PodResource
from lightkube.types import PatchType

from roost.controller.adapters.k8s.cluster import ClusterReader, node_figures
from roost.controller.adapters.k8s.config import (
    DeploymentRef,
    KubernetesSettings,
    load_config,
    parse_ref,
)
from roost.controller.adapters.k8s.errors import ScaleConflict, UnsafeScaleDown, api_errors
from roost.controller.adapters.k8s.pods import (
    DELETION_COST,
    INT32,
    deletion_cost,
    is_active,
    is_serving,
    name,
    parse_cost,
    pod_annotations,
    pod_requests,
    revision,
)
from roost.controller.adapters.k8s.safety import MISMATCH, RemovalCheck, removal_blockers, resolve
from roost.controller.orchestrator import (
    InstanceView,
    OrchestratorError,
    PoolRef,
    PoolState,
    ScaleResult,
    UnknownInstance,
    UnknownPool,
    check_replicas,
)

__all__ = [
    "ACCESS",
    "REMOVAL_MARK",
    "Access",
    "KubernetesOrchestrator",
    "KubernetesSettings",
    "PoolDetails",
    "RemovalCheck",
    "ScaleConflict",
    "UnsafeScaleDown",
]

log = logging.getLogger("roost.controller.kubernetes")

REMOVAL_MARK = "roost.dev/removal-requested-at"
"""Set beside a negative deletion cost that roost wrote, so roost clears only its own."""
KEEP_CHECKS = 20


@dataclass(frozen=True, slots=True)
class Access:
    """One permission the adapter uses (deploy/kubernetes/rbac.yaml grants exactly these)."""

    group: str
    resource: str
    verb: str
    cluster_wide: bool
    optional: bool = False


ACCESS = (
    Access("apps", "deployments/scale", "get", False),
    Access("apps", "deployments/scale", "patch", False),
    Access("", "pods", "patch", False),
    Access("", "pods", "list", True),  # every pod on a node counts toward its "used"
    Access("", "nodes", "list", True),
    Access("metrics.k8s.io", "nodes", "list", True, optional=True),
)


@dataclass(frozen=True, slots=True)
class PoolDetails:
    """What the adapter saw of a pool beyond `PoolState`, for ``/status``."""

    deployment: str
    revisions: tuple[str, ...]
    pod_cpu_milli: int | None
    pod_mem_mib: int | None
    excluded_nodes: tuple[tuple[str, str], ...]
    usage: str
    notes: tuple[str, ...]
    observed_at: float


@dataclass(frozen=True, slots=True)
class _Scale:
    replicas: int
    selector: str
    resource_version: str


class _Verbatim(operators.Operator[None]):
    """A label selector passed on as written (the scale subresource gives a string)."""

    def __init__(self, selector: str) -> None:
        super().__init__("verbatim", "", None)
        self.selector = selector

    def encode(self, key: str) -> str:
        return self.selector


class KubernetesOrchestrator:
    name = "kubernetes"

    def __init__(self, client: AsyncClient, *, now: Callable[[], float],
                 settings: KubernetesSettings | None = None) -> None:
        self.settings = (settings or KubernetesSettings()).validate()
        self._client = client
        self._now = now
        self._namespace = self.settings.namespace or client.namespace or "default"
        self._cluster = ClusterReader(client, ttl=self.settings.cluster_view_ttl,
                                      use_metrics=self.settings.use_metrics)
        self._marks: dict[str, dict[str, int]] = {}
        """Per pool, the pods marked for the removal being prepared, with their cost."""
        self._checks: dict[str, list[RemovalCheck]] = {}
        self._written: dict[str, int] = {}
        self._details: dict[str, PoolDetails] = {}

    @classmethod
    def from_settings(cls, settings: KubernetesSettings | None = None, *,
                      now: Callable[[], float],
                      transport: httpx2.AsyncBaseTransport | None = None
                      ) -> KubernetesOrchestrator:
        """Connect as the settings say (ValueError when no configuration is found)."""
        settings = (settings or KubernetesSettings()).validate()
        client = AsyncClient(load_config(settings), namespace=settings.namespace,
                             timeout=httpx2.Timeout(settings.timeout),
                             field_manager=settings.field_manager, transport=transport)
        return cls(client, now=now, settings=settings)

    # ---- the protocol -----------------------------------------------------------------

    async def pool_state(self, pool: PoolRef) -> PoolState:
        dep = self._ref(pool)
        scale = await self._scale(dep)
        pods = await self._pods(dep, scale)
        self._resolve(pool.pool_id, pods)
        with api_errors(f"reading nodes for {dep}"):
            view = await self._cluster.view()
        active = sorted((p for p in pods if is_active(p)), key=name)
        template = active[0] if active else None
        choice = node_figures(view, template=template, selector=dep.node_selector,
                              pool_nodes=[p.spec.nodeName for p in active
                                          if p.spec and p.spec.nodeName])
        now = self._now()
        size = pod_requests(template) if template is not None else None
        self._details[pool.pool_id] = PoolDetails(
            deployment=str(dep),
            revisions=tuple(sorted({revision(p, self.settings.revision_keys) for p in active})),
            pod_cpu_milli=size.cpu_milli if size else None,
            pod_mem_mib=size.mem_mib if size else None,
            excluded_nodes=choice.excluded,
            usage=view.usage_note,
            notes=self._notes(pool.pool_id, scale),
            observed_at=now,
        )
        return PoolState(
            target_replicas=scale.replicas,
            instances=tuple(InstanceView(name(p), is_serving(p), deletion_cost(p))
                            for p in active),
            nodes=choice.figures,
            observed_at=now,
            removal_batch=None,  # scale_pool verifies every marked pod of a batch
        )

    async def scale_pool(self, pool: PoolRef, replicas: int, *, request_id: str) -> ScaleResult:
        check_replicas(replicas)
        dep = self._ref(pool)
        scale = await self._scale(dep)
        current = scale.replicas
        if replicas == current:
            return ScaleResult(current, replicas)
        check: RemovalCheck | None = None
        if replicas < current:
            pods = await self._pods(dep, scale)
            victims = self._victims(pool.pool_id, pods)
            k = current - replicas
            if k != max(1, len(victims)):
                marked = f"{len(victims)} marked pods" if victims else "no marked pod"
                raise UnsafeScaleDown(f"{dep}: asked for {replicas} from {current} with "
                                      f"{marked}; roost removes exactly the drained replicas "
                                      "(one when none is marked)")
            blockers = removal_blockers(pods, replicas=current, victims=victims)
            if blockers:
                raise UnsafeScaleDown(f"not removing {k} of {dep}'s replicas: "
                                      f"{'; '.join(blockers)}")
            check = RemovalCheck(pool.pool_id, str(dep), tuple(sorted(victims)),
                                 tuple(sorted(name(p) for p in pods if is_active(p))),
                                 replicas, self._now())
        body = {"metadata": {"resourceVersion": scale.resource_version},
                "spec": {"replicas": replicas}}
        with api_errors(f"scaling {dep} to {replicas}", UnknownPool):
            await self._client.patch(DeploymentScale, dep.name, body, namespace=dep.namespace,
                                     patch_type=PatchType.MERGE)
        self._written[pool.pool_id] = replicas
        self._cluster.invalidate()
        if check is not None:
            self._checks.setdefault(pool.pool_id, []).append(check)
            self._marks.pop(pool.pool_id, None)
        log.info("scaled %s from %d to %d (request %s%s)", dep, current, replicas, request_id,
                 f", removing {', '.join(check.expected)}" if check and check.expected else "")
        return ScaleResult(current, replicas)

    async def set_instance_termination_priority(
        self, pool: PoolRef, instance_ref: str, *, priority: int
    ) -> None:
        if not INT32[0] <= priority <= INT32[1]:
            raise ValueError(f"pod-deletion-cost must fit in an int32, got {priority}")
        dep = self._ref(pool)
        pods = await self._pods(dep, await self._scale(dep))
        pod = next((p for p in pods if name(p) == instance_ref), None)
        if pod is None:
            raise UnknownInstance(f"{dep} has no pod {instance_ref!r}")
        if not is_active(pod):
            log.info("pod %s of %s is already leaving; not annotating it", instance_ref, dep)
            return
        batch = self._marks.setdefault(pool.pool_id, {})
        if priority < 0:  # marks outside the batch being prepared are stale
            for other in pods:
                marked = REMOVAL_MARK in pod_annotations(other)
                if (other is not pod and marked and is_active(other)
                        and name(other) not in batch):
                    await self._annotate(dep, name(other), None)
        await self._annotate(dep, instance_ref, priority)
        if priority < 0:
            batch[instance_ref] = priority
        else:
            batch.pop(instance_ref, None)

    async def close(self) -> None:
        await self._client.close()

    # ---- beyond the protocol ------------------------------------------------------------

    async def abort_drain(self, pool: PoolRef, instance_ref: str) -> None:
        """Undo a removal mark (a drain re-activated after its pod was annotated)."""
        await self.set_instance_termination_priority(pool, instance_ref, priority=0)

    def removal_checks(self, pool_id: str | None = None) -> tuple[RemovalCheck, ...]:
        """Recent scale-downs and which pod actually went, oldest first."""
        keys = [pool_id] if pool_id is not None else sorted(self._checks)
        return tuple(c for k in keys for c in self._checks.get(k, ()))

    def details(self, pool_id: str) -> PoolDetails | None:
        return self._details.get(pool_id)

    def report(self) -> dict[str, Any]:
        """A JSON-ready summary per pool for ``/status``: details, removals, mismatches."""
        out: dict[str, Any] = {}
        for pool_id in sorted(set(self._details) | set(self._checks)):
            checks = self._checks.get(pool_id, [])
            details = self._details.get(pool_id)
            out[pool_id] = {
                **(asdict(details) if details else {}),
                "removals": [asdict(c) for c in checks],
                "mismatches": sum(c.outcome == MISMATCH for c in checks),
            }
        return {"adapter": self.name, "pools": out}

    # ---- internals ------------------------------------------------------------------------

    def _ref(self, pool: PoolRef) -> DeploymentRef:
        try:
            return parse_ref(pool.ref, self._namespace)
        except ValueError as exc:
            raise UnknownPool(str(exc)) from None

    async def _scale(self, dep: DeploymentRef) -> _Scale:
        with api_errors(f"reading {dep}/scale", UnknownPool):
            scale = await self._client.get(DeploymentScale, dep.name, namespace=dep.namespace)
        spec, status, meta = scale.spec, scale.status, scale.metadata
        selector = status.selector if status else None
        if not selector:
            # Listing with an empty selector would return every pod in the namespace.
            raise OrchestratorError(f"{dep}: its scale status has no selector yet")
        replicas = spec.replicas if spec and spec.replicas is not None else 0
        rv = (meta.resourceVersion if meta else None) or ""
        return _Scale(replicas, selector, rv)

    async def _pods(self, dep: DeploymentRef, scale: _Scale) -> list[Pod]:
        with api_errors(f"listing the pods of {dep}", UnknownPool):
            return [p async for p in self._client.list(
                PodResource, namespace=dep.namespace, labels={"": _Verbatim(scale.selector)})]

    async def _annotate(self, dep: DeploymentRef, pod: str, priority: int | None) -> None:
        """Set (or with None or 0, remove) the deletion cost, and confirm it landed."""
        mark = priority is not None and priority < 0
        want = str(priority) if priority else None
        body = {"metadata": {"annotations": {
            DELETION_COST: want,
            REMOVAL_MARK: datetime.fromtimestamp(self._now(), UTC).isoformat() if mark else None,
        }}}
        with api_errors(f"annotating pod {pod} of {dep}", UnknownInstance):
            answer = await self._client.patch(PodResource, pod, body, namespace=dep.namespace,
                                              patch_type=PatchType.MERGE)
        found = pod_annotations(answer).get(DELETION_COST)
        if found != want:
            raise OrchestratorError(f"{DELETION_COST} on {pod} reads {found!r} after setting "
                                    f"{want!r}: a webhook or another controller changed it")

    def _victims(self, pool_id: str, pods: list[Pod]) -> dict[str, int | None]:
        """The drained pods to remove, with the cost each should carry: those this
        adapter marked, else (a new leader) every active pod carrying roost's mark."""
        active = {name(p): p for p in pods if is_active(p)}
        batch = self._marks.get(pool_id)
        if batch:
            return {n: c for n, c in batch.items() if n in active}
        return {n: parse_cost(pod_annotations(p).get(DELETION_COST))
                for n, p in active.items() if REMOVAL_MARK in pod_annotations(p)}

    def _resolve(self, pool_id: str, pods: list[Pod]) -> None:
        checks = self._checks.get(pool_id)
        if not checks:
            return
        now, patience = self._now(), self.settings.removal_patience
        for i, check in enumerate(checks):
            new = resolve(check, pods, now=now, patience=patience)
            if new != check:
                checks[i] = new
                level = logging.WARNING if new.outcome == MISMATCH else logging.INFO
                log.log(level, "removal in %s: %s: %s", new.deployment, new.outcome, new.detail)
        del checks[:-KEEP_CHECKS]

    def _notes(self, pool_id: str, scale: _Scale) -> tuple[str, ...]:
        notes = [f"removal {c.outcome}: {c.detail}" for c in self._checks.get(pool_id, ())
                 if c.outcome != "ok" and c.detail]
        written = self._written.get(pool_id)
        if written is not None and written != scale.replicas:
            notes.append(f"replicas changed outside roost: roost set {written}, the Deployment "
                         f"has {scale.replicas} (an HPA, KEDA or a person?)")
        return tuple(notes)
