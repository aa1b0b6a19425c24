"""Where the dashboard's state comes from: NATS for nodes and instances, the controller's
/status over HTTP, the gateway's launch counters.

`LiveSource` is what `roost up` and `roost dashboard` run: its own NATS connection, the
same capacity view and instance mirror the gateway keeps (so it works against a remote
cluster with no gateway in the process), and a poll of the controller. `StaticSource`
serves a state given by hand: the tests' and the benchmark's fake, next to the real one.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import httpx
import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from roost.bus import subjects
from roost.bus.auth import NatsAuth
from roost.bus.connect import connect, key_value, until_synced
from roost.bus.schemas import (
    CapacitySnapshot,
    CommandReply,
    DrainReply,
    DrainRequest,
    InstanceCommand,
    InstanceRecord,
    decode,
    encode,
)
from roost.dashboard.model import ClusterState, LaunchCounters, NodeState
from roost.gateway.capacity import CapacityView
from roost.gateway.index import InstanceIndex

log = logging.getLogger(__name__)


class DrainFailed(Exception):
    pass


class ConsoleUnavailable(Exception):
    pass


CONSOLE_TAIL_LINES = 60


def console_text(b64: str, lines: int = CONSOLE_TAIL_LINES) -> str:
    """The last ``lines`` lines of a base64 console tail, as text."""
    raw = base64.b64decode(b64 or "").decode("utf-8", errors="replace")
    return "\n".join(raw.splitlines()[-lines:])


class ClusterSource(Protocol):
    def state(self) -> ClusterState: ...

    async def refresh(self) -> None:
        """Fetch what is polled rather than pushed (the controller, launch counters)."""

    async def drain(self, node_id: str) -> DrainReply: ...

    async def console(self, rec: InstanceRecord) -> tuple[str, str]:
        """The tail of the instance's console as text, and when it was read."""
        ...


class StaticSource:
    """A fixed state; `drain` marks the node draining in it."""

    def __init__(self, state: ClusterState, *, consoles: Mapping[str, str] | None = None
                 ) -> None:
        self._state = state
        self.drained: list[str] = []
        self.consoles = dict(consoles or {})
        """Instance id -> console text."""

    def state(self) -> ClusterState:
        return self._state

    def set(self, state: ClusterState) -> None:
        self._state = state

    async def refresh(self) -> None:
        return None

    async def drain(self, node_id: str) -> DrainReply:
        nodes = list(self._state.nodes)
        for i, n in enumerate(nodes):
            if n.snap.node_id == node_id:
                snap = msgspec.structs.replace(n.snap, draining=True)
                nodes[i] = NodeState(snap, n.age_seconds, n.live)
                self._state = ClusterState(self._state.at, nodes, self._state.instances,
                                           self._state.controller,
                                           self._state.controller_error, self._state.launches)
                self.drained.append(node_id)
                return DrainReply(node_id=node_id, draining=True, instances=snap.instances)
        raise DrainFailed(f"no node {node_id} in the view")

    async def console(self, rec: InstanceRecord) -> tuple[str, str]:
        return self.consoles.get(rec.instance_id, ""), rec.updated_at


def launch_counters(registry: CollectorRegistry) -> LaunchCounters:
    """The gateway's launch counters from its Prometheus registry (in-process)."""
    return _counters((m.name, s.name, s.labels, s.value)
                     for m in registry.collect() for s in m.samples)


def counters_from_text(text: str) -> LaunchCounters:
    """The same counters from a /metrics scrape of a remote gateway."""
    return _counters((m.name, s.name, s.labels, s.value)
                     for m in text_string_to_metric_families(text) for s in m.samples)


def _counters(samples: Any) -> LaunchCounters:
    launched = insufficient = failed = 0.0
    buckets: list[tuple[float, float]] = []
    attempts: dict[tuple[str, str], float] = {}
    for _family, name, labels, value in samples:
        if name == "roost_launches_total":
            outcome = labels.get("outcome", "")
            if outcome == "launched":
                launched += value
            elif outcome == "insufficient_capacity":
                insufficient += value
            else:
                failed += value
        elif name == "roost_launch_seconds_bucket":
            buckets.append((float(labels["le"]), value))
        elif name == "roost_placement_attempts_total":
            key = (labels.get("route", ""), labels.get("outcome", ""))
            attempts[key] = attempts.get(key, 0.0) + value
    buckets.sort()
    return LaunchCounters(launched, insufficient, failed, tuple(buckets), attempts)


