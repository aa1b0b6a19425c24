"""Pure reads of pods and nodes, the way Kubernetes' own controllers read them.

The ReplicaSet controller, the scheduler and the kubelet each have a notion of "active",
"ready", "requests" and "fits"; the adapter must agree with them, or it reports a pool as
settled while the ReplicaSet controller sees a pod it will remove first. Every function
here takes lightkube models and returns plain values: no I/O, so they are unit-tested
with hand-made pods.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from lightkube.models.core_v1 import Container, Node, NodeSelectorRequirement, Pod, Toleration
from lightkube.utils.quantity import parse_quantity

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
"""Lower goes first when a ReplicaSet shrinks (beta since 1.22, on by default)."""
TEMPLATE_HASH = "pod-template-hash"
"""The label the Deployment controller puts on each ReplicaSet's pods."""
INT32 = (-(2**31), 2**31 - 1)
MIB = 2**20


# ---- one pod --------------------------------------------------------------------------


def is_active(pod: Pod) -> bool:
    """Counted by its ReplicaSet: not finished and not being deleted (``IsPodActive``)."""
    phase = pod.status.phase if pod.status else None
    deleting = pod.metadata is not None and pod.metadata.deletionTimestamp is not None
    return phase not in ("Succeeded", "Failed") and not deleting


def is_scheduled(pod: Pod) -> bool:
    return bool(pod.spec and pod.spec.nodeName)


def is_ready(pod: Pod) -> bool:
    """The pod's Ready condition is True (``podutil.IsPodReady``)."""
    conditions = (pod.status.conditions if pod.status else None) or ()
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def is_serving(pod: Pod) -> bool:
    """Active, on a node, Running and Ready: a pod the ReplicaSet controller ranks
    after every unassigned, pending and not-ready one."""
    phase = pod.status.phase if pod.status else None
    return is_active(pod) and is_scheduled(pod) and phase == "Running" and is_ready(pod)


def why_not_serving(pod: Pod) -> str:
    if not is_active(pod):
        return "terminating"
    if not is_scheduled(pod):
        return "not scheduled"
    phase = pod.status.phase if pod.status else None
    if phase != "Running":
        return f"phase {phase or 'unknown'}"
    if not is_ready(pod):
        return "not ready"
    return ""


def name(pod: Pod | Node) -> str:
    return (pod.metadata.name if pod.metadata else None) or ""


def pod_annotations(pod: Pod) -> Mapping[str, str]:
    return (pod.metadata.annotations if pod.metadata else None) or {}


def pod_labels(obj: Pod | Node) -> Mapping[str, str]:
    return (obj.metadata.labels if obj.metadata else None) or {}


def parse_cost(value: str | None) -> int | None:
    """A pod-deletion-cost annotation's value, or None when absent or not an int32."""
    if value is None:
        return None
    try:
        cost = int(value.strip())
    except ValueError:
        return None
    return cost if INT32[0] <= cost <= INT32[1] else None


def deletion_cost(pod: Pod) -> int:
    """The cost the ReplicaSet controller sorts by: an unparseable value counts as 0,
    as it does there (the API server rejects such values anyway)."""
    return parse_cost(pod_annotations(pod).get(DELETION_COST)) or 0


def revision(pod: Pod, keys: Sequence[str]) -> str:
    """The release a pod runs: the first of ``keys`` found among its labels, then its
    annotations, then its ReplicaSet's template hash."""
    lab, ann = pod_labels(pod), pod_annotations(pod)
    for key in keys:
        if lab.get(key):
            return lab[key]
        if ann.get(key):
            return ann[key]
    return lab.get(TEMPLATE_HASH, "")


# ---- requests ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Requests:
    """CPU in millicores, memory in bytes (converted to MiB only at the edge)."""

    cpu_milli: int = 0
    mem_bytes: int = 0

    def __add__(self, other: Requests) -> Requests:
        return Requests(self.cpu_milli + other.cpu_milli, self.mem_bytes + other.mem_bytes)

    def max(self, other: Requests) -> Requests:
        return Requests(max(self.cpu_milli, other.cpu_milli),
                        max(self.mem_bytes, other.mem_bytes))

    @property
    def mem_mib(self) -> int:
        return math.ceil(self.mem_bytes / MIB)


def _quantity(value: object) -> Decimal:
    if value is None:
        return Decimal(0)
    parsed = parse_quantity(str(value))
    return parsed if parsed is not None else Decimal(0)


