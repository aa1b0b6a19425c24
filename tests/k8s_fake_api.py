"""A small Kubernetes API server for the kubernetes adapter's tests: real HTTP and JSON
(Starlette on uvicorn, on a free loopback port, in the test's event loop), serving
exactly what the adapter uses:

- ``deployments/{name}/scale`` GET and merge PATCH, with resourceVersion preconditions
  (409 Conflict) and validation (422);
- pods: list (namespaced or cluster-wide; label and field selectors; ``limit`` and
  ``continue``) and merge PATCH of annotations, with the API server's int32 check of
  ``pod-deletion-cost``;
- nodes: list, with allocatable, taints, cordons and conditions;
- ``metrics.k8s.io/v1beta1/nodes`` when the test enables it (else a plain-text 404, as
  an API server without metrics-server answers);
- bearer-token authentication and RBAC evaluated from Role/ClusterRole objects (the
  deploy manifests), answering 401/403 as the real one does.

Behind it a `FakeCluster` plays the Deployment/ReplicaSet controllers and the scheduler:
scaling up creates pods (ready, not ready or pending, as the test says) on nodes with
room; scaling down deletes pods in the ReplicaSet controller's order
(``ActivePodsWithRanks``): unassigned, then Pending < Unknown < Running, then not Ready,
then lower pod-deletion-cost, then more pods of the Deployment on the same node, then
Ready more recently, then more restarts, then newer. The logarithmic time bucketing of
``LogarithmicScaleDown`` is not reproduced: times compare exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import json
import re
import socket
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import uvicorn
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

COST = "controller.kubernetes.io/pod-deletion-cost"
HASH = "pod-template-hash"
PHASE_ORDER = {"Pending": 0, "Unknown": 1, "Running": 2}
Obj = dict[str, Any]


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status(code: int, reason: str, message: str) -> JSONResponse:
    return JSONResponse({"kind": "Status", "apiVersion": "v1", "metadata": {},
                         "status": "Failure", "message": message, "reason": reason,
                         "code": code}, status_code=code)


class ApiFailure(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


# ---- selectors ----------------------------------------------------------------------------


def _split(selector: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def label_match(selector: str, labels: Mapping[str, str]) -> bool:
    for req in _split(selector):
        if m := re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", req):
            key, op, values = m[1], m[2], {v.strip() for v in m[3].split(",")}
            ok = labels.get(key) in values if op == "in" else labels.get(key) not in values
        elif m := re.fullmatch(r"([^!=\s]+)\s*(==|=|!=)\s*(\S*)", req):
            key, op, value = m[1], m[2], m[3]
            ok = labels.get(key) == value if op != "!=" else labels.get(key) != value
        elif req.startswith("!"):
            ok = req[1:] not in labels
        elif re.fullmatch(r"[^\s=!()]+", req):
            ok = req in labels
        else:
            raise ApiFailure(400, "BadRequest", f"unable to parse requirement: {req!r}")
        if not ok:
            return False
    return True


FIELDS: dict[str, Callable[[Obj], str]] = {
    "metadata.name": lambda o: o["metadata"]["name"],
    "metadata.namespace": lambda o: o["metadata"].get("namespace", ""),
    "spec.nodeName": lambda o: o["spec"].get("nodeName", ""),
    "status.phase": lambda o: o["status"].get("phase", ""),
}


def field_match(selector: str, obj: Obj) -> bool:
    for req in _split(selector):
        m = re.fullmatch(r"([^!=]+)(==|=|!=)(.*)", req)
        if not m or m[1] not in FIELDS:
            raise ApiFailure(400, "BadRequest", f"field label not supported: {req!r}")
        have = FIELDS[m[1]](obj)
        if (have == m[3]) != (m[2] != "!="):
            return False
    return True


# ---- RBAC -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grant:
    namespace: str | None  # None: cluster-wide (a ClusterRoleBinding)
    groups: frozenset[str]
    resources: frozenset[str]
    verbs: frozenset[str]

    def allows(self, group: str, resource: str, verb: str, namespace: str | None) -> bool:
        return ((self.namespace is None or self.namespace == namespace)
                and (group in self.groups or "*" in self.groups)
                and (resource in self.resources or "*" in self.resources)
                and (verb in self.verbs or "*" in self.verbs))


def grants_from_manifests(docs: Iterable[Obj], *, account: str, account_ns: str) -> list[Grant]:
    """What the bindings in ``docs`` grant to one ServiceAccount."""
    docs = [d for d in docs if d]
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
             for d in docs if d["kind"] in ("Role", "ClusterRole")}
    out: list[Grant] = []
    for b in docs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == account
                   and s.get("namespace", b["metadata"].get("namespace")) == account_ns
                   for s in b.get("subjects", [])):
            continue
        ref = b["roleRef"]
        scope = b["metadata"].get("namespace") if b["kind"] == "RoleBinding" else None
        role = roles.get((ref["kind"], scope if ref["kind"] == "Role" else None, ref["name"]))
        if role is None:
            continue
        for rule in role.get("rules", []):
            out.append(Grant(scope, frozenset(rule.get("apiGroups", [])),
                             frozenset(rule.get("resources", [])), frozenset(rule["verbs"])))
    return out


def load_yaml_docs(paths: Iterable[Any]) -> list[Obj]:
    docs: list[Obj] = []
    for p in paths:
        with open(p) as f:
            docs.extend(d for d in yaml.safe_load_all(f.read()) if d)
    return docs


# ---- the cluster ----------------------------------------------------------------------------


@dataclass
class Deployment:
    namespace: str
    name: str
    replicas: int
    match_labels: dict[str, str]
    template: Obj
    template_hash: str
    rv: int
    uid: str
    generation: int = 1


@dataclass
class FakeCluster:
    now: float = 1_700_000_000.0
    new_pods: str = "ready"
    """How pods a scale-up creates start: ready | not_ready | pending."""
    auto_reconcile: bool = True
    """Run the ReplicaSet controller right after each scale PATCH (else call reconcile())."""
    graceful: bool = False
    """Scaled-down pods stay terminating until finish_terminations()."""
    strip_annotations: set[str] = field(default_factory=set)
    """Annotations a (simulated) mutating webhook drops from pod patches."""
    token: str | None = None
    grants: list[Grant] | None = None
    metrics: dict[str, tuple[str, str]] | None = None
    delay: float = 0.0
    nodes: dict[str, Obj] = field(default_factory=dict)
    pods: dict[tuple[str, str], Obj] = field(default_factory=dict)
    deployments: dict[tuple[str, str], Deployment] = field(default_factory=dict)
    requests: list[tuple[str, str, str]] = field(default_factory=list)
    used_grants: set[Grant] = field(default_factory=set)
    before_scale_patch: list[Callable[[], None]] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    """Pods the ReplicaSet controller chose to delete, in order."""
    _rv: int = 100
    _seq: int = 0

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _tick(self) -> float:
        self.now += 1.0
        return self.now

    # ---- set-up ---------------------------------------------------------------------

    def add_node(self, name: str, *, cpu: str = "8", memory: str = "32Gi",
                 labels: Mapping[str, str] | None = None, taints: Iterable[Obj] = (),
                 ready: bool = True, memory_pressure: bool = False,
                 unschedulable: bool = False) -> Obj:
        node = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "labels": {
                "kubernetes.io/hostname": name, **(labels or {})},
                "resourceVersion": str(self._next_rv()), "creationTimestamp": iso(self.now)},
            "spec": {"taints": list(taints), **({"unschedulable": True} if unschedulable else {})},
            "status": {
                "capacity": {"cpu": cpu, "memory": memory, "pods": "110"},
                "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
                "conditions": [
                    {"type": "MemoryPressure", "status": "True" if memory_pressure else "False"},
                    {"type": "DiskPressure", "status": "False"},
                    {"type": "Ready", "status": "True" if ready else "False"},
                ],
            },
        }
        self.nodes[name] = node
        return node

    def add_deployment(self, namespace: str, name: str, *, replicas: int = 0,
                       requests: Mapping[str, str] | None = None,
                       labels: Mapping[str, str] | None = None,
                       node_selector: Mapping[str, str] | None = None,
                       tolerations: Iterable[Obj] = (),
                       template_hash: str = "5d8f7c9b4") -> Deployment:
        match = {"app": name}
        template = {
            "metadata": {"labels": {**match, **(labels or {})}},
            "spec": {"containers": [{"name": "worker", "image": "roost:latest", "resources": {
                "requests": dict(requests or {"cpu": "500m", "memory": "512Mi"})}}],
                **({"nodeSelector": dict(node_selector)} if node_selector else {}),
                **({"tolerations": list(tolerations)} if tolerations else {})},
        }
        dep = Deployment(namespace, name, 0, match, template, template_hash, self._next_rv(),
                         f"uid-{namespace}-{name}")
        self.deployments[(namespace, name)] = dep
        self.scale(namespace, name, replicas)
        return dep

    def add_pod(self, namespace: str, name: str, *, node: str | None = None,
                phase: str = "Running", ready: bool = True, labels: Mapping[str, str] | None = None,
                annotations: Mapping[str, str] | None = None,
                requests: Mapping[str, str] | None = None, restarts: int = 0) -> Obj:
        """Any pod: another tenant's on a node, or one a test shapes by hand."""
        pod: Obj = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                         "labels": dict(labels or {}), "annotations": dict(annotations or {}),
                         "creationTimestamp": iso(self._tick()),
                         "resourceVersion": str(self._next_rv())},
            "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {
                "requests": dict(requests or {"cpu": "100m", "memory": "128Mi"})}}]},
            "status": {"phase": phase, "conditions": []},
        }
        if node:
            pod["spec"]["nodeName"] = node
        self._set_ready(pod, ready and phase == "Running")
        if restarts:
            pod["status"]["containerStatuses"] = [{"name": "main", "image": "busybox",
                                                   "imageID": "sha256:0", "ready": ready,
                                                   "restartCount": restarts}]
        self.pods[(namespace, name)] = pod
        return pod

    def _set_ready(self, pod: Obj, ready: bool) -> None:
        conds = [c for c in pod["status"]["conditions"] if c["type"] != "Ready"]
        conds.append({"type": "Ready", "status": "True" if ready else "False",
                      "lastTransitionTime": iso(self._tick())})
        pod["status"]["conditions"] = conds
        pod["metadata"]["resourceVersion"] = str(self._next_rv())

    # ---- what tests do to pods and deployments ------------------------------------------

    def pod(self, namespace: str, name: str) -> Obj:
        return self.pods[(namespace, name)]

    def set_ready(self, namespace: str, name: str, ready: bool = True) -> None:
        pod = self.pod(namespace, name)
        if ready:
            pod["status"]["phase"] = "Running"
        self._set_ready(pod, ready)

    def set_phase(self, namespace: str, name: str, phase: str) -> None:
        self.pod(namespace, name)["status"]["phase"] = phase

    def unschedule(self, namespace: str, name: str) -> None:
        pod = self.pod(namespace, name)
        pod["spec"].pop("nodeName", None)
        pod["status"]["phase"] = "Pending"
        self._set_ready(pod, False)

    def touch(self, namespace: str, name: str) -> None:
        """Someone else wrote the Deployment (its resourceVersion moves on)."""
        self.deployments[(namespace, name)].rv = self._next_rv()

    def rollout(self, namespace: str, name: str, template_hash: str) -> None:
        """A new template: new pods get a new hash; old ones stay until replaced."""
        self.deployments[(namespace, name)].template_hash = template_hash

    def pods_of(self, namespace: str, name: str, *, active_only: bool = True) -> list[Obj]:
        dep = self.deployments[(namespace, name)]
        out = [p for (ns, _), p in sorted(self.pods.items()) if ns == namespace
               and all(p["metadata"]["labels"].get(k) == v for k, v in dep.match_labels.items())]
        return [p for p in out if is_active(p)] if active_only else out

    def names(self, namespace: str, name: str) -> list[str]:
        return [p["metadata"]["name"] for p in self.pods_of(namespace, name)]

    def finish_terminations(self) -> None:
        for key, p in list(self.pods.items()):
            if p["metadata"].get("deletionTimestamp"):
                del self.pods[key]

    # ---- the controllers ------------------------------------------------------------------

    def scale(self, namespace: str, name: str, replicas: int) -> None:
        dep = self.deployments[(namespace, name)]
        dep.replicas = replicas
        dep.rv = self._next_rv()
        dep.generation += 1
        if self.auto_reconcile:
            self.reconcile()

    def reconcile(self) -> None:
        for dep in self.deployments.values():
            active = self.pods_of(dep.namespace, dep.name)
            for _ in range(dep.replicas - len(active)):
                self._create_pod(dep)
            excess = len(active) - dep.replicas
            if excess > 0:
                for pod in rank_for_deletion(active)[:excess]:
                    self._delete(pod)

    def _delete(self, pod: Obj) -> None:
        self.deleted.append(pod["metadata"]["name"])
        if self.graceful:
            pod["metadata"]["deletionTimestamp"] = iso(self._tick())
            pod["metadata"]["resourceVersion"] = str(self._next_rv())
        else:
            del self.pods[(pod["metadata"]["namespace"], pod["metadata"]["name"])]

    def _create_pod(self, dep: Deployment) -> None:
        self._seq += 1
        name = f"{dep.name}-{dep.template_hash}-{self._seq:05x}"
        template = copy.deepcopy(dep.template)
        pod: Obj = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": dep.namespace,
                         "uid": f"uid-{dep.namespace}-{name}",
                         "labels": {**template["metadata"]["labels"], HASH: dep.template_hash},
                         "annotations": dict(template["metadata"].get("annotations", {})),
                         "creationTimestamp": iso(self._tick()),
                         "resourceVersion": str(self._next_rv()),
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                              "name": f"{dep.name}-{dep.template_hash}",
                                              "uid": f"{dep.uid}-rs", "controller": True}]},
            "spec": template["spec"],
            "status": {"phase": "Pending", "conditions": []},
        }
        node = self._schedule(pod)
        if node is not None:
            pod["spec"]["nodeName"] = node
            if self.new_pods != "pending":
                pod["status"]["phase"] = "Running"
        self._set_ready(pod, node is not None and self.new_pods == "ready")
        self.pods[(dep.namespace, name)] = pod

    def requested_on(self, node: str) -> tuple[int, int]:
        cpu = mem = 0
        for p in self.pods.values():
            if p["spec"].get("nodeName") == node and p["status"]["phase"] not in (
                    "Succeeded", "Failed"):
                c, m = pod_request(p)
                cpu, mem = cpu + c, mem + m
        return cpu, mem

    def _schedule(self, pod: Obj) -> str | None:
        """The emptiest node the pod fits on, or None (it stays Pending, unassigned)."""
        want_cpu, want_mem = pod_request(pod)
        selector = pod["spec"].get("nodeSelector", {})
        tolerated = {t.get("key") for t in pod["spec"].get("tolerations", [])}
        best: tuple[float, str] | None = None
        for name, node in sorted(self.nodes.items()):
            if node["spec"].get("unschedulable") or not node_is_ready(node):
                continue
            if any(node["metadata"]["labels"].get(k) != v for k, v in selector.items()):
                continue
            if any(t["effect"] in ("NoSchedule", "NoExecute") and t["key"] not in tolerated
                   for t in node["spec"].get("taints", [])):
                continue
            alloc_cpu = quantity(node["status"]["allocatable"]["cpu"]) * 1000
            alloc_mem = quantity(node["status"]["allocatable"]["memory"])
            cpu, mem = self.requested_on(name)
            if cpu + want_cpu > alloc_cpu or mem + want_mem > alloc_mem:
                continue
            score = (mem + want_mem) / alloc_mem
            if best is None or score < best[0]:
                best = (score, name)
        return best[1] if best else None


