"""Pure reads of pods and nodes (roost.controller.adapters.k8s.pods) and the adapter's
configuration (k8s.config), on hand-made objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
import pytest
from lightkube import ApiError
from lightkube.models.core_v1 import Node, Pod

from roost.controller.adapters.k8s import pods as P
from roost.controller.adapters.k8s.config import (
    DeploymentRef,
    KubernetesSettings,
    load_config,
    load_settings,
    parse_ref,
)
from roost.controller.adapters.k8s.errors import ScaleConflict, api_errors
from roost.controller.orchestrator import (
    OrchestratorError,
    OrchestratorUnavailable,
    ScaleRejected,
    UnknownPool,
)


def pod(*, phase: str = "Running", ready: bool = True, node: str | None = "n1",
        annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
        deleting: bool = False, spec: dict[str, Any] | None = None) -> Pod:
    meta: dict[str, Any] = {"name": "p", "annotations": annotations or {},
                            "labels": labels or {}}
    if deleting:
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    body: dict[str, Any] = {"containers": [{"name": "c"}], **(spec or {})}
    if node:
        body["nodeName"] = node
    return Pod.from_dict({"metadata": meta, "spec": body, "status": {
        "phase": phase, "conditions": [{"type": "Ready", "status": str(ready)}]}})


def node(*, labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None,
         ready: bool = True, pressure: bool = False, cordoned: bool = False,
         alloc: dict[str, str] | None = None) -> Node:
    return Node.from_dict({
        "metadata": {"name": "n1", "labels": labels or {}},
        "spec": {"taints": taints or [], "unschedulable": cordoned},
        "status": {"allocatable": alloc or {"cpu": "3900m", "memory": "15Gi"}, "conditions": [
            {"type": "Ready", "status": str(ready)},
            {"type": "MemoryPressure", "status": str(pressure)}]},
    })


def c(cpu: str, mem: str, **kw: Any) -> dict[str, Any]:
    return {"name": f"c{cpu}{mem}", "resources": {"requests": {"cpu": cpu, "memory": mem}},
            **kw}


@pytest.mark.parametrize(("kw", "serving", "why"), [
    ({}, True, ""),
    ({"ready": False}, False, "not ready"),
    ({"node": None, "phase": "Pending", "ready": False}, False, "not scheduled"),
    ({"phase": "Pending", "ready": False}, False, "phase Pending"),
    ({"phase": "Unknown"}, False, "phase Unknown"),
    ({"deleting": True}, False, "terminating"),
    ({"phase": "Succeeded", "ready": False}, False, "terminating"),
])
def test_serving_is_what_the_replicaset_ranks_last(kw: dict[str, Any], serving: bool,
                                                    why: str) -> None:
    p = pod(**kw)
    assert P.is_serving(p) is serving
    assert P.why_not_serving(p) == why


@pytest.mark.parametrize(("value", "cost"), [
    (None, 0), ("-1000", -1000), (" 7 ", 7), ("abc", 0), ("2147483647", 2**31 - 1),
    ("2147483648", 0), ("-2147483649", 0),
])
def test_deletion_cost_reads_like_the_replicaset_controller(value: str | None, cost: int
                                                            ) -> None:
    p = pod(annotations={P.DELETION_COST: value} if value is not None else {})
    assert P.deletion_cost(p) == cost


def test_revision_prefers_release_labels_then_annotations_then_the_template_hash() -> None:
    keys = ("roost.dev/revision", "app.kubernetes.io/version")
    assert P.revision(pod(labels={P.TEMPLATE_HASH: "abc"}), keys) == "abc"
    assert P.revision(pod(labels={P.TEMPLATE_HASH: "abc", "app.kubernetes.io/version": "v2"}),
                      keys) == "v2"
    assert P.revision(pod(labels={"app.kubernetes.io/version": "v2"},
                          annotations={"roost.dev/revision": "r9"}), keys) == "r9"


def test_requests_follow_the_schedulers_formula() -> None:
    plain = pod(spec={"containers": [c("250m", "256Mi"), c("1", "1Gi")]})
    assert (P.pod_requests(plain).cpu_milli, P.pod_requests(plain).mem_mib) == (1250, 1280)
    # An init container heavier than the app sets the peak; a sidecar adds to both.
    init = pod(spec={"containers": [c("500m", "512Mi")],
                     "initContainers": [c("2", "128Mi")]})
    assert (P.pod_requests(init).cpu_milli, P.pod_requests(init).mem_mib) == (2000, 512)
    sidecar = pod(spec={"containers": [c("500m", "512Mi")],
                        "initContainers": [c("100m", "64Mi", restartPolicy="Always"),
                                           c("1", "100Mi")],
                        "overhead": {"cpu": "50m", "memory": "10Mi"}})
    r = P.pod_requests(sidecar)
    # max(500+100, 100+1000) = 1100 m; max(512+64, 64+100) = 576 Mi; plus the overhead.
    assert (r.cpu_milli, r.mem_mib) == (1150, 586)
    assert P.pod_requests(pod(spec={"containers": [{"name": "none"}]})) == P.Requests()


def test_node_figures_and_conditions() -> None:
    n = node(pressure=True)
    assert P.allocatable(n) == P.Requests(3900, 15 * 2**30)
    assert P.memory_pressure(n) and P.node_ready(n)
    assert not P.node_ready(node(ready=False))


@pytest.mark.parametrize(("n", "template", "selector", "why"), [
    (node(), None, {}, ""),
    (node(cordoned=True), None, {}, "cordoned"),
    (node(ready=False), None, {}, "not Ready"),
    (node(labels={"pool": "a"}), None, {"pool": "b"}, "label pool=b missing"),
    (node(labels={"pool": "a"}), pod(spec={"nodeSelector": {"pool": "a"}}), {}, ""),
    (node(), pod(spec={"nodeSelector": {"pool": "a"}}), {}, "label pool=a missing"),
    (node(taints=[{"key": "gpu", "effect": "NoSchedule"}]), None, {}, "taint gpu:NoSchedule"),
    (node(taints=[{"key": "gpu", "effect": "PreferNoSchedule"}]), None, {}, ""),
    (node(taints=[{"key": "gpu", "value": "a100", "effect": "NoExecute"}]),
     pod(spec={"tolerations": [{"key": "gpu", "operator": "Equal", "value": "a100"}]}), {}, ""),
    (node(taints=[{"key": "gpu", "value": "a100", "effect": "NoSchedule"}]),
     pod(spec={"tolerations": [{"key": "gpu", "value": "h100"}]}), {}, "taint gpu:NoSchedule"),
    (node(taints=[{"key": "x", "effect": "NoSchedule"}]),
     pod(spec={"tolerations": [{"operator": "Exists"}]}), {}, ""),
])
def test_which_nodes_could_take_one_more_pod(n: Node, template: Pod | None,
                                             selector: dict[str, str], why: str) -> None:
    assert P.why_not_eligible(n, template, selector) == why


def _affinity(*terms: list[dict[str, Any]]) -> Pod:
    return pod(spec={"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": t} for t in terms]}}}})


@pytest.mark.parametrize(("exprs", "fits"), [
    ([{"key": "zone", "operator": "In", "values": ["a", "b"]}], True),
    ([{"key": "zone", "operator": "NotIn", "values": ["a"]}], False),
    ([{"key": "zone", "operator": "Exists"}, {"key": "gpu", "operator": "DoesNotExist"}], True),
    ([{"key": "cores", "operator": "Gt", "values": ["8"]}], True),
    ([{"key": "cores", "operator": "Lt", "values": ["8"]}], False),
    ([{"key": "cores", "operator": "Gt", "values": ["x"]}], False),
])
def test_required_node_affinity(exprs: list[dict[str, Any]], fits: bool) -> None:
    n = node(labels={"zone": "a", "cores": "16"})
    assert (P.why_not_eligible(n, _affinity(exprs), {}) == "") is fits
    # Terms are alternatives: one that fits is enough.
    other = [{"key": "zone", "operator": "In", "values": ["a"]}]
    assert P.why_not_eligible(n, _affinity(exprs, other), {}) == ""


# ---- configuration --------------------------------------------------------------------------


@pytest.mark.parametrize(("ref", "want"), [
    ("workers", DeploymentRef("dflt", "workers")),
    ("ns-1/workers.v2", DeploymentRef("ns-1", "workers.v2")),
    ("ns/w?nodeSelector=pool=cpu,topology.kubernetes.io/zone=a",
     DeploymentRef("ns", "w", {"pool": "cpu", "topology.kubernetes.io/zone": "a"})),
])
def test_pool_references(ref: str, want: DeploymentRef) -> None:
    assert parse_ref(ref, "dflt") == want


@pytest.mark.parametrize("ref", ["", "Ns/w", "ns/", "a/b/c", "ns/W", "ns/w?zone=a",
                                 "ns/w?nodeSelector=novalue", "-ns/w"])
def test_bad_pool_references(ref: str) -> None:
    with pytest.raises(ValueError):
        parse_ref(ref, "dflt")


def test_settings_from_a_file(tmp_path: Path) -> None:
    f = tmp_path / "k.toml"
    f.write_text('[kubernetes]\nkubeconfig = "kc.yaml"\nnamespace = "w"\ntimeout = 2\n')
    s = load_settings(f)
    assert (s.kubeconfig, s.namespace, s.timeout) == (str(tmp_path / "kc.yaml"), "w", 2.0)
    f.write_text('namespace = "w"\n')  # top level works too
    assert load_settings(f).namespace == "w"
    for bad in ('typo = 1\n', 'timeout = 0\n', 'namespace = "Not_A_Name"\n',
                'timeout = "soon"\n', "[[kubernetes]]\n", "= broken"):
        f.write_text(bad)
        with pytest.raises(ValueError):
            load_settings(f)
    with pytest.raises(ValueError, match="cannot read"):
        load_settings(tmp_path / "missing.toml")


def test_in_cluster_service_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("tok")
    (sa / "namespace").write_text("roost-system")
    (sa / "ca.crt").write_text("")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    cfg = load_config(KubernetesSettings(service_account_dir=sa))
    assert cfg.cluster.server == "https://10.0.0.1:443"
    assert cfg.namespace == "roost-system"
    assert cfg.user is not None and cfg.user.token == "tok"


def test_kubeconfig_from_the_environment_and_missing_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kc = tmp_path / "kc"
    kc.write_text("apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                  "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:1'}}]\n"
                  "contexts: [{name: c, context: {cluster: k, namespace: ns}}]\n")
    monkeypatch.setenv("KUBECONFIG", str(kc))
    nowhere = KubernetesSettings(service_account_dir=tmp_path / "none")
    assert load_config(nowhere).namespace == "ns"
    with pytest.raises(ValueError, match="Context 'other' not found"):
        load_config(KubernetesSettings(service_account_dir=tmp_path / "none", context="other"))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="kubernetes config"):
        load_config(nowhere)


# ---- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "body", "kind"), [
    (404, {"kind": "Status", "code": 404, "message": "not found"}, UnknownPool),
    (409, {"kind": "Status", "code": 409, "message": "modified"}, ScaleConflict),
    (403, {"kind": "Status", "code": 403, "message": "forbidden"}, OrchestratorError),
    (422, {"kind": "Status", "code": 422, "message": "invalid"}, ScaleRejected),
    (429, {"kind": "Status", "code": 429, "message": "slow down"}, OrchestratorUnavailable),
    (503, None, OrchestratorUnavailable),
    (418, None, OrchestratorError),
])
def test_api_errors_become_the_protocols_errors(code: int, body: dict[str, Any] | None,
                                                kind: type[Exception]) -> None:
    request = httpx2.Request("GET", "http://k/api")
    response = (httpx2.Response(code, json=body, request=request) if body
                else httpx2.Response(code, text="oops", request=request))
    exc: Exception = (ApiError(request=request, response=response) if body else
                      httpx2.HTTPStatusError("x", request=request, response=response))
    with pytest.raises(kind) as info, api_errors("reading", UnknownPool):
        raise exc
    assert type(info.value) is kind and f"HTTP {code}" in str(info.value)
    with pytest.raises(OrchestratorUnavailable), api_errors("reading"):
        raise httpx2.ConnectError("refused", request=request)
    with pytest.raises(KeyError), api_errors("reading"):  # not a client error: not ours
        raise KeyError("bug")
