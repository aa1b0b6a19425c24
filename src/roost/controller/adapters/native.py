"""The ``native`` orchestrator: a pool's replicas are instances on roost's own nodes,
launched and terminated through roost's EC2 API, so they go through the gateway's
placement and get its capacity answers like any other launch.

**The pool ref** is ``key=value`` pairs separated by ``;`` (spaces around them ignored)::

    type=t3.small; target=myapp.tasks:handle; concurrency=4; app_dir=/srv/myapp; revision=r42

- ``type`` (required): the EC2 instance type of one worker.
- ``target`` (required): the worker's ``module:function``.
- ``concurrency``, ``app_dir``, ``revision`` (optional): passed to ``roost worker``.

Each replica is one instance of ``type`` whose user data (the shell image) runs::

    exec <python> -m roost worker --pool <pool id> <target> [--concurrency N] [--app-dir D]

with an enrollment token and the controller's URL in ``ROOST_WORKER_ENROLL_TOKEN`` and
``ROOST_WORKER_ENROLL_URL``, never a database credential: the worker exchanges the token
for the DSN of the least-privilege worker role (`roost.controller.enrollment`), which
`enroll` checks against this pool's instances. The node sets ``ROOST_INSTANCE_ID``,
which the worker reports as its orchestrator ref, so the drained worker names the
instance to terminate. Instances carry the tag ``roost:pool=<pool id>``; their
termination priority is the tag ``roost:termination-priority`` (absent means 0).

**Replicas** are the pool's pending and running instances; running ones are ready.
``scale_pool`` up launches the difference in one RunInstances (MinCount 1, so what fits
starts and the next tick tops up) with a ClientToken derived from the pool, the request
id and the target, so a retried decision never launches twice. Placement errors come
back through the orchestrator tree: ``InsufficientInstanceCapacity`` is `ScaleRejected`
(the gateway answered and refused), an unknown instance type is `UnknownPool`, an
unreachable gateway or a 5xx is `OrchestratorUnavailable`. Scale-down terminates, in
Kubernetes' order, pending instances first, then the lowest termination priority, then
the newest: with the controller's drained worker at -1000, that worker's instance.

**Lost nodes.** An instance whose ``DescribeInstanceStatus`` system status is
``impaired`` (its node is silent) is not a replica: the plan sees the pool short and
launches a replacement, and the instance is terminated (deferred by the gateway until
its node is back or forgotten), so a returning node never adds a worker on top of its
replacement.

**Node figures** come from the gateway's admin API (``GET /api/v1/nodes``): live,
non-draining nodes big enough for one worker, with allocatable and used (allocatable
minus free) CPU and memory.

botocore is synchronous, so each EC2 call runs in a thread under a timeout.

**Settings** come from `roost up` (its own gateway, keys and Postgres) or, for a
standalone controller, from a TOML file read by `load_settings` (the DSN and the
controller URL default to the controller's own; the keys may come from
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``)::

    endpoint = "http://gateway.internal:8773"
    region = "roost-1"
    access_key_id = "AKIA..."
    secret_access_key = "..."
    controller_url = "http://controller.internal:9180"  # where workers enroll
    dsn = "postgresql://roost_worker:...@db.internal/roost"  # given to enrolled workers
    python = "/opt/app/venv/bin/python"            # on the nodes
    timeout = 5
    enroll_ttl = 600                               # seconds after launch a worker may enroll

``dsn`` should name the ``roost_worker`` role (`roost db worker-role` makes it and prints
its DSN); it defaults to the controller's own, which works but gives workers far more
than they need.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import BotoCoreError, ClientError
from botocore.session import get_session

from roost.controller import enrollment, tomlfile
from roost.controller.orchestrator import (
    InstanceView,
    NodeFigures,
    OrchestratorError,
    OrchestratorUnavailable,
    PoolRef,
    PoolState,
    ScaleRejected,
    ScaleResult,
    UnknownInstance,
    UnknownPool,
    check_replicas,
)
from roost.domain.catalog import BUILTIN
from roost.domain.errors import InsufficientInstanceCapacity, InvalidParameterValue, from_code
from roost.domain.images import DEFAULT_IMAGE_ID
from roost.store.workers import MAX_SLOTS

log = logging.getLogger(__name__)

POOL_TAG = "roost:pool"
PRIORITY_TAG = "roost:termination-priority"
_LIVE_STATES = ("pending", "running")
_REF_KEYS = frozenset({"type", "target", "concurrency", "app_dir", "revision"})


@dataclass(frozen=True, slots=True)
class NativeSettings:
    """Where roost's EC2 API is and what the workers it launches connect to."""

    endpoint: str
    region: str
    access_key_id: str
    secret_access_key: str
    dsn: str
    """The workers' DSN: handed out only to an instance that enrolls, never put in user
    data."""
    controller_url: str
    """The controller's HTTP API as the workers reach it, to enroll."""
    python: str = sys.executable
    image_id: str = DEFAULT_IMAGE_ID
    timeout: float = 10.0
    """Seconds for one EC2 or admin API call, connection included."""
    enroll_ttl: float = 600.0
    """Seconds after its launch during which an instance may enroll (once)."""


