"""Launch orchestration: place one instance with failover, and N with MinCount rollback.

One instance: rank the live view under the policy (the workload-aware ones measure
against a window of recent launch requests), send a node-targeted launch to the best
candidate with the GPU devices the policy chose, and on "no capacity" (a race the node
lost) record the attempt and try the next, up to ``max_attempts``. Then fall back to
anycast, where NATS offers the launch only to nodes subscribed to the type, i.e. nodes
that fit one more. No responders there is the cluster's answer:
InsufficientInstanceCapacity, with every attempt listed. When every node's own last
snapshot already says it cannot fit one more, that answer is given at once, before any
node is asked (`CapacityView.says_full`).

A timeout is never read as "no capacity": the node may have launched. The launch id is
looked up across the nodes first, and only if nobody holds it does placement move on.

A node that cannot run the launch at all (``unsupported``: no QEMU, a kernel image on a
process node; ``image_unavailable``: the image's files are not there) is not asked
again for it; a node whose snapshot says it can launch nothing (no QEMU) is not asked
at all; and once no node that fits is left unrefused the caller gets the reasons
at once, not a retry until the deadline: InvalidAMIID.Unavailable when some node lacks
the image's files (the nodes able to boot it do not have it), Unsupported otherwise.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import msgspec

from roost.bus.schemas import InstanceCommand, InstanceRecord, LaunchReply, LaunchRequest
from roost.decide.placement import DEFAULT_POLICY, best_placement, make_policy, placements
from roost.decide.workload import Workload, WorkloadWindow
from roost.domain.catalog import InstanceType
from roost.domain.errors import (
    InsufficientInstanceCapacity,
    InvalidAMIIDUnavailable,
    InvalidParameterValue,
    RoostError,
    ServiceUnavailable,
    Unsupported,
)
from roost.gateway.capacity import CapacityView
from roost.gateway.metrics import GatewayMetrics
from roost.gateway.nodes import BadReply, NodeClient, NodeTimeout, NoResponders

log = logging.getLogger(__name__)

ANYCAST = "*"
BACKOFF_FIRST = 0.01
"""Seconds before the second anycast ask of a launch; each later one waits twice as
long as the one before, up to `BACKOFF_MAX`, less a random part of up to a half."""
BACKOFF_MAX = 1.0
VIEW = "view"  # the answer came from the capacity view, no node was asked
PARALLEL_LAUNCHES = 32
"""Launches of one request in flight at once: enough to span nodes, few enough that a
MaxCount of hundreds does not flood the bus."""


@dataclass(frozen=True, slots=True)
class Attempt:
    node_id: str  # ANYCAST for the per-type queue group
    outcome: str  # "ok", a LaunchError, "timeout", "gone", "no_responders", "bad_reply"
    message: str = ""  # the node's reason, for a refusal that is not about capacity


CANNOT_RUN = ("unsupported", "image_unavailable")
"""Refusals that hold for the node, not the moment: it is not asked again."""


def _launched_at(reply: LaunchReply) -> float | None:
    """When the node launched it, by the node's clock, to match its snapshots' sent_at."""
    if reply.instance is None:
        return None
    try:
        return datetime.fromisoformat(reply.instance.launch_time.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def describe_attempts(attempts: Sequence[Attempt]) -> str:
    return "; ".join(f"{a.node_id}: {a.outcome}" for a in attempts) or "no candidates"


def backoff(tries: int, rng: random.Random) -> float:
    """Seconds to wait before ask number ``tries`` + 1 (``tries`` >= 1) of one launch."""
    step: float = BACKOFF_FIRST * 2.0 ** min(tries - 1, 30)
    return min(BACKOFF_MAX, step) * rng.uniform(0.5, 1.0)


@dataclass(frozen=True, slots=True)
class LaunchPolicy:
    policy: str = DEFAULT_POLICY
    max_attempts: int = 3
    anycast_seconds: float = 30.0
    workload: Workload | None = None
    """The operator's declared launch mix; without one, the workload-aware policies
    (roost, fgd) measure against a window of recent launch requests:"""
    workload_window: int = 5000
    """...this many requests,"""
    workload_refresh: int = 500
    """...rebuilt after this many (each rebuild re-measures)."""
    share: tuple[int, int] = (0, 1)
    """Placer i of n sharing one view of the cluster (the processes of a gateway pool):
    each looks first among its own share of the nodes (`best_placement`)."""


class Launcher:
    def __init__(
        self,
        nodes: NodeClient,
        view: CapacityView,
        metrics: GatewayMetrics,
        *,
        policy: LaunchPolicy = LaunchPolicy(),
        rng: random.Random | None = None,
    ) -> None:
        self._nodes = nodes
        self._view = view
        self._metrics = metrics
        self._policy = policy
        self._rng = rng or random.Random()
        self._workload = WorkloadWindow(policy.workload_window, policy.workload_refresh)

    def _count(self, outcome: str, node_id: str) -> None:
        route = {ANYCAST: "anycast", VIEW: "view"}.get(node_id, "node")
        self._metrics.placement_attempts.labels(self._policy.policy, route, outcome).inc()

    async def _reconcile(self, launch_id: str) -> InstanceRecord | None:
        reply = await self._nodes.lookup(launch_id)
        return reply.instance if reply is not None else None

    async def _reconcile_on(self, attempts: Sequence[Attempt], launch_id: str
                            ) -> InstanceRecord | None:
        """The launch, if a node it was sent to and that did not answer holds it. Only
        those nodes can: each is asked alone, not every node through the fan-out. At
        1,000 nodes on loaded cores, a burst through 4 gateway processes that collapsed
        to 3 launches/s had 6,869 timeouts, each of which had sent its lookup to all
        1,000 nodes, while the nodes used 114% of a core."""
        silent = list(dict.fromkeys(a.node_id for a in attempts
                                    if a.outcome == "timeout" and a.node_id != ANYCAST))
        found = await asyncio.gather(*(self._nodes.lookup_on(n, launch_id) for n in silent))
        return next((rec for rec in found if rec is not None), None)

    def _settle(self, reply: LaunchReply, attempts: list[Attempt], node_id: str
                ) -> InstanceRecord | None:
        outcome = "ok" if reply.ok and reply.instance else (reply.error or "internal")
        if outcome in CANNOT_RUN:  # the node that said so, also through anycast
            attempts.append(Attempt(reply.node_id or node_id, outcome, reply.message))
        else:
            attempts.append(Attempt(node_id, outcome))
        self._count(outcome, node_id)
        if reply.ok and reply.instance is not None:
            return reply.instance
        if reply.error == "bad_request":
            raise InvalidParameterValue(reply.message or "The node refused the request.")
        return None

    async def _targeted(self, req: LaunchRequest, itype: InstanceType, zone: str,
                        workload: Workload | None, attempts: list[Attempt]
                        ) -> InstanceRecord | None:
        tried: set[str] = set()
        for _ in range(self._policy.max_attempts):
            # The policy made for every zone's GPUs, which the view keeps between
            # launches; for one zone, `best_placement` makes it for that zone's nodes.
            policy = (self._policy.policy if zone else
                      make_policy(self._policy.policy, workload, self._view.gpu_inventory()))
            best = best_placement(self._view.nodes(zone), itype, policy=policy,
                                  rng=self._rng, workload=workload, skip=tried,
                                  share=self._policy.share)
            if best is None:
                return None
            node_id, devices = best.node.node_id, [i for i, _ in best.gpus]
            tried.add(node_id)
            hold = self._view.hold(node_id, itype, devices)
            try:
                reply = await self._nodes.launch(
                    node_id, msgspec.structs.replace(req, gpu_devices=devices))
            except (NoResponders, BadReply) as exc:
                self._view.settle(hold, launched=False)
                outcome = "gone" if isinstance(exc, NoResponders) else "bad_reply"
                attempts.append(Attempt(node_id, outcome))
                self._count(outcome, node_id)
                continue
            except NodeTimeout:
                self._view.settle(hold, launched=True)
                attempts.append(Attempt(node_id, "timeout"))
                self._count("timeout", node_id)
                if (found := await self._reconcile_on(attempts, req.launch_id)) is not None:
                    return found
                continue
            self._view.settle(hold, launched=reply.ok, launched_at=_launched_at(reply))
            if (rec := self._settle(reply, attempts, node_id)) is not None:
                return rec
            self._refuse_if_none_can_run(req, itype, zone, workload, attempts)
        return None

    def _refuse_if_none_can_run(self, req: LaunchRequest, itype: InstanceType, zone: str,
                                workload: Workload | None, attempts: Sequence[Attempt]
                                ) -> None:
        """Raise the refusals' answer when every node that fits ``itype`` has said it
        cannot run the launch (see `CANNOT_RUN`), in its snapshots or in a reply."""
        refused = [Attempt(node_id, "unsupported", f"node {node_id}: {why}") for node_id, why
                   in self._view.cannot_launch(itype.name, zone).items()]
        refused += [a for a in attempts if a.outcome in CANNOT_RUN]
        if not refused:
            return
        fitting = {p.node.node_id for p in placements(
            self._view.nodes(zone), itype, policy=self._policy.policy, rng=self._rng,
            workload=workload)}
        if fitting - {a.node_id for a in refused}:
            return
        why = "; ".join(dict.fromkeys(a.message for a in refused))
        if any(a.outcome == "image_unavailable" for a in refused):
            raise InvalidAMIIDUnavailable(
                f"No node can boot the image {req.image_id}: {why}")
        raise Unsupported(f"No node can run {req.image_id} on {itype.name} now: {why}")

    async def _anycast(self, req: LaunchRequest, itype: InstanceType, attempts: list[Attempt]
                       ) -> InstanceRecord:
        """Anycast until a node launches it or NATS has no responders.

        "no capacity" from an anycast node means another launch won the node's last
        slot, in the moment before it unsubscribed: progress elsewhere, so asking again
        is safe. Only no responders (nobody fits) ends the loop with a capacity error;
        the deadline guards against a bus that keeps failing in other ways. Each ask
        after the first waits a little longer (`backoff`): a refusal asked again at once
        adds load just when the cluster is slowest to settle (at 1,000 nodes on starved
        cores, one burst measured 60 placement attempts per launch).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._policy.anycast_seconds
        for tries in itertools.count():
            if tries:  # at once under load, every refusal would be asked again at once
                await asyncio.sleep(min(deadline - loop.time(), backoff(tries, self._rng)))
            if loop.time() >= deadline:
                break
            try:
                reply = await self._nodes.anycast(req)
            except NoResponders:
                attempts.append(Attempt(ANYCAST, "no_responders"))
                self._count("no_responders", ANYCAST)
                break
            except (NodeTimeout, BadReply):
                attempts.append(Attempt(ANYCAST, "timeout"))
                self._count("timeout", ANYCAST)
                if (found := await self._reconcile(req.launch_id)) is not None:
                    return found
                continue
            if (rec := self._settle(reply, attempts, ANYCAST)) is not None:
                return rec
            self._refuse_if_none_can_run(req, itype, "", self._policy.workload
                                         or self._workload.current(), attempts)
        raise _no_room(attempts, self._view.silent_with_room(req.instance_type),
                       f"Insufficient capacity for {req.instance_type}: no node can fit it "
                       f"now ({describe_attempts(attempts)}).")

    @property
    def window(self) -> WorkloadWindow:
        """The recent requests the workload-aware policies learn from."""
        return self._workload

    def observe(self, itype: InstanceType, count: int = 1) -> None:
        """``count`` more instances of ``itype`` asked for, placed or not: the workload
        the roost and fgd policies measure against when none is declared."""
        for _ in range(count):
            self._workload.observe(itype)

    def says_full(self, itype: InstanceType, zone: str = "") -> bool:
        """Every node has already said it cannot fit one more ``itype`` (see
        `CapacityView.says_full`). The `anycast` policy never asks the view."""
        return self._policy.policy != "anycast" and self._view.says_full(itype, zone)

    def refuse_if_full(self, itype: InstanceType, zone: str = "") -> None:
        """Raise the full cluster's answer, at once, if `says_full`."""
        if not self.says_full(itype, zone):
            return
        self._count("full", VIEW)
        where = f" in {zone}" if zone else ""
        raise InsufficientInstanceCapacity(
            f"Insufficient capacity for {itype.name}{where}: every node reports that it "
            f"cannot fit one more."
        )

    async def launch_one(
        self, req: LaunchRequest, itype: InstanceType, *, zone: str = "",
        reconcile_first: bool = False,
    ) -> InstanceRecord:
        """Launch ``req`` on some node; raises InsufficientInstanceCapacity when none fits.

        ``reconcile_first`` looks the launch id up before placing it: for a request
        taken over from a gateway that may have sent it already.
        """
        if reconcile_first and (found := await self._reconcile(req.launch_id)) is not None:
            return found
        attempts: list[Attempt] = []
        # A declared workload (`roost gateway --workload`), or the one seen so far
        # (`Ec2Service.run_instances` has added this request to it).
        workload = self._policy.workload or self._workload.current()
        self.refuse_if_full(itype, zone)
        self._refuse_if_none_can_run(req, itype, zone, workload, attempts)
        if self._policy.policy != "anycast":
            found = await self._targeted(req, itype, zone, workload, attempts)
            if found is not None:
                return found
        zones = self._view.zones()
        if zone and zones != {zone}:
            # Anycast cannot honour a zone; with other zones in the cluster it might
            # place the instance in one of them.
            raise _no_room(attempts, self._view.silent_with_room(req.instance_type),
                           f"Insufficient capacity for {req.instance_type} in {zone} "
                           f"({describe_attempts(attempts)}).")
        return await self._anycast(req, itype, attempts)

    async def launch_many(
        self, reqs: Sequence[LaunchRequest], itype: InstanceType, *, min_count: int,
        zone: str = "", reconcile_first: bool = False,
    ) -> list[InstanceRecord]:
        """Launch up to ``len(reqs)``, in parallel; fewer than ``min_count`` rolls all back.

        Once one launch meets a full cluster, launches not yet started are skipped: the
        anycast answer covers every node.
        """
        gate = asyncio.Semaphore(PARALLEL_LAUNCHES)
        full = asyncio.Event()
        placed: dict[str, InstanceRecord] = {}
        if reconcile_first:
            # Taken over from a gateway that may have placed some: one fan-out every
            # node answers, not a lookup per launch that only a holder would answer
            # (a launch never placed cost a whole timeout: 400 of them, minutes).
            placed, everyone = await self._nodes.lookup_many(
                [r.launch_id for r in reqs], timeout=self._nodes.timeout,
                expect=self._view.live_count())
            reconcile_first = not everyone  # someone was silent: ask again one by one

        async def one(req: LaunchRequest) -> InstanceRecord | RoostError | None:
            if req.launch_id in placed:
                return placed[req.launch_id]
            async with gate:
                if full.is_set():
                    return None
                try:
                    return await self.launch_one(req, itype, zone=zone,
                                                 reconcile_first=reconcile_first)
                except InsufficientInstanceCapacity as exc:
                    full.set()
                    return exc
                except RoostError as exc:
                    return exc

        results = await asyncio.gather(*(one(r) for r in reqs))
        launched = [r for r in results if isinstance(r, InstanceRecord)]
        if len(launched) >= min_count:
            return launched
        await self.rollback(launched)
        failures = [r for r in results if isinstance(r, RoostError)]
        worst = next((f for f in failures if not isinstance(f, InsufficientInstanceCapacity)),
                     None)
        if worst is not None:
            raise worst
        if not launched and failures:
            raise failures[0]
        why = f" Last: {failures[0].message}" if failures else ""
        raise InsufficientInstanceCapacity(
            f"Insufficient capacity: {len(launched)} of MinCount {min_count} "
            f"{itype.name} could be placed; the launched ones were terminated.{why}"
        )

    async def rollback(self, records: Sequence[InstanceRecord]) -> None:
        async def kill(rec: InstanceRecord) -> None:
            cmd = InstanceCommand(op="terminate", instance_id=rec.instance_id, force=True)
            try:
                reply = await self._nodes.command(rec.node_id, cmd)
                if not reply.ok:
                    log.error("rollback of %s on %s refused: %s", rec.instance_id,
                              rec.node_id, reply.error)
            except (NoResponders, NodeTimeout, BadReply, ServiceUnavailable) as exc:
                log.error("rollback of %s on %s failed: %r", rec.instance_id, rec.node_id, exc)

        await asyncio.gather(*(kill(r) for r in records))
        self._metrics.launches.labels("rolled_back").inc(len(records))


def _no_room(attempts: Sequence[Attempt], silent: Sequence[str], message: str) -> RoostError:
    """The answer when nothing took the launch. A node the capacity view counts as live
    that had no responder on the bus ("gone"), or nodes that had room and went quiet
    (``silent``), mean the bus or the nodes are in flux (a NATS restart the nodes have
    not reconnected from yet, a node that just died): that is not a capacity answer, so
    the caller gets a retryable 503 instead of a false InsufficientInstanceCapacity."""
    gone = [a.node_id for a in attempts if a.outcome == "gone"] + list(silent)
    if gone:
        return ServiceUnavailable(
            f"Nodes that had room did not answer on the bus ({', '.join(gone)}); not a "
            f"capacity answer, retry. ({describe_attempts(attempts)})")
    return InsufficientInstanceCapacity(message)
