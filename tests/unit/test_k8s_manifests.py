"""deploy/kubernetes, checked without a cluster.

No API server runs here, so server-side apply and ``--dry-run=server`` are out. Instead
every object is validated against the Kubernetes OpenAPI schemas (strict: unknown fields
fail) with ``kubernetes-validate``, whose schemas ship inside the wheel: the test blocks
outbound connections to prove it needs no network. What a schema cannot see is checked
by hand: names that refer to each other, the controller's config files parsing with the
controller's own loaders, and the ServiceMonitor (a CRD, not in the core schemas).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from roost.controller import config as controller_config
from roost.controller.adapters.k8s.config import load_settings
from roost.controller.adapters.kubernetes import ACCESS

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
VERSIONS = ("1.28.0", "1.33.0", kubernetes_validate.latest_version())
"""The oldest Kubernetes with sidecar containers' restartPolicy (what the adapter reads),
a middle one, and the newest the validator knows."""
Obj = dict[str, Any]


def _docs(pattern: str = "*.yaml") -> list[tuple[str, Obj]]:
    out = []
    for path in sorted(DEPLOY.glob(pattern)):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((path.name, doc))
    return out


def _one(kind: str, name: str) -> Obj:
    found = [d for _, d in _docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name)
    return found[0]


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def refuse(self: socket.socket, address: object) -> None:
        raise AssertionError(f"the manifest check tried to reach {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    yield


def test_there_are_manifests() -> None:
    kinds = sorted({d["kind"] for _, d in _docs()})
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment",
                     "Namespace", "PodDisruptionBudget", "Role", "RoleBinding", "Service",
                     "ServiceAccount"]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("file", "doc"), _docs(),
                         ids=[f"{f}:{d['kind']}/{d['metadata']['name']}" for f, d in _docs()])
def test_every_object_matches_the_openapi_schema(offline: None, file: str, doc: Obj,
                                                  version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def test_a_schema_violation_is_caught(offline: None) -> None:
    bad = yaml.safe_load((DEPLOY / "30-controller.yaml").read_text().split("---")[0])
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[-1], strict=True)


def test_the_controller_deployment(tmp_path: Path) -> None:
    dep = _one("Deployment", "roost-controller")
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"][
        "metadata"]["labels"].items()
    (c,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    _one("ServiceAccount", pod["serviceAccountName"])
    cm = _one("ConfigMap", next(v["configMap"]["name"] for v in pod["volumes"]
                                if "configMap" in v))
    # The controller's settings parse with the controller's own loader and listen where
    # the container port and the probes look.
    mount = next(m["mountPath"] for m in c["volumeMounts"] if m["name"] == "config")
    assert c["args"] == ["controller", "--config", f"{mount}/controller.toml"]
    env = {e["name"]: e for e in c["env"]}
    assert env["ROOST_CONTROLLER_KUBERNETES_CONFIG"]["value"] == f"{mount}/kubernetes.toml"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["ROOST_CONTROLLER_DSN"]["valueFrom"]["secretKeyRef"]["name"] == "roost-db"
    for key, text in cm["data"].items():
        (tmp_path / key).write_text(text)
    cfg = controller_config.build(controller_config.load_file(tmp_path / "controller.toml"))
    assert cfg.http_port == ports["http"] and cfg.http_host == "0.0.0.0"
    assert cfg.shadow, "a first install plans in shadow mode"
    k8s = load_settings(tmp_path / "kubernetes.toml")
    assert k8s.namespace == "roost-workers" and k8s.kubeconfig is None
    svc = _one("Service", "roost-controller")
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"][
        "labels"].items()
    assert [(p["name"], p["targetPort"]) for p in svc["spec"]["ports"]] == [("http", "http")]


def test_the_example_worker() -> None:
    dep = _one("Deployment", "roost-worker")
    assert "replicas" not in dep["spec"], "roost owns the count; apply must not reset it"
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["args"][0] == "worker" and "--pool" in c["args"]
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    label = env["ROOST_REVISION"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert label == "metadata.labels['app.kubernetes.io/version']"
    assert "app.kubernetes.io/version" in dep["spec"]["template"]["metadata"]["labels"]
    assert c["resources"]["requests"] == {"cpu": "500m", "memory": "512Mi"}
    # Workers use the least-privilege role's Secret, never the controller's.
    assert env["ROOST_DSN"]["valueFrom"]["secretKeyRef"]["name"] == "roost-worker-db"


def test_rbac_grants_exactly_what_the_adapter_uses() -> None:
    granted = set()
    for _, d in _docs():
        if d["kind"] in ("Role", "ClusterRole"):
            for rule in d["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        for verb in rule["verbs"]:
                            granted.add((group, resource, verb, d["kind"] == "ClusterRole"))
    assert granted == {(a.group, a.resource, a.verb, a.cluster_wide) for a in ACCESS}
    for kind, binding in (("ClusterRoleBinding", "roost-controller"),
                          ("RoleBinding", "roost-controller")):
        b = _one(kind, binding)
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "roost-controller",
                                  "namespace": "roost-system"}]
        _one(b["roleRef"]["kind"], b["roleRef"]["name"])
    assert _one("Role", "roost-controller")["metadata"]["namespace"] == "roost-workers"


def test_the_servicemonitor_selects_the_controller_service() -> None:
    (_, sm), = _docs("optional/*.yaml")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1" and sm["kind"] == "ServiceMonitor"
    svc = _one("Service", "roost-controller")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [svc["metadata"]["namespace"]]
    ports = {p["name"] for p in svc["spec"]["ports"]}
    assert [(e["port"], e["path"]) for e in sm["spec"]["endpoints"]] == [("http", "/metrics")]
    assert "http" in ports
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):  # why it is checked by hand
        kubernetes_validate.validate(sm, VERSIONS[-1], strict=True)