def load_settings(path: Path, *, dsn: str, controller_url: str = "",
                  environ: Mapping[str, str] | None = None) -> NativeSettings:
    """`NativeSettings` from a TOML file, or ValueError naming what is wrong. ``dsn`` and
    ``controller_url`` (the controller's own) are the defaults of those keys."""
    env = os.environ if environ is None else environ
    doc = tomlfile.read(path)
    doc.setdefault("dsn", dsn)
    if controller_url:
        doc.setdefault("controller_url", controller_url)
    for key, var in (("access_key_id", "AWS_ACCESS_KEY_ID"),
                     ("secret_access_key", "AWS_SECRET_ACCESS_KEY")):
        if key not in doc and var in env:
            doc[key] = env[var]
    try:
        return msgspec.convert(doc, NativeSettings)
    except msgspec.ValidationError as exc:
        raise ValueError(f"{path}: {exc}") from None


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """A parsed pool ref."""

    instance_type: str
    target: str
    concurrency: int | None = None
    app_dir: str | None = None
    revision: str | None = None


def parse_ref(ref: str) -> PoolSpec:
    """The pool ref's fields, or ValueError saying what is wrong."""
    fields: dict[str, str] = {}
    for part in ref.split(";"):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in _REF_KEYS or not value:
            raise ValueError(f"pool ref part {part.strip()!r}: want one of "
                             f"{', '.join(sorted(_REF_KEYS))} as key=value")
        fields[key] = value
    if "type" not in fields or "target" not in fields:
        raise ValueError(f"pool ref {ref!r} needs type=... and target=module:function")
    if ":" not in fields["target"]:
        raise ValueError(f"pool ref target {fields['target']!r} is not module:function")
    concurrency = fields.get("concurrency")
    if concurrency is not None and (not concurrency.isdigit()
                                    or not 1 <= int(concurrency) <= MAX_SLOTS):
        raise ValueError(f"pool ref concurrency {concurrency!r} must be an integer within "
                         f"1..{MAX_SLOTS}")
    return PoolSpec(fields["type"], fields["target"],
                    int(concurrency) if concurrency is not None else None,
                    fields.get("app_dir"), fields.get("revision"))


