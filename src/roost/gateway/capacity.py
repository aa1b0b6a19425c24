"""The live capacity view: every node's last capacity snapshot, less launches in flight.

Nodes push a `CapacitySnapshot` on every change and as a heartbeat, so the launch path
reads this view and never asks the nodes. The view is advice: a node re-checks under
its own lock, and anycast remains the fallback, so a stale view costs a retry.

The one answer the view gives on its own is a full cluster (`says_full`): when every
live node's last snapshot says it cannot fit one more of a type, the gateway answers
InsufficientInstanceCapacity at once, without a bus round trip. Nodes advertise room
(subscribe) before they announce it (snapshot), so this answer can lag a release by
one snapshot's delivery, as the anycast answer lags it by one SUB's.

Launches in flight are subtracted as holds. A hold for a launch that succeeded stays
until a snapshot the node sent after the launch (by the node's own clock: ``sent_at``
against the instance's launch time) is in the view; one whose outcome is unknown (a
timeout) stays until the next snapshot. So the view may briefly count an instance twice
(conservative) but never zero times.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from roost.bus.schemas import CapacitySnapshot
from roost.decide.placement import NodeView, gpu_inventory
from roost.decide.workload import GpuInventory
from roost.domain.catalog import InstanceType
from roost.domain.fit import FreeCapacity, assign_gpus, assignment_on, take
from roost.domain.resources import Resources

Clock = Callable[[], float]
"""Monotonic seconds; the event loop's clock in service, a counter in tests."""

MISSED_HEARTBEATS = 3.0
"""A node silent for this many heartbeat periods is no longer a placement candidate."""
FORGET_AFTER = 60.0
"""...and after this many seconds it leaves the view (and the admin API) altogether."""


@dataclass(frozen=True, slots=True)
class _Held:
    """A launch in flight against a node: its type and the devices placement chose."""

    itype: InstanceType
    devices: tuple[int, ...] = ()


@dataclass(slots=True)
class _Node:
    snap: CapacitySnapshot
    seen_at: float
    inflight: dict[int, _Held] = field(default_factory=dict)
    settling: dict[int, tuple[_Held, float | None]] = field(default_factory=dict)
    view: NodeView | None = None
    """What `CapacityView.nodes` made of the above, until any of it changes: placement
    reads every node on every launch, and most nodes did not change since the last."""
    live_until: float = 0.0
    """When the node is lost unless another snapshot comes (`MISSED_HEARTBEATS` of its
    periods after this one): worked out once per snapshot, not per node per launch."""

    def __post_init__(self) -> None:
        self.live_until = _live_until(self.snap, self.seen_at)

    def clear_settled(self) -> None:
        """Drop holds the current snapshot already covers."""
        sent = self.snap.sent_at
        self.settling = {k: (t, after) for k, (t, after) in self.settling.items()
                         if after is not None and sent < after}


@dataclass(frozen=True, slots=True)
class Hold:
    node_id: str
    hold_id: int


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """A snapshot with how long ago it arrived, for the admin API and `roost status`."""

    snap: CapacitySnapshot
    age_seconds: float
    live: bool


def _live_until(snap: CapacitySnapshot, seen_at: float) -> float:
    return seen_at + MISSED_HEARTBEATS * max(snap.heartbeat_seconds, 0.1)


def _room(snap: CapacitySnapshot) -> tuple[object, ...]:
    """Every field of a snapshot that its node's `NodeView` is made of. A heartbeat
    that repeats them keeps the view object, and with it placement's verdicts on the
    node (`roost.decide.placement.Remembering`, by identity): at 1,000 nodes every
    node's heartbeat had made a new view every 2 s, and scoring the new ones afresh
    was a third of a gateway's CPU in a burst of single launches."""
    return (snap.alloc_cpu_milli, snap.alloc_mem_mib, snap.free_cpu_milli, snap.free_mem_mib,
            tuple(snap.gpu_free), tuple(snap.gpu_models), snap.draining)


def _free(snap: CapacitySnapshot) -> FreeCapacity:
    return FreeCapacity(
        Resources(snap.free_cpu_milli, snap.free_mem_mib),
        tuple(snap.gpu_free),
        tuple(snap.gpu_models),
    )


def _less(cap: FreeCapacity, held: list[_Held]) -> FreeCapacity:
    for h in held:
        gpus = assignment_on(cap, h.itype, h.devices) if h.devices else None
        cap = take(cap, h.itype, gpus or assign_gpus(cap, h.itype) or ())
    return cap


FULL_AFTER = 6.0
"""Seconds after the view starts before it may say a cluster is full: three of a node
agent's default 2 s heartbeats, so that every live node has been heard from."""