def node_is_ready(node: Obj) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in node["status"]["conditions"])


def is_active(pod: Obj) -> bool:
    return (pod["status"].get("phase") not in ("Succeeded", "Failed")
            and not pod["metadata"].get("deletionTimestamp"))


def is_ready(pod: Obj) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in pod["status"].get("conditions", []))


_UNITS = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def quantity(text: str) -> float:
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", text)
    assert m, text
    return float(m[1]) * _UNITS[m[2]]


def pod_request(pod: Obj) -> tuple[int, int]:
    cpu = mem = 0.0
    for c in pod["spec"].get("containers", []):
        req = c.get("resources", {}).get("requests", {})
        cpu += quantity(req.get("cpu", "0")) * 1000
        mem += quantity(req.get("memory", "0"))
    return round(cpu), round(mem)


def _cost(pod: Obj) -> int:
    try:
        return int(pod["metadata"].get("annotations", {}).get(COST, "0"))
    except ValueError:
        return 0


def _ready_since(pod: Obj) -> str:
    return next((c.get("lastTransitionTime", "") for c in pod["status"]["conditions"]
                 if c["type"] == "Ready" and c["status"] == "True"), "")


def _restarts(pod: Obj) -> int:
    return max((c.get("restartCount", 0) for c in pod["status"].get("containerStatuses", [])),
               default=0)


