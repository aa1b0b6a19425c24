"""Where the Kubernetes API server is, and how a pool names its Deployment.

Credentials come from, in order: an explicit kubeconfig file (``kubeconfig``), else the
pod's service account when running in a cluster, else ``$KUBECONFIG``, else
``~/.kube/config``. Service-account tokens are re-read from disk when they rotate
(lightkube does that).

A pool's orchestrator reference is ``[namespace/]deployment``, optionally followed by
``?nodeSelector=key=value,key2=value2``: node labels that narrow which nodes count as the
pool's capacity while the pool has no pod to learn its template's node selector from.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from urllib.parse import parse_qs

import msgspec
from lightkube.config.kubeconfig import KubeConfig, SingleConfig
from lightkube.core.exceptions import ConfigError

from roost.controller import tomlfile

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_LABEL_KEY = re.compile(r"([a-z0-9.-]{1,253}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True, slots=True)
class KubernetesSettings:
    kubeconfig: str | None = None
    """A kubeconfig file; None: in-cluster service account, then $KUBECONFIG, then
    ~/.kube/config."""
    context: str | None = None
    """A kubeconfig context; None: the file's current context."""
    namespace: str | None = None
    """Namespace of references that name none; None: the config's (in a cluster: the
    controller's own namespace)."""
    timeout: float = 5.0
    """Seconds for each API request."""
    use_metrics: bool = True
    """Read node usage from metrics.k8s.io when it answers; never required."""
    revision_keys: tuple[str, ...] = ("roost.dev/revision", "app.kubernetes.io/version")
    """Pod labels (then annotations) that carry the release; else the template hash."""
    cluster_view_ttl: float = 2.0
    """Seconds the cluster-wide node and pod lists are shared between pools (one tick
    reads every pool at once). 0 reads them for every pool."""
    removal_patience: float = 300.0
    """Seconds after a scale-down before a removal no pod has left is reported stuck."""
    field_manager: str = "roost-controller"
    service_account_dir: Path = field(default=SERVICE_ACCOUNT_DIR)

    def validate(self) -> KubernetesSettings:
        if self.timeout <= 0:
            raise ValueError("kubernetes timeout must be > 0")
        if self.cluster_view_ttl < 0 or self.removal_patience < 0:
            raise ValueError("kubernetes durations must be >= 0")
        if self.namespace is not None and not _DNS_LABEL.fullmatch(self.namespace):
            raise ValueError(f"{self.namespace!r} is not a namespace name")
        return self


def load_settings(path: Path) -> KubernetesSettings:
    """Settings from a TOML file: a ``[kubernetes]`` table, or the same keys at the top
    level. Relative paths in it are relative to the file. ValueError says what is wrong."""
    table = tomlfile.section(tomlfile.read(path), "kubernetes", path)
    unknown = sorted(set(table) - {f.name for f in fields(KubernetesSettings)})
    if unknown:
        raise ValueError(f"{path}: unknown kubernetes settings: {', '.join(unknown)}")
    tomlfile.resolve_paths(table, ("kubeconfig", "service_account_dir"), path)
    try:
        return msgspec.convert(table, KubernetesSettings, strict=False).validate()
    except msgspec.ValidationError as exc:
        raise ValueError(f"{path}: {exc}") from None


def load_config(settings: KubernetesSettings) -> SingleConfig:
    """The cluster, user and default namespace to talk to, or ValueError saying why none."""
    try:
        if settings.kubeconfig:
            cfg = KubeConfig.from_file(settings.kubeconfig).get(settings.context)
        elif (settings.service_account_dir / "token").is_file() and os.environ.get(
            "KUBERNETES_SERVICE_HOST"
        ):
            cfg = KubeConfig.from_service_account(settings.service_account_dir).get()
        else:
            path = os.environ.get("KUBECONFIG") or "~/.kube/config"
            cfg = KubeConfig.from_file(path.split(os.pathsep)[0]).get(settings.context)
    except ConfigError as exc:
        raise ValueError(f"kubernetes config: {exc}") from None
    except (OSError, KeyError, TypeError) as exc:
        raise ValueError(f"kubernetes config: {type(exc).__name__}: {exc}") from None
    if cfg is None:  # pragma: no cover - get() raises instead
        raise ValueError("kubernetes config: no context")
    return cfg


@dataclass(frozen=True, slots=True)
class DeploymentRef:
    namespace: str
    name: str
    node_selector: Mapping[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_ref(ref: str, default_namespace: str) -> DeploymentRef:
    """``[namespace/]deployment[?nodeSelector=k=v,...]``, or ValueError saying what's wrong."""
    path, _, query = ref.partition("?")
    namespace, slash, deployment = path.rpartition("/")
    if not slash:
        namespace = default_namespace
    if not _DNS_LABEL.fullmatch(namespace):
        raise ValueError(f"{ref!r}: {namespace!r} is not a namespace name")
    if not _DNS_SUBDOMAIN.fullmatch(deployment):
        raise ValueError(f"{ref!r}: {deployment!r} is not a Deployment name")
    selector: dict[str, str] = {}
    params = parse_qs(query, keep_blank_values=True, strict_parsing=False) if query else {}
    for key, values in params.items():
        if key != "nodeSelector":
            raise ValueError(f"{ref!r}: unknown option {key!r} (only nodeSelector)")
        for pair in ",".join(values).split(","):
            k, eq, v = pair.partition("=")
            if not eq or not _LABEL_KEY.fullmatch(k):
                raise ValueError(f"{ref!r}: nodeSelector wants key=value pairs, got {pair!r}")
            selector[k] = v
    return DeploymentRef(namespace, deployment, selector)