def user_data(pool_id: str, spec: PoolSpec, settings: NativeSettings, token: str) -> str:
    """The shell script one replica's instance runs: an enrollment token, no secret."""
    env = {enrollment.ENV_TOKEN: token,
           enrollment.ENV_URL: settings.controller_url.rstrip("/")}
    if spec.revision:
        env["ROOST_WORKER_REVISION"] = spec.revision
    cmd = [settings.python, "-m", "roost", "worker", "--pool", pool_id, spec.target]
    if spec.concurrency is not None:
        cmd += ["--concurrency", str(spec.concurrency)]
    if spec.app_dir is not None:
        cmd += ["--app-dir", spec.app_dir]
    lines = [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines.append("exec " + shlex.join(cmd))
    return "\n".join(lines) + "\n"


def client_token(pool_id: str, request_id: str, replicas: int, *salt: str) -> str:
    """At most 64 characters, as EC2 wants, and the same for a retried decision."""
    text = "\0".join([pool_id, request_id, str(replicas), *salt])
    return hashlib.sha256(text.encode()).hexdigest()[:64]


@dataclass(frozen=True, slots=True)
class _Instance:
    instance_id: str
    state: str
    launch_time: str
    priority: int

    @property
    def ready(self) -> bool:
        return self.state == "running"


def _priority(tags: Mapping[str, str]) -> int:
    try:
        return int(tags.get(PRIORITY_TAG, "0"))
    except ValueError:
        return 0


def removal_order(instances: list[_Instance]) -> list[_Instance]:
    """Kubernetes' order: not ready first, then the lowest priority, then the newest."""
    by_newest = sorted(instances, key=lambda i: (i.launch_time, i.instance_id), reverse=True)
    return sorted(by_newest, key=lambda i: (i.ready, i.priority))


class NativeOrchestrator:
    name = "native"

    def __init__(self, settings: NativeSettings, *, now: Callable[[], float]) -> None:
        self.settings = settings
        self._now = now
        self._ec2: Any = get_session().create_client(
            "ec2", endpoint_url=settings.endpoint, region_name=settings.region,
            aws_access_key_id=settings.access_key_id,
            aws_secret_access_key=settings.secret_access_key,
            config=Config(connect_timeout=settings.timeout, read_timeout=settings.timeout,
                          retries={"total_max_attempts": 1}),
        )
        self._http = httpx.AsyncClient(timeout=settings.timeout)
        self._auth = SigV4Auth(Credentials(settings.access_key_id, settings.secret_access_key),
                               "ec2", settings.region)
        self._enroll_key = enrollment.derive_key(settings.secret_access_key)

    # ---- the protocol -----------------------------------------------------------------

    async def pool_state(self, pool: PoolRef) -> PoolState:
        spec = self._spec(pool)
        instances = await self._instances(pool)
        nodes = await self._nodes(spec)
        return PoolState(
            target_replicas=len(instances),
            instances=tuple(InstanceView(i.instance_id, i.ready, i.priority)
                            for i in instances),
            nodes=nodes,
            observed_at=self._now(),
        )

    async def scale_pool(self, pool: PoolRef, replicas: int, *, request_id: str) -> ScaleResult:
        check_replicas(replicas)
        spec = self._spec(pool)
        instances = await self._instances(pool)
        previous = len(instances)
        if replicas > previous:
            live = sorted(i.instance_id for i in instances)
            await self._launch(pool, spec, replicas - previous,
                               client_token(pool.pool_id, request_id, replicas, *live))
        elif replicas < previous:
            doomed = removal_order(instances)[: previous - replicas]
            await self._ec2_call("TerminateInstances",
                                 InstanceIds=[i.instance_id for i in doomed])
        return ScaleResult(previous, replicas)

    async def set_instance_termination_priority(
        self, pool: PoolRef, instance_ref: str, *, priority: int
    ) -> None:
        self._spec(pool)
        if instance_ref not in {i.instance_id for i in await self._instances(pool)}:
            raise UnknownInstance(f"pool {pool.pool_id!r} has no instance {instance_ref!r}")
        await self._ec2_call("CreateTags", Resources=[instance_ref],
                             Tags=[{"Key": PRIORITY_TAG, "Value": str(priority)}])

    async def enroll(self, token: str, instance_id: str) -> str | None:
        """The pool an enrollment token was issued for, if ``instance_id`` is a live
        instance of that pool launched less than ``enroll_ttl`` ago; else None. (That
        the instance enrolls only once is the caller's to record.)"""
        found = enrollment.verify(self._enroll_key, token)
        if found is None or not enrollment.INSTANCE_ID.fullmatch(instance_id):
            return None
        try:
            page = await self._ec2_call("DescribeInstances", InstanceIds=[instance_id], Filters=[
                {"Name": f"tag:{POOL_TAG}", "Values": [found.pool_id]},
                {"Name": "instance-state-name", "Values": list(_LIVE_STATES)},
            ])
        except OrchestratorUnavailable:
            raise
        except OrchestratorError:
            return None  # InvalidInstanceID.NotFound and the like
        for reservation in page.get("Reservations", []):
            for inst in reservation.get("Instances", []):
                launched = inst.get("LaunchTime")
                age = self._now() - launched.timestamp() if launched else float("inf")
                if inst["InstanceId"] == instance_id and age <= self.settings.enroll_ttl:
                    return found.pool_id
        return None

    async def close(self) -> None:
        await self._http.aclose()
        self._ec2.close()

    # ---- internals ----------------------------------------------------------------------

    def _spec(self, pool: PoolRef) -> PoolSpec:
        try:
            return parse_ref(pool.ref)
        except ValueError as exc:
            raise UnknownPool(str(exc)) from None

    async def _launch(self, pool: PoolRef, spec: PoolSpec, count: int, token: str) -> None:
        """Launch up to ``count``. The token is a function of the decision and of the
        pool's live instances, so a retry finds its first launch. The same decision
        taken again later (the controller's request id names a target, not a moment)
        can meet a token whose launch is over: every instance it returns is gone. Then
        the launch is repeated under a token salted with those ids, still deterministic."""
        tags = [{"Key": POOL_TAG, "Value": pool.pool_id}]
        for _ in range(4):
            enroll = enrollment.issue(self._enroll_key, pool.pool_id, token)
            reply = await self._ec2_call(
                "RunInstances", ImageId=self.settings.image_id,
                InstanceType=spec.instance_type, MinCount=1, MaxCount=count,
                ClientToken=token,
                UserData=user_data(pool.pool_id, spec, self.settings, enroll),
                TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
            )
            launched = reply.get("Instances", [])
            if any(i["State"]["Name"] in _LIVE_STATES for i in launched) or not launched:
                return
            token = client_token(pool.pool_id, token, count,
                                 *sorted(i["InstanceId"] for i in launched))
        raise ScaleRejected(f"pool {pool.pool_id}: ClientToken kept naming finished launches")

    async def _instances(self, pool: PoolRef) -> list[_Instance]:
        """The pool's replicas: its pending and running instances, less those on a lost
        node, which are terminated (deferred until the node is back or forgotten) so a
        returning node does not bring back workers already replaced."""
        out = await self._listed(pool)
        lost = await self._impaired({i.instance_id for i in out})
        if lost:
            log.warning("pool %s: %d instances on lost nodes are gone, replacing them: %s",
                        pool.pool_id, len(lost), ", ".join(sorted(lost)))
            try:
                await self._ec2_call("TerminateInstances", InstanceIds=sorted(lost))
            except OrchestratorError as exc:  # not counted either way; tried next tick
                log.warning("pool %s: terminating instances on lost nodes: %s",
                            pool.pool_id, exc)
        return [i for i in out if i.instance_id not in lost]

    async def _impaired(self, ids: set[str]) -> set[str]:
        """Those of ``ids`` whose system status is impaired: their node is lost."""
        if not ids:
            return set()
        found: set[str] = set()
        kwargs: dict[str, Any] = {"IncludeAllInstances": True, "Filters": [
            {"Name": "system-status.status", "Values": ["impaired"]}]}
        while True:
            page = await self._ec2_call("DescribeInstanceStatus", **kwargs)
            found.update(s["InstanceId"] for s in page.get("InstanceStatuses", []))
            token = page.get("NextToken")
            if not token:
                return found & ids
            kwargs["NextToken"] = token

    async def _listed(self, pool: PoolRef) -> list[_Instance]:
        out: list[_Instance] = []
        kwargs: dict[str, Any] = {"Filters": [
            {"Name": f"tag:{POOL_TAG}", "Values": [pool.pool_id]},
            {"Name": "instance-state-name", "Values": list(_LIVE_STATES)},
        ]}
        while True:
            page = await self._ec2_call("DescribeInstances", **kwargs)
            for reservation in page.get("Reservations", []):
                for inst in reservation.get("Instances", []):
                    tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                    out.append(_Instance(inst["InstanceId"], inst["State"]["Name"],
                                         str(inst.get("LaunchTime", "")), _priority(tags)))
            token = page.get("NextToken")
            if not token:
                return out
            kwargs["NextToken"] = token

    async def _nodes(self, spec: PoolSpec) -> tuple[NodeFigures, ...]:
        url = self.settings.endpoint.rstrip("/") + "/api/v1/nodes"
        req = AWSRequest(method="GET", url=url, data=b"")
        self._auth.add_auth(req)
        try:
            resp = await self._http.get(url, headers=dict(req.headers.items()))
        except httpx.HTTPError as exc:
            raise OrchestratorUnavailable(f"gateway admin API: {exc!r}") from None
        if resp.status_code != 200:
            error = OrchestratorUnavailable if resp.status_code >= 500 else OrchestratorError
            raise error(f"gateway admin API: HTTP {resp.status_code}: {resp.text[:200]}")
        itype = BUILTIN.get(spec.instance_type)
        out = []
        for n in resp.json()["nodes"]:
            if not n["live"] or n["draining"]:
                continue
            alloc, free = n["allocatable"], n["free"]
            if itype is not None and (alloc["cpu_milli"] < itype.cpu_milli
                                      or alloc["mem_mib"] < itype.mem_mib):
                continue  # one worker would never fit there
            out.append(NodeFigures(
                n["node_id"], alloc["cpu_milli"], alloc["mem_mib"],
                max(0, alloc["cpu_milli"] - free["cpu_milli"]),
                max(0, alloc["mem_mib"] - free["mem_mib"]),
            ))
        return tuple(out)

    async def _ec2_call(self, action: str, **params: Any) -> Any:
        method = getattr(self._ec2, _snake(action))
        try:
            return await asyncio.wait_for(asyncio.to_thread(method, **params),
                                          self.settings.timeout + 1.0)
        except TimeoutError:
            raise OrchestratorUnavailable(f"{action} timed out") from None
        except ClientError as exc:
            raise _mapped(action, exc) from None
        except BotoCoreError as exc:  # connection refused, reset, read timeout
            raise OrchestratorUnavailable(f"{action}: {exc}") from None


def _snake(action: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in action).lstrip("_")


def _mapped(action: str, exc: ClientError) -> OrchestratorError:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
    text = f"{action}: {code}: {error.get('Message', '')}"
    answer = from_code(code, text)  # roost's own tree says what the code means
    if isinstance(answer, InsufficientInstanceCapacity):
        return ScaleRejected(text)  # the cluster answered: full; the plan retries later
    if isinstance(answer, InvalidParameterValue) and action == "RunInstances":
        return UnknownPool(text)  # an instance type the gateway does not know
    if answer.transient or status >= 500:
        return OrchestratorUnavailable(text)
    return ScaleRejected(text) if action in ("RunInstances", "TerminateInstances") else (
        OrchestratorError(text))