def rank_for_deletion(pods: list[Obj]) -> list[Obj]:
    """The ReplicaSet controller's ``ActivePodsWithRanks`` order: first goes first."""
    on_node: dict[str, int] = {}
    for p in pods:
        if is_active(p):
            node = p["spec"].get("nodeName", "")
            on_node[node] = on_node.get(node, 0) + 1
    rank = {id(p): on_node.get(p["spec"].get("nodeName", ""), 0) for p in pods}

    def less(a: Obj, b: Obj) -> bool:
        na, nb = a["spec"].get("nodeName", ""), b["spec"].get("nodeName", "")
        if na != nb and (not na or not nb):
            return not na  # 1. unassigned first
        pa, pb = (PHASE_ORDER.get(p["status"].get("phase", ""), 0) for p in (a, b))
        if pa != pb:
            return pa < pb  # 2. Pending < Unknown < Running
        if is_ready(a) != is_ready(b):
            return not is_ready(a)  # 3. not ready first
        if _cost(a) != _cost(b):
            return _cost(a) < _cost(b)  # 4. lower deletion cost first
        if rank[id(a)] != rank[id(b)]:
            return rank[id(a)] > rank[id(b)]  # 5. doubled up first
        if is_ready(a) and is_ready(b) and _ready_since(a) != _ready_since(b):
            ra, rb = _ready_since(a), _ready_since(b)
            return not ra or (bool(rb) and ra > rb)  # 6. ready more recently first
        if _restarts(a) != _restarts(b):
            return _restarts(a) > _restarts(b)  # 7. more restarts first
        ca, cb = a["metadata"].get("creationTimestamp", ""), b["metadata"].get(
            "creationTimestamp", "")
        if ca != cb:
            return not ca or (bool(cb) and ca > cb)  # 8. newer first
        return False

    def cmp(a: Obj, b: Obj) -> int:
        return -1 if less(a, b) else (1 if less(b, a) else 0)

    return sorted(pods, key=functools.cmp_to_key(cmp))


