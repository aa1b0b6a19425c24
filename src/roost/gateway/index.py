"""The gateway's mirror of the instances bucket, and the tags that CreateTags set.

Nodes own the instance records (`roost_instances`, written only by the owning node).
Each gateway mirrors the bucket through a KV watch, so Describe* reads memory rather
than the bus. Replies to the gateway's own launches and commands go into the mirror at
once, so a caller that describes what it just launched sees it.

Tags changed after launch live in a bucket of their own (`roost_instance_tags`,
instance id -> the full tag set), written by gateways with compare-and-set. A node
rewrites its record on every state change, so a gateway editing the record's tags
would race the node and lose; a separate key has one kind of writer.

User data, when a launch has any, is kept by the launching gateway in
`roost_user_data` (instance id -> base64), for DescribeInstanceAttribute: Terraform
compares it on every refresh. Only its keys are mirrored.

When a node lets a record expire, the gateways drop that instance's tags and user data.

Terminations given while an instance's node was lost wait in `roost_node_orders` until
the node carries them out; the mirror shows such an instance as ``shutting-down``
meanwhile (docs/architecture.md, "Lost nodes").

A node that an operator forgot (`roost node forget`) will never expire its records, so
the gateways do it for it: each process deletes its share (`start`'s ``mine``) of a
forgotten node's records once they have been terminated longer than the retention.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from roost.bus import subjects
from roost.bus.connect import follow_bucket
from roost.bus.failures import BUS_DOWN
from roost.bus.schemas import InstanceRecord, NodeOrder, decode, encode, stamp_seconds
from roost.domain.accounts import COUNTED_STATES, DEFAULT_ACCOUNT, Held, Tally
from roost.domain.errors import InvalidInstanceIDNotFound, ServiceUnavailable
from roost.gateway.tagging import changed
from roost.gateway.tenancy import confined_to, visible

log = logging.getLogger(__name__)

_DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, ValueError)
EXPIRE_SLICE = 2_000
"""Records looked at between yields to other requests, in a look for expired ones."""


def _newer(a: InstanceRecord, b: InstanceRecord, *, from_bucket: bool) -> bool:
    """Whether ``a`` should replace ``b``.

    Stamps have millisecond precision, so two moves of one instance can share one. The
    bucket delivers a key's writes in order, so from there an equal stamp is a later
    write; a record from a reply may be older than what the bucket already showed, so it
    must be strictly newer.
    """
    if not (a.updated_at and b.updated_at):
        return True
    return a.updated_at >= b.updated_at if from_bucket else a.updated_at > b.updated_at


class InstanceIndex:
    def __init__(self, records: KeyValue, tags: KeyValue, user_data: KeyValue,
                 orders: KeyValue | None = None) -> None:
        self._records_kv = records
        self._tags_kv = tags
        self._user_data_kv = user_data
        self._orders_kv = orders
        self._records: dict[str, InstanceRecord] = {}
        self._tags: dict[str, tuple[int, dict[str, str]]] = {}
        self._with_user_data: set[str] = set()
        self._orders: dict[str, NodeOrder] = {}  # instance id -> terminate deferred
        self._forgotten: set[str] = set()
        """Nodes an operator declared gone for good (`roost node forget`)."""
        kinds = ("records", "tags", "user_data") + (("orders",) if orders else ())
        self._synced = {k: asyncio.Event() for k in kinds}
        self._tasks: list[asyncio.Task[None]] = []
        self._chores: set[asyncio.Task[None]] = set()
        self.group_overrides: Mapping[str, list[str]] = {}
        """Security groups set by ModifyInstanceAttribute after launch (instance id ->
        group ids), kept by the gateways (`NetworkStore`) as tags are: the node owns the
        record and rewrites it on every state change."""
        self.on_forgotten: Callable[[str], None] | None = None
        """Called with a node's id when an operator ran `roost node forget` on it."""
        self.on_gone: Callable[[InstanceRecord], None] | None = None
        """Called once per mirror when an instance terminates or its record expires:
        what it held besides its node's room (its address) can be given back."""
        self.on_public_dropped: Callable[[InstanceRecord], None] | None = None
        """Called with the previous record when an instance's public IPv4 address
        changes or goes (the node clears it on stop): that address can be given back."""
        self.weigh: Callable[[InstanceRecord], Held | None] = lambda _rec: None
        """What an instance counts against its account's quotas (None: nothing); set
        before the mirror starts."""
        self._tallies: dict[str, Tally] = {}
        """Account -> the sum of what its instances in `COUNTED_STATES` count, kept as
        records change, so that a quota check does not walk an account's instances."""
        self._counted: dict[str, Held] = {}
        """Instance id -> what it adds to its account's tally now."""
        self._launched: dict[str, int] = {}
        """Reservation id -> how many of its instances the mirror holds."""

    # -- reading -----------------------------------------------------------

    def _merged(self, rec: InstanceRecord) -> InstanceRecord:
        order = self._orders.get(rec.instance_id)
        if order is not None and rec.state not in ("shutting-down", "terminated"):
            rec = msgspec.structs.replace(rec, state="shutting-down",
                                          state_transition_reason=order.note)
        found = self._tags.get(rec.instance_id)
        if found is not None:
            rec = msgspec.structs.replace(rec, tags=dict(found[1]))
        groups = self.group_overrides.get(rec.instance_id)
        if groups is not None and rec.network is not None:
            net = msgspec.structs.replace(rec.network, security_group_ids=list(groups))
            rec = msgspec.structs.replace(rec, network=net)
        return rec

    def all(self) -> list[InstanceRecord]:
        """The caller's instances (`roost.gateway.tenancy`): every one outside a request."""
        only = confined_to()
        if only is None:
            return [self._merged(r) for r in self._records.values()]
        legacy = only == DEFAULT_ACCOUNT  # records from before accounts carry no owner
        return [self._merged(r) for r in self._records.values()
                if r.owner_id == only or (legacy and not r.owner_id)]

    def find(self, instance_id: str) -> InstanceRecord | None:
        rec = self._records.get(instance_id)
        return None if rec is None or not visible(rec.owner_id) else self._merged(rec)

    def tally(self, account_id: str) -> Tally:
        """What the account's instances count against its quotas, as this mirror has
        them (`roost.domain.accounts.Usage.counted` adds what it does not show yet)."""
        return self._tallies.get(account_id) or Tally()

    def launched(self, reservation_id: str) -> int:
        """How many instances of the reservation the mirror holds, in any state."""
        return self._launched.get(reservation_id, 0)

    def _recount(self, old: InstanceRecord | None, new: InstanceRecord | None) -> None:
        """Move the tallies from ``old`` (the record replaced, or removed) to ``new``."""
        if old is not None:
            left = self._launched.get(old.reservation_id, 0) - 1
            if left > 0:
                self._launched[old.reservation_id] = left
            else:
                self._launched.pop(old.reservation_id, None)
            held = self._counted.pop(old.instance_id, None)
            if held is not None:
                self._tallies[old.owner_id or DEFAULT_ACCOUNT].add(held, -1)
        if new is not None:
            self._launched[new.reservation_id] = self._launched.get(new.reservation_id, 0) + 1
            held = self.weigh(new) if new.state in COUNTED_STATES else None
            if held is not None:
                self._counted[new.instance_id] = held
                self._tallies.setdefault(new.owner_id or DEFAULT_ACCOUNT, Tally()).add(held)

    def state_of(self, instance_id: str) -> str | None:
        """The state the mirror holds for ``instance_id``, whoever asks; None if it
        holds no record (not yet mirrored, or expired)."""
        rec = self._records.get(instance_id)
        return None if rec is None else rec.state

    async def require(self, ids: Iterable[str]) -> list[InstanceRecord]:
        """Records for ``ids``, fetching misses from the bucket; NotFound names them all."""
        out, missing = [], []
        for iid in ids:
            rec = self.find(iid) or await self._fetch(iid)
            if rec is None:
                missing.append(iid)
            else:
                out.append(rec)
        if missing:
            names = ", ".join(missing)
            plural = "s" if len(missing) > 1 else ""
            raise InvalidInstanceIDNotFound(
                f"The instance ID{plural} '{names}' do{'' if plural else 'es'} not exist"
            )
        return out

    async def _fetch(self, instance_id: str) -> InstanceRecord | None:
        try:
            entry = await self._records_kv.get(instance_id)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.InvalidKeyError):
            return None
        except BUS_DOWN as exc:
            raise ServiceUnavailable(f"The instance index is unreachable: {exc!r}") from None
        try:
            rec = decode(entry.value or b"", InstanceRecord)
        except _DECODE_ERRORS:
            return None
        self.upsert(rec, from_bucket=True)
        return self._merged(rec) if visible(rec.owner_id) else None

    @property
    def synced(self) -> bool:
        return all(e.is_set() for e in self._synced.values())

    # -- writing -----------------------------------------------------------

    def upsert(self, rec: InstanceRecord, *, from_bucket: bool = False) -> None:
        """Take ``rec`` into the mirror unless what it holds is newer. Records from
        replies go in with ``from_bucket`` False, so that a caller sees its own launches
        and commands at once."""
        cur = self._records.get(rec.instance_id)
        if cur is None or _newer(rec, cur, from_bucket=from_bucket):
            self._records[rec.instance_id] = rec
            self._recount(cur, rec)
            if (cur is not None and cur.public_ip and rec.public_ip != cur.public_ip
                    and self.on_public_dropped is not None):
                self.on_public_dropped(cur)
            ended = rec.state == "terminated" and (cur is None or cur.state != "terminated")
            if ended and self.on_gone is not None:
                self.on_gone(rec)

    async def set_tags(self, rec: InstanceRecord, change: Mapping[str, str | None], *,
                       delete: bool) -> None:
        """Apply a CreateTags (``delete`` False) or DeleteTags change with CAS retries
        (`tagging.changed`: what it does, and the limit it keeps, counted afresh on
        every retry)."""
        for _ in range(20):
            found = self._tags.get(rec.instance_id)
            rev, current = found if found is not None else (0, dict(rec.tags))
            tags = changed(rec.instance_id, current, change, delete=delete)
            data = msgspec.json.encode(tags)
            try:
                if rev:
                    rev = await self._tags_kv.update(rec.instance_id, data, last=rev)
                else:
                    rev = await self._tags_kv.create(rec.instance_id, data)
            except nats.js.errors.KeyWrongLastSequenceError:
                await self._reload_tags(rec.instance_id)
                continue
            except BUS_DOWN as exc:
                raise ServiceUnavailable(f"The tag store is unreachable: {exc!r}") from None
            self._tags[rec.instance_id] = (rev, tags)
            return
        raise ServiceUnavailable("Tags for this instance are changing too fast; retry.")

    async def _reload_tags(self, instance_id: str) -> None:
        try:
            entry = await self._tags_kv.get(instance_id)
            self._tags[instance_id] = (entry.revision or 0,
                                       msgspec.json.decode(entry.value or b"{}",
                                                           type=dict[str, str]))
        except nats.js.errors.KeyNotFoundError:
            self._tags.pop(instance_id, None)

    async def order(self, rec: InstanceRecord, order: NodeOrder) -> InstanceRecord:
        """Leave ``order`` for the lost node that holds ``rec``; the record as the mirror
        shows it from now on. Giving the same order twice is harmless."""
        if self._orders_kv is None:
            raise ServiceUnavailable(f"Node {rec.node_id} is lost and this gateway keeps "
                                     "no orders for it.")
        try:
            await self._orders_kv.put(subjects.node_order(rec.node_id, rec.instance_id),
                                      encode(order))
        except BUS_DOWN as exc:
            raise ServiceUnavailable(f"The node order store is unreachable: {exc!r}") from None
        self._orders[rec.instance_id] = order
        return self._merged(rec)

    async def put_user_data(self, instance_id: str, user_data_b64: str) -> None:
        try:
            await self._user_data_kv.put(instance_id, user_data_b64.encode())
        except BUS_DOWN as exc:
            log.error("could not keep user data of %s: %r", instance_id, exc)
            return
        self._with_user_data.add(instance_id)

    async def user_data(self, instance_id: str) -> str:
        """The base64 user data ``instance_id`` was launched with, "" if none."""
        try:
            entry = await self._user_data_kv.get(instance_id)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.InvalidKeyError):
            return ""
        except BUS_DOWN as exc:
            raise ServiceUnavailable(f"The user data store is unreachable: {exc!r}") from None
        return (entry.value or b"").decode("ascii", errors="replace")

    # -- watching ----------------------------------------------------------

    def is_forgotten(self, node_id: str) -> bool:
        """Whether an operator forgot ``node_id`` and it has not come back since."""
        return node_id in self._forgotten

    async def expire_forgotten(self, now: float, retention: float,
                               mine: Callable[[InstanceRecord], bool]) -> int:
        """Delete the records of forgotten nodes terminated more than ``retention``
        seconds before ``now`` and ``mine`` to delete (the node, gone, cannot). Tags and
        user data follow when the delete comes back through the watch. Returns how
        many were deleted; a failed delete is left for the next look."""
        if not self._forgotten:
            return 0
        cutoff = now - retention
        due = []
        for k, rec in enumerate(list(self._records.values())):
            if k % EXPIRE_SLICE == EXPIRE_SLICE - 1:
                await asyncio.sleep(0)
            if (rec.node_id in self._forgotten and rec.state == "terminated"
                    and stamp_seconds(rec.updated_at) <= cutoff and mine(rec)):
                due.append(rec.instance_id)
        deleted = 0
        for iid in due:
            try:
                deleted += await self._expire_one(iid)
            except BUS_DOWN as exc:
                log.warning("could not expire %s of a forgotten node: %r", iid, exc)
        if deleted:
            log.info("expired %d records of forgotten nodes, terminated before %s s", deleted,
                     round(cutoff))
        return deleted

    async def _expire_one(self, iid: str) -> int:
        """Delete one due record if it still is: its node may have come back since the
        look (and put a newer record, which this mirror may not have seen yet), so the
        record is read again and deleted only at the revision that was read."""
        rec = self._records.get(iid)
        if rec is None or rec.node_id not in self._forgotten:
            return 0
        try:
            entry = await self._records_kv.get(iid)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return 0  # another gateway process expired it
        try:
            now = decode(entry.value or b"", InstanceRecord)
        except _DECODE_ERRORS:
            return 0  # not a record this gateway can judge: left as the watch left it
        if now.state != "terminated" or now.node_id not in self._forgotten:
            return 0
        try:
            await self._records_kv.delete(iid, last=entry.revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            return 0  # written again meanwhile: its node is back
        return 1

    async def _expirer(self, retention: float, mine: Callable[[InstanceRecord], bool]
                       ) -> None:
        every = min(60.0, retention / 4)
        await asyncio.sleep(random.uniform(0, every))  # a pool's processes not in step
        while True:
            try:
                await self.expire_forgotten(time.time(), retention, mine)
            except Exception as exc:  # best effort: the next look retries
                log.warning("expiring the records of forgotten nodes failed: %r", exc)
            await asyncio.sleep(every)

    def start(self, *, retention: float | None = None,
              mine: Callable[[InstanceRecord], bool] = lambda _rec: True) -> None:
        """Follow the buckets; with ``retention``, also expire forgotten nodes' records
        (`expire_forgotten`) every ``min(60, retention / 4)`` seconds."""
        self._tasks = [
            asyncio.create_task(self._follow(self._records_kv, "records"), name="watch-records"),
            asyncio.create_task(self._follow(self._tags_kv, "tags"), name="watch-tags"),
            asyncio.create_task(self._follow(self._user_data_kv, "user_data", meta_only=True),
                                name="watch-user-data"),
        ]
        if self._orders_kv is not None:
            self._tasks.append(asyncio.create_task(self._follow(self._orders_kv, "orders"),
                                                   name="watch-orders"))
        if retention is not None:
            self._tasks.append(asyncio.create_task(self._expirer(retention, mine),
                                                   name="expire-forgotten"))

    async def wait_synced(self, timeout: float | None) -> None:
        await asyncio.wait_for(
            asyncio.gather(*(e.wait() for e in self._synced.values())), timeout
        )

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _follow(self, kv: KeyValue, what: str, *, meta_only: bool = False
                ) -> Coroutine[Any, Any, None]:
        return follow_bucket(kv, what, on_entry=lambda e: self._on_entry(what, e),
                             synced=self._synced[what], meta_only=meta_only)

    def _on_entry(self, what: str, entry: KeyValue.Entry) -> None:
        removed = entry.operation in (KV_DEL, KV_PURGE)
        key = entry.key
        if what == "user_data":
            (self._with_user_data.discard if removed else self._with_user_data.add)(key)
            return
        if what == "orders":
            self._on_order(key, None if removed else entry.value or b"")
            return
        if what == "tags":
            if removed:
                self._tags.pop(key, None)
                return
            try:
                tags = msgspec.json.decode(entry.value or b"{}", type=dict[str, str])
            except _DECODE_ERRORS:
                return
            cur = self._tags.get(key)
            if cur is None or (entry.revision or 0) >= cur[0]:
                self._tags[key] = (entry.revision or 0, tags)
            return
        if removed:
            gone = self._records.pop(key, None)
            self._recount(gone, None)
            if gone is not None and gone.state != "terminated" and self.on_gone is not None:
                self.on_gone(gone)
            if key in self._tags or key in self._with_user_data:
                chore = asyncio.get_running_loop().create_task(self._drop_extras(key))
                self._chores.add(chore)
                chore.add_done_callback(self._chores.discard)
            return
        try:
            self.upsert(decode(entry.value or b"", InstanceRecord), from_bucket=True)
        except _DECODE_ERRORS:
            log.warning("undecodable instance record %s", key)

    def _on_order(self, key: str, value: bytes | None) -> None:
        node_id, _, what = key.partition(".")
        if what == subjects.FORGOTTEN:
            if value is None:
                self._forgotten.discard(node_id)
                return
            self._forgotten.add(node_id)
            if self.on_forgotten is not None:
                self.on_forgotten(node_id)
            return
        if value is None:
            self._orders.pop(what, None)  # carried out: the node's record says so
            return
        try:
            self._orders[what] = decode(value, NodeOrder)
        except _DECODE_ERRORS:
            log.warning("undecodable node order %s", key)

    async def _drop_extras(self, instance_id: str) -> None:
        """An instance record expired: its tags and user data describe nothing now."""
        for kv, held in ((self._tags_kv, instance_id in self._tags),
                         (self._user_data_kv, instance_id in self._with_user_data)):
            if held:
                try:
                    await kv.delete(instance_id)
                except BUS_DOWN:
                    pass