class LiveSource:
    """Follows a cluster over NATS; polls the controller (and, if given, a gateway's
    /metrics) on `refresh`."""

    def __init__(self, nats_urls: Sequence[str], *, nats_auth: NatsAuth | None = None,
                 controller_url: str = "",
                 gateway_metrics_url: str = "",
                 launches: Callable[[], LaunchCounters] | None = None,
                 timeout: float = 3.0) -> None:
        self.nats_urls = list(nats_urls)
        self.nats_auth = nats_auth
        self.controller_url = controller_url.rstrip("/")
        self.gateway_metrics_url = gateway_metrics_url
        self._launches_fn = launches
        self.timeout = timeout
        self._nc: NATS | None = None
        self._view: CapacityView | None = None
        self._index: InstanceIndex | None = None
        self._http: httpx.AsyncClient | None = None
        self._controller: Mapping[str, Any] | None = None
        self._controller_error = "not asked yet" if controller_url else "no controller given"
        self._launches: LaunchCounters | None = None
        self._cached: tuple[float, ClusterState] | None = None

    async def start(self, *, sync_timeout: float = 15.0) -> None:
        self._nc = nc = await connect(self.nats_urls, name="roost-dashboard",
                                      auth=self.nats_auth)
        loop = asyncio.get_running_loop()
        self._view = view = CapacityView(loop.time)
        await nc.subscribe(subjects.CAPACITY_ALL, cb=self._on_capacity(view))
        self._index = InstanceIndex(await key_value(nc, subjects.INSTANCES_BUCKET),
                                    await key_value(nc, subjects.TAGS_BUCKET),
                                    await key_value(nc, subjects.USER_DATA_BUCKET))
        self._index.start()
        await until_synced(self._index.wait_synced(None), stall=sync_timeout,
                           what="dashboard start")
        self._http = httpx.AsyncClient(timeout=self.timeout)

    def _on_capacity(self, view: CapacityView) -> Callable[[Msg], Awaitable[None]]:
        async def cb(msg: Msg) -> None:
            try:
                # No cache reset here: with a thousand nodes snapshots arrive hundreds of
                # times a second, and the state is at most half a second old anyway.
                view.apply(decode(msg.data, CapacitySnapshot))
            except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
                log.warning("ignoring bad capacity snapshot on %s: %s", msg.subject, exc)
        return cb

    async def stop(self) -> None:
        if self._index is not None:
            await self._index.stop()
        if self._http is not None:
            await self._http.aclose()
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.close()

    async def refresh(self) -> None:
        if self._http is None:
            return
        if self.controller_url:
            try:
                r = await self._http.get(f"{self.controller_url}/status")
                r.raise_for_status()
                self._controller, self._controller_error = r.json(), ""
            except (httpx.HTTPError, ValueError) as exc:
                self._controller = None
                self._controller_error = f"{type(exc).__name__}: {exc}"
        if self._launches_fn is not None:
            self._launches = self._launches_fn()
        elif self.gateway_metrics_url:
            try:
                r = await self._http.get(self.gateway_metrics_url)
                r.raise_for_status()
                self._launches = counters_from_text(r.text)
            except (httpx.HTTPError, ValueError) as exc:
                log.warning("gateway metrics unreachable: %s", exc)
                self._launches = None
        self._cached = None

    def state(self) -> ClusterState:
        """The current state; reused for up to half a second, so that a page and the
        fragments it loads at once read one state rather than build several."""
        now = time.monotonic()
        if self._cached is not None and now - self._cached[0] < 0.5:
            return self._cached[1]
        nodes = [NodeState(st.snap, st.age_seconds, st.live)
                 for st in (self._view.status() if self._view else [])]
        instances = {r.instance_id: r for r in (self._index.all() if self._index else [])}
        state = ClusterState(time.time(), nodes, instances, self._controller,
                             self._controller_error, self._launches)
        self._cached = (now, state)
        return state

    async def drain(self, node_id: str) -> DrainReply:
        """Ask the node to stop taking launches; it keeps running (and its instances)."""
        if self._nc is None:
            raise DrainFailed("not connected to NATS")
        subjects.check_node_id(node_id)
        try:
            msg = await self._nc.request(subjects.node_drain(node_id),
                                         encode(DrainRequest(shutdown=False)),
                                         timeout=self.timeout)
            reply = decode(msg.data, DrainReply)
        except Exception as exc:
            raise DrainFailed(f"node {node_id} did not answer: {type(exc).__name__} {exc}"
                              ) from None
        self._cached = None
        return reply

    async def console(self, rec: InstanceRecord) -> tuple[str, str]:
        """Ask the node that owns ``rec`` for its console, as the gateway's
        GetConsoleOutput does (a terminated instance has none)."""
        if rec.state == "terminated":
            return "", rec.updated_at
        if self._nc is None:
            raise ConsoleUnavailable("not connected to NATS")
        try:
            msg = await self._nc.request(
                subjects.node_command(rec.node_id),
                encode(InstanceCommand(op="console", instance_id=rec.instance_id)),
                timeout=self.timeout)
            reply = decode(msg.data, CommandReply)
        except Exception as exc:
            raise ConsoleUnavailable(f"node {rec.node_id} did not answer: "
                                     f"{type(exc).__name__} {exc}") from None
        if not reply.ok:
            raise ConsoleUnavailable(reply.message or reply.error or "the node refused")
        return console_text(reply.console), reply.console_at