# ---- HTTP -----------------------------------------------------------------------------------


def merge_patch(target: Obj, patch: Obj) -> Obj:
    """RFC 7386."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            merge_patch(target[k], v)
        else:
            target[k] = copy.deepcopy(v)
    return target


ROUTES: list[tuple[str, str, str, str, str]] = [
    # method, path pattern, api group, resource, verb
    ("GET", r"/api/v1/nodes", "", "nodes", "list"),
    ("GET", r"/api/v1/pods", "", "pods", "list"),
    ("GET", r"/api/v1/namespaces/(?P<ns>[^/]+)/pods", "", "pods", "list"),
    ("PATCH", r"/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)", "", "pods", "patch"),
    ("GET", r"/apis/apps/v1/namespaces/(?P<ns>[^/]+)/deployments/(?P<name>[^/]+)/scale",
     "apps", "deployments/scale", "get"),
    ("PATCH", r"/apis/apps/v1/namespaces/(?P<ns>[^/]+)/deployments/(?P<name>[^/]+)/scale",
     "apps", "deployments/scale", "patch"),
    ("GET", r"/apis/metrics.k8s.io/v1beta1/nodes", "metrics.k8s.io", "nodes", "list"),
]
PATCH_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json")


class FakeApiServer:
    """Serves a `FakeCluster`; ``url`` is where. ``partitioned()`` takes it off the
    network for a while (the port refuses connections) and brings it back."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self.app = Starlette(routes=[Route("/{path:path}", self._handle,
                                           methods=["GET", "PATCH", "POST", "PUT", "DELETE"])])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> FakeApiServer:
        # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets that say so,
        # and without it every response waits out a delayed ACK (~40 ms).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(
            self.app, log_level="warning", lifespan="off", access_log=False, ws="none",
            http="h11", timeout_graceful_shutdown=1))
        self._server = server
        self._task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:  # uvicorn offers a flag, not an event
            if self._task.done():
                await self._task
            await asyncio.sleep(0.005)
        return self

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
        self._server = self._task = None

    @contextlib.asynccontextmanager
    async def partitioned(self) -> AsyncIterator[None]:
        await self.stop()
        try:
            yield
        finally:
            await self.start()

    # ---- dispatch -----------------------------------------------------------------------

    async def _handle(self, request: Request) -> Response:
        c = self.cluster
        path = request.url.path
        c.requests.append((request.method, path, request.url.query))
        if c.delay:
            await asyncio.sleep(c.delay)
        if c.token is not None and request.headers.get("authorization") != f"Bearer {c.token}":
            return status(401, "Unauthorized", "Unauthorized")
        route = next(((r, m) for r in ROUTES if r[0] == request.method
                      and (m := re.fullmatch(r[1], path))), None)
        if route is None:
            return PlainTextResponse("404 page not found", status_code=404)
        (_, _, group, resource, verb), m = route
        args = m.groupdict()
        ns = args.get("ns")
        if c.grants is not None:
            grant = next((g for g in c.grants if g.allows(group, resource, verb, ns)), None)
            if grant is None:
                where = f' in the namespace "{ns}"' if ns else " at the cluster scope"
                return status(403, "Forbidden", f'{resource} is forbidden: cannot {verb} '
                                                f'resource "{resource}" in API group "{group}"'
                                                f"{where}")
            c.used_grants.add(grant)
        if group == "metrics.k8s.io" and c.metrics is None:
            return PlainTextResponse("404 page not found", status_code=404)
        try:
            body: Obj = {}
            if request.method == "PATCH":
                kind = request.headers.get("content-type", "").split(";")[0]
                if kind not in PATCH_TYPES:
                    raise ApiFailure(415, "UnsupportedMediaType", f"{kind} is not supported")
                body = json.loads(await request.body())
            handler = getattr(self, f"_{resource.replace('/', '_')}_{verb}")
            return JSONResponse(handler(request, body, **args))
        except ApiFailure as exc:
            return status(exc.code, exc.reason, exc.message)

    def _page(self, request: Request, kind: str, items: list[Obj]) -> Obj:
        q = request.query_params
        if sel := q.get("labelSelector"):
            items = [i for i in items if label_match(sel, i["metadata"].get("labels", {}))]
        if sel := q.get("fieldSelector"):
            items = [i for i in items if field_match(sel, i)]
        start = int(q.get("continue") or 0)
        limit = int(q.get("limit") or 0) or len(items) or 1
        page = items[start:start + limit]
        meta: Obj = {"resourceVersion": str(self.cluster._rv)}
        if start + limit < len(items):
            meta["continue"] = str(start + limit)
        return {"kind": kind, "apiVersion": "v1", "metadata": meta,
                "items": copy.deepcopy(page)}

    def _nodes_list(self, request: Request, body: Obj) -> Obj:
        c = self.cluster
        if request.url.path.startswith("/apis/metrics"):
            assert c.metrics is not None
            return {"kind": "NodeMetricsList", "apiVersion": "metrics.k8s.io/v1beta1",
                    "metadata": {}, "items": [
                        {"metadata": {"name": n}, "timestamp": iso(c.now), "window": "10s",
                         "usage": {"cpu": cpu, "memory": mem}}
                        for n, (cpu, mem) in sorted(c.metrics.items())]}
        return self._page(request, "NodeList", [c.nodes[n] for n in sorted(c.nodes)])

    def _pods_list(self, request: Request, body: Obj, ns: str | None = None) -> Obj:
        pods = [p for (pns, _), p in sorted(self.cluster.pods.items()) if ns in (None, pns)]
        return self._page(request, "PodList", pods)

    def _pods_patch(self, request: Request, body: Obj, ns: str, name: str) -> Obj:
        c = self.cluster
        pod = c.pods.get((ns, name))
        if pod is None:
            raise ApiFailure(404, "NotFound", f'pods "{name}" not found')
        if set(body) - {"metadata"} or set(body.get("metadata", {})) - {"annotations", "labels"}:
            raise ApiFailure(422, "Invalid", "this fake patches pod labels and annotations only")
        value = body.get("metadata", {}).get("annotations", {}).get(COST)
        if value is not None:
            try:
                ok = -(2**31) <= int(value) < 2**31
            except ValueError:
                ok = False
            if not ok:
                raise ApiFailure(422, "Invalid", f'Pod "{name}" is invalid: metadata.'
                                 f'annotations[{COST}]: Invalid value: "{value}": must be a '
                                 "32bit integer")
        merge_patch(pod, body)
        for key in c.strip_annotations:
            pod["metadata"].get("annotations", {}).pop(key, None)
        pod["metadata"]["resourceVersion"] = str(c._next_rv())
        return copy.deepcopy(pod)

    def _scale_doc(self, dep: Deployment) -> Obj:
        active = len(self.cluster.pods_of(dep.namespace, dep.name))
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {"name": dep.name, "namespace": dep.namespace, "uid": dep.uid,
                             "resourceVersion": str(dep.rv)},
                "spec": {"replicas": dep.replicas},
                "status": {"replicas": active, "selector": ",".join(
                    f"{k}={v}" for k, v in sorted(dep.match_labels.items()))}}

    def _deployment(self, ns: str, name: str) -> Deployment:
        dep = self.cluster.deployments.get((ns, name))
        if dep is None:
            raise ApiFailure(404, "NotFound", f'deployments.apps "{name}" not found')
        return dep

    def _deployments_scale_get(self, request: Request, body: Obj, ns: str, name: str) -> Obj:
        return self._scale_doc(self._deployment(ns, name))

    def _deployments_scale_patch(self, request: Request, body: Obj, ns: str, name: str) -> Obj:
        c = self.cluster
        dep = self._deployment(ns, name)
        hooks, c.before_scale_patch = c.before_scale_patch, []
        for hook in hooks:
            hook()
        rv = body.get("metadata", {}).get("resourceVersion")
        if rv is not None and rv != str(dep.rv):
            raise ApiFailure(409, "Conflict", f'Operation cannot be fulfilled on deployments.apps'
                             f' "{name}": the object has been modified; please apply your '
                             "changes to the latest version and try again")
        replicas = body.get("spec", {}).get("replicas", dep.replicas)
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise ApiFailure(422, "Invalid", f'Scale.autoscaling "{name}" is invalid: '
                             f"spec.replicas: Invalid value: {replicas!r}")
        c.scale(ns, name, replicas)
        return self._scale_doc(dep)


# ---- test rigging -----------------------------------------------------------------------------

DEPLOY_DIR = __import__("pathlib").Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"


def controller_grants() -> list[Grant]:
    """What deploy/kubernetes grants the controller's ServiceAccount."""
    return grants_from_manifests(load_yaml_docs(sorted(DEPLOY_DIR.glob("*.yaml"))),
                                 account="roost-controller", account_ns="roost-system")


def write_kubeconfig(path: Any, url: str, *, token: str | None, namespace: str = "default"
                     ) -> Any:
    user: Obj = {"token": token} if token else {}
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "roost", "user": user}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "roost",
                                                  "namespace": namespace}}],
    }))
    return path