class CapacityView:
    def __init__(self, clock: Clock, *, full_after: float = FULL_AFTER) -> None:
        self._clock = clock
        self._nodes: dict[str, _Node] = {}
        self._cannot: set[str] = set()
        """Nodes whose last snapshot says their driver can launch nothing (usually
        none): `cannot_launch` is asked on every launch and need not walk every node."""
        self._ids = itertools.count(1)
        self._full_from = clock() + full_after
        self._listed: dict[str, NodeView] | None = None
        """`nodes`' answer for every zone, kept between launches: node id -> view, in
        the view's order. Rebuilt in full when its earliest node may have gone silent
        (``_listed_until``), else mended for the nodes in ``_dirty`` alone: at 1,000
        nodes, walking all of them on every launch had been a tenth of a gateway's
        CPU in the probes of `roost bench scale`."""
        self._listed_until = 0.0
        self._dirty: set[str] = set()
        self._inventory: GpuInventory | None = None
        """`gpu_inventory` over ``_listed``, until a node comes, goes or changes GPUs."""

    def apply(self, snap: CapacitySnapshot) -> bool:
        """Take ``snap`` unless it is older than what the view holds; True if taken.

        Within one agent run ``seq`` orders snapshots. A new ``boot_id`` is a restart
        and wins, unless its wall-clock stamp is older than what the view holds (a late
        message from the previous run).
        """
        cur = self._nodes.get(snap.node_id)
        now = self._clock()
        if cur is None:
            self._nodes[snap.node_id] = _Node(snap, now)
            self._note_cannot(snap)
            self._dirty.add(snap.node_id)
            return True
        if snap.boot_id == cur.snap.boot_id:
            if snap.seq <= cur.snap.seq:
                return False
        elif snap.sent_at < cur.snap.sent_at:
            return False
        settling = len(cur.settling)
        same_room = _room(snap) == _room(cur.snap)
        same_listing = (snap.cannot_launch == cur.snap.cannot_launch
                        and self._listed is not None and snap.node_id in self._listed)
        cur.snap, cur.seen_at = snap, now
        cur.live_until = _live_until(snap, now)
        cur.clear_settled()
        if not same_room or len(cur.settling) != settling:
            cur.view = None  # else the node's view stays the same object (see `_room`)
            self._dirty.add(snap.node_id)
        elif not same_listing:  # back from silence, or able to launch again
            self._dirty.add(snap.node_id)
        self._note_cannot(snap)
        return True

    def _note_cannot(self, snap: CapacitySnapshot) -> None:
        (self._cannot.add if snap.cannot_launch else self._cannot.discard)(snap.node_id)

    @staticmethod
    def _live(node: _Node, now: float) -> bool:
        return now <= node.live_until

    def nodes(self, zone: str = "") -> list[NodeView]:
        """Live nodes as placement sees them, in-flight launches subtracted."""
        if not zone:
            return list(self._listing().values())
        now = self._clock()
        return [self._view_of(node_id, n) for node_id, n in self._nodes.items()
                if self._placeable(n, now) and n.snap.availability_zone == zone]

    def gpu_inventory(self) -> GpuInventory:
        """`gpu_inventory` of `nodes` (every zone): what a policy is made for."""
        if self._inventory is None:
            self._inventory = gpu_inventory(list(self._listing().values()))
        return self._inventory

    @staticmethod
    def _placeable(n: _Node, now: float) -> bool:
        return now <= n.live_until and not n.snap.cannot_launch

    @staticmethod
    def _view_of(node_id: str, n: _Node) -> NodeView:
        if n.view is None:
            held = [*n.inflight.values(), *(t for t, _ in n.settling.values())]
            n.view = NodeView(node_id, Resources(n.snap.alloc_cpu_milli, n.snap.alloc_mem_mib),
                              _less(_free(n.snap), held), draining=n.snap.draining)
        return n.view

    def _listing(self) -> dict[str, NodeView]:
        """`nodes` of every zone, mended for the nodes changed since the last call."""
        now = self._clock()
        listed = self._listed
        if listed is None or now > self._listed_until:
            listed = {node_id: self._view_of(node_id, n) for node_id, n in self._nodes.items()
                      if self._placeable(n, now)}
            self._listed, self._inventory = listed, None
            self._listed_until = min((self._nodes[k].live_until for k in listed),
                                     default=math.inf)
            self._dirty.clear()
            return listed
        for node_id in self._dirty:
            n = self._nodes.get(node_id)
            was = listed.get(node_id)
            if n is None or not self._placeable(n, now):
                if listed.pop(node_id, None) is not None:
                    self._inventory = None
                continue
            view = listed[node_id] = self._view_of(node_id, n)
            self._listed_until = min(self._listed_until, n.live_until)
            if was is None or was.free.gpu_models != view.free.gpu_models:
                self._inventory = None
        self._dirty.clear()
        return listed

    def cannot_launch(self, type_name: str, zone: str = "") -> dict[str, str]:
        """Live nodes (in ``zone``) with room for one more ``type_name`` whose driver
        can launch nothing (`CapacitySnapshot.cannot_launch`), with the reason each
        gave; `nodes` leaves them out."""
        now = self._clock()
        return {node_id: n.snap.cannot_launch for node_id in sorted(self._cannot)
                if (n := self._nodes.get(node_id)) is not None and self._live(n, now)
                and (not zone or n.snap.availability_zone == zone)
                and n.snap.fit.get(type_name, 0) > 0}

    def says_full(self, itype: InstanceType, zone: str = "") -> bool:
        """Every node in the view has told us it cannot fit one more ``itype``.

        True only when the view is complete as far as the gateway can know: it has been
        listening for ``full_after`` seconds (nodes it has not heard from yet may have
        room), it has at least one live node (in ``zone``, if given) and no remembered
        node that has gone quiet (it may still be subscribed), and each live node's own
        last word, its snapshot's fit count, is zero. Launches in flight are not counted
        against the nodes here: a hold is this gateway's guess, and a guess must never
        turn into a capacity error.
        """
        now = self._clock()
        if now < self._full_from:
            return False
        seen = False
        for n in self._nodes.values():
            if now - n.seen_at > FORGET_AFTER:
                continue
            if not self._live(n, now):
                return False
            if zone and n.snap.availability_zone != zone:
                continue
            if not n.snap.draining and n.snap.fit.get(itype.name, 0) > 0:
                return False
            seen = True
        return seen

    def room_by_zone(self, type_name: str) -> dict[str, int]:
        """How many more of ``type_name`` each zone's live nodes last said they fit."""
        now = self._clock()
        room: dict[str, int] = {}
        for n in self._nodes.values():
            if self._live(n, now):
                zone = n.snap.availability_zone
                fits = 0 if n.snap.draining else n.snap.fit.get(type_name, 0)
                room[zone] = room.get(zone, 0) + fits
        return room

    def status(self) -> list[NodeStatus]:
        now = self._clock()
        for node_id in [k for k, n in self._nodes.items() if now - n.seen_at > FORGET_AFTER]:
            del self._nodes[node_id]
            self._cannot.discard(node_id)
            self._dirty.add(node_id)
        return [
            NodeStatus(n.snap, now - n.seen_at, self._live(n, now))
            for _, n in sorted(self._nodes.items())
        ]

    def zones(self) -> set[str]:
        now = self._clock()
        return {n.snap.availability_zone for n in self._nodes.values() if self._live(n, now)}

    def advertised_types(self) -> set[str]:
        """Type names any live node reports a fit count for (it knows the type)."""
        now = self._clock()
        return {t for n in self._nodes.values() if self._live(n, now) for t in n.snap.fit}

    def silent_with_room(self, type_name: str) -> list[str]:
        """Nodes heard from lately (not yet forgotten) but silent now, whose last snapshot
        said they fit one more ``type_name``. While there are any, "no responders" may be
        a bus in flux (a NATS restart the nodes have not reconnected from), not a full
        cluster."""
        now = self._clock()
        return sorted(n.snap.node_id for n in self._nodes.values()
                      if not self._live(n, now) and now - n.seen_at <= FORGET_AFTER
                      and n.snap.fit.get(type_name, 0) > 0 and not n.snap.draining)

    def lost(self, node_id: str) -> bool:
        """The node has been silent for `MISSED_HEARTBEATS` of its periods or more, or
        the view has listened ``full_after`` seconds without hearing from it at all
        (see docs/architecture.md, "Lost nodes")."""
        now = self._clock()
        node = self._nodes.get(node_id)
        if node is None:
            return now >= self._full_from
        return not self._live(node, now)

    def silent_for(self, node_id: str) -> float | None:
        """Seconds since the node's last snapshot, None if the view has none."""
        node = self._nodes.get(node_id)
        return None if node is None else self._clock() - node.seen_at

    def forget(self, node_id: str) -> None:
        """An operator declared the node gone for good: drop it now, not after
        `FORGET_AFTER`. A snapshot from it later (it came back) adds it again."""
        self._nodes.pop(node_id, None)
        self._cannot.discard(node_id)
        self._dirty.add(node_id)

    def live_count(self) -> int:
        now = self._clock()
        return sum(1 for n in self._nodes.values() if self._live(n, now))

    def hold(self, node_id: str, itype: InstanceType, devices: Sequence[int] = ()) -> Hold:
        """Count a launch of ``itype`` (on GPU ``devices``, if chosen) against the node
        until `settle` and, for one that happened, a snapshot that covers it."""
        hold = Hold(node_id, next(self._ids))
        node = self._nodes.get(node_id)
        if node is not None:
            node.inflight[hold.hold_id] = _Held(itype, tuple(devices))
            node.view = None
            self._dirty.add(node_id)
        return hold

    def settle(self, hold: Hold, *, launched: bool, launched_at: float | None = None) -> None:
        """End a hold. A launch that happened (at ``launched_at``, node clock, if known)
        or may have happened stays held until a snapshot covers it."""
        node = self._nodes.get(hold.node_id)
        if node is None:
            return
        held = node.inflight.pop(hold.hold_id, None)
        node.view = None
        self._dirty.add(hold.node_id)
        if not launched or held is None:
            return
        if launched_at is None or node.snap.sent_at < launched_at:
            node.settling[hold.hold_id] = (held, launched_at)