def resources(values: Mapping[str, object] | None) -> Requests:
    values = values or {}
    return Requests(math.ceil(_quantity(values.get("cpu")) * 1000),
                    math.ceil(_quantity(values.get("memory"))))


def _container(c: Container) -> Requests:
    return resources(c.resources.requests if c.resources else None)


def pod_requests(pod: Pod) -> Requests:
    """What the scheduler reserves for a pod: the larger of its running containers (with
    sidecars) and its heaviest init step, plus the runtime class overhead."""
    spec = pod.spec
    if spec is None:
        return Requests()
    running = Requests()
    for c in spec.containers or ():
        running = running + _container(c)
    init_peak = Requests()
    sidecars = Requests()
    for c in spec.initContainers or ():
        if c.restartPolicy == "Always":  # a sidecar: starts in order, then keeps running
            sidecars = sidecars + _container(c)
            init_peak = init_peak.max(sidecars)
        else:
            init_peak = init_peak.max(sidecars + _container(c))
    total = (running + sidecars).max(init_peak)
    return total + resources(spec.overhead)


# ---- nodes ------------------------------------------------------------------------------


def allocatable(node: Node) -> Requests:
    values = node.status.allocatable if node.status else None
    return Requests(math.floor(_quantity((values or {}).get("cpu")) * 1000),
                    math.floor(_quantity((values or {}).get("memory"))))


def _condition(node: Node, kind: str) -> str | None:
    for c in (node.status.conditions if node.status else None) or ():
        if c.type == kind:
            return c.status
    return None


def memory_pressure(node: Node) -> bool:
    return _condition(node, "MemoryPressure") == "True"


def node_ready(node: Node) -> bool:
    return _condition(node, "Ready") == "True"


def _tolerates(tolerations: Iterable[Toleration], key: str, value: str, effect: str) -> bool:
    for t in tolerations:
        if t.effect and t.effect != effect:
            continue
        if t.operator == "Exists":
            if not t.key or t.key == key:
                return True
        elif t.key == key and (t.value or "") == value:
            return True
    return False


def _requirement(req: NodeSelectorRequirement, value: str | None) -> bool:
    values = req.values or []
    match req.operator:
        case "In":
            return value is not None and value in values
        case "NotIn":
            return value is None or value not in values
        case "Exists":
            return value is not None
        case "DoesNotExist":
            return value is None
        case "Gt" | "Lt":
            try:
                have, bound = int(value or ""), int(values[0])
            except (ValueError, IndexError):
                return False
            return have > bound if req.operator == "Gt" else have < bound
    return False


def _affinity_allows(pod: Pod, node: Node) -> bool:
    spec = pod.spec
    affinity = spec.affinity.nodeAffinity if spec and spec.affinity else None
    required = affinity.requiredDuringSchedulingIgnoredDuringExecution if affinity else None
    if required is None:
        return True
    node_labels = pod_labels(node)
    for term in required.nodeSelectorTerms or ():
        exprs, fields = term.matchExpressions or [], term.matchFields or []
        if not exprs and not fields:
            continue  # an empty term matches no node
        if all(_requirement(e, node_labels.get(e.key)) for e in exprs) and all(
            _requirement(f, name(node) if f.key == "metadata.name" else None) for f in fields
        ):
            return True
    return False


def why_not_eligible(node: Node, template: Pod | None, selector: Mapping[str, str]) -> str:
    """Why one more pod like ``template`` could not go to ``node`` (``""``: it could, as
    far as labels, taints and the node's state go; room is the plan's business).

    ``template`` is any pod of the pool (pods carry their template's node selector,
    affinity and tolerations); ``selector`` adds node labels from the pool's reference.
    """
    if node.spec is not None and node.spec.unschedulable:
        return "cordoned"
    if not node_ready(node):
        return "not Ready"
    node_labels = pod_labels(node)
    wanted = dict(selector)
    if template is not None and template.spec is not None:
        wanted.update(template.spec.nodeSelector or {})
    for key, value in wanted.items():
        if node_labels.get(key) != value:
            return f"label {key}={value} missing"
    if template is not None and not _affinity_allows(template, node):
        return "node affinity"
    tolerations = (template.spec.tolerations if template and template.spec else None) or []
    for taint in (node.spec.taints if node.spec else None) or ():
        if taint.effect in ("NoSchedule", "NoExecute") and not _tolerates(
            tolerations, taint.key, taint.value or "", taint.effect
        ):
            return f"taint {taint.key}:{taint.effect}"
    return ""
