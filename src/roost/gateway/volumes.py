"""The gateway's view of EBS volumes: those derived from instance records (root and
launch mappings) merged with the stored ones of the `roost_volumes` bucket.

A stored record under a derived id replaces the derived volume: that is how a launch
volume is detached, or kept after its instance terminated with DeleteOnTermination
false. Deletion leaves a tombstone (`Volume.deleted`), so that a gateway which sees an
old termination again (a restart replays the bucket) cannot bring a deleted volume back.
Writes are compare-and-set on the volume's key: two gateways attaching one volume
cannot both win.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from roost.bus.connect import follow_bucket
from roost.bus.failures import BUS_DOWN
from roost.bus.schemas import InstanceRecord
from roost.domain.errors import ServiceUnavailable
from roost.domain.volumes import (
    Attachment,
    Volume,
    default_iops,
    default_throughput,
    launch_volume_id,
)
from roost.gateway.render import root_volume_id
from roost.gateway.tenancy import visible

log = logging.getLogger(__name__)
_RETRIES = 20
_DECODE = msgspec.json.Decoder(Volume)


class VolumeRaced(ServiceUnavailable):
    """A conditional write lost to another writer (a gateway, or this one's own
    background settle of an ended instance); the store has re-read the volume, so the
    caller may judge its change again against what won."""


def _unavailable(exc: BaseException) -> ServiceUnavailable:
    return ServiceUnavailable(f"The volume store is unreachable: {exc!r}")


def launch_volumes(rec: InstanceRecord) -> list[tuple[Volume, bool]]:
    """The volumes an instance record implies (root first), each with its
    DeleteOnTermination flag; attached while the instance is not terminated."""
    if rec.network is None:
        return []
    net = rec.net
    live = rec.state != "terminated"

    def one(vid: str, device: str, size: int, vtype: str, iops: int | None,
            throughput: int | None, encrypted: bool, delete: bool) -> tuple[Volume, bool]:
        attachment = (Attachment(rec.instance_id, device, rec.launch_time, delete)
                      if live else None)
        snapshot = "snap-" + rec.image_id[4:] if device == net.root_device_name else ""
        return Volume(vid, size, vtype, rec.availability_zone, rec.launch_time,
                      iops or default_iops(vtype, size),
                      throughput or default_throughput(vtype), encrypted, snapshot,
                      dict(net.volume_tags), attachment, owner_id=rec.owner_id), delete

    out = [one(root_volume_id(rec.instance_id), net.root_device_name, net.root_volume_size,
               net.root_volume_type, net.root_volume_iops, net.root_volume_throughput,
               net.root_volume_encrypted, net.root_delete_on_termination)]
    out += [one(launch_volume_id(rec.instance_id, v.device), v.device, v.size,
                v.volume_type, v.iops, v.throughput, v.encrypted, v.delete_on_termination)
            for v in net.volumes]
    return out


class VolumeStore:
    def __init__(self, kv: KeyValue, records: Callable[[], list[InstanceRecord]]) -> None:
        self._kv = kv
        self._records = records
        self._stored: dict[str, tuple[int, Volume]] = {}
        self._synced = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._chores: set[asyncio.Task[None]] = set()

    # -- reading ---------------------------------------------------------------------

    def has_stored(self, volume_id: str) -> bool:
        return volume_id in self._stored

    def derived(self) -> dict[str, Volume]:
        """Volumes of instance records that no stored record replaces: those of live
        instances, and those kept (DeleteOnTermination false) by terminated ones."""
        out: dict[str, Volume] = {}
        for rec in self._records():
            for vol, delete in launch_volumes(rec):
                if vol.volume_id in self._stored:
                    continue
                if vol.attachment is not None or not delete:
                    out[vol.volume_id] = vol
        return out

    def all(self) -> dict[str, Volume]:
        """Every volume the caller may see (`roost.gateway.tenancy`): derived ones come
        from the instances it sees, stored ones carry their owner."""
        out = self.derived()
        out.update({vid: v for vid, (_, v) in self._stored.items()
                    if not v.deleted and visible(v.owner_id)})
        return out

    def find(self, volume_id: str) -> Volume | None:
        stored = self._stored.get(volume_id)
        if stored is not None:
            vol = stored[1]
            return None if vol.deleted or not visible(vol.owner_id) else vol
        return self.derived().get(volume_id)

    def attached(self, rec: InstanceRecord) -> list[Volume]:
        """What DescribeInstances lists in an instance's BlockDeviceMappings."""
        if rec.state == "terminated":
            return []
        own = [v for v, _ in launch_volumes(rec) if v.volume_id not in self._stored]
        others = [v for _, v in self._stored.values()
                  if v.attachment is not None and v.attachment.instance_id == rec.instance_id
                  and not v.deleted]
        return own + others

    def attached_elsewhere(self) -> set[str]:
        """Instances that have a stored volume attached (the rest show only what their
        record implies, so DescribeInstances need not look them up)."""
        return {v.attachment.instance_id for _, v in self._stored.values()
                if v.attachment is not None and not v.deleted}

    # -- writing ---------------------------------------------------------------------

    async def put(self, vol: Volume, *, base: Volume | None = None) -> Volume:
        """Store ``vol``: as a new key when ``base`` is None, else over the stored
        revision ``base`` was read at (a lost race answers 503: the caller retries
        against what won).

        ``base`` is the object this mirror handed out: when the mirror holds another by
        now (a newer revision from any gateway, or one stored since ``base`` was derived
        from an instance's record), the change was judged on a stale read and is a lost
        race here, before any write; the write itself is conditional on the revision
        the mirror holds."""
        stored = self._stored.get(vol.volume_id)
        if base is not None and stored is not None and stored[1] is not base:
            raise VolumeRaced(f"The volume '{vol.volume_id}' changed meanwhile; retry.")
        rev = stored[0] if stored is not None else 0
        data = msgspec.json.encode(vol)
        try:
            if rev and base is not None:
                rev = await self._kv.update(vol.volume_id, data, last=rev)
            else:
                rev = await self._kv.create(vol.volume_id, data)
        except nats.js.errors.KeyWrongLastSequenceError:
            await self._reread(vol.volume_id)
            raise VolumeRaced(
                f"The volume '{vol.volume_id}' changed meanwhile; retry.") from None
        except BUS_DOWN as exc:
            raise _unavailable(exc) from None
        self._stored[vol.volume_id] = (rev, vol)
        return vol

    async def _reread(self, volume_id: str) -> None:
        """Take the stored volume as the bucket has it now, not waiting for the watch."""
        try:
            entry = await self._kv.get(volume_id)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            self._stored.pop(volume_id, None)
            return
        except BUS_DOWN:
            return  # the watch brings it in time
        self._on_entry(entry)

    def instance_gone(self, rec: InstanceRecord) -> None:
        """An instance terminated: volumes it keeps become available on their own
        (stored, in the background; every gateway may try, the writes are conditional);
        the others need no write, as `derived` leaves them out once it has ended.

        What to write is worked out here, and a background task is made only when there
        is a write: most instances keep no volume, and a task for each that ended had
        been 13% of a gateway process's samples in a burst at 1,000 nodes (py-spy)."""
        live = msgspec.structs.replace(rec, state="running")
        kept = [msgspec.structs.replace(vol, attachment=None)
                for vol, delete in launch_volumes(live)
                if not delete and vol.volume_id not in self._stored]
        done = [(msgspec.structs.replace(vol, attachment=None,
                                         deleted=att.delete_on_termination), vol)
                for _, vol in self._stored.values()
                if (att := vol.attachment) is not None and att.instance_id == rec.instance_id
                and not vol.deleted]
        if kept or done:
            self._chore(self._settle(rec.instance_id, kept, done))

    async def _settle(self, instance_id: str, kept: list[Volume],
                      done: list[tuple[Volume, Volume]]) -> None:
        try:
            for vol in kept:
                try:
                    await self.put(vol)
                except VolumeRaced:
                    pass  # another gateway stored it first
            for vol, base in done:
                try:
                    await self.put(vol, base=base)
                except VolumeRaced:
                    pass  # settled by another gateway, or attached again since: it stands
        except ServiceUnavailable as exc:
            log.warning("volumes of %s not settled: %s", instance_id, exc)

    def _chore(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)

    # -- watching --------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [asyncio.create_task(
            follow_bucket(self._kv, "volumes", on_entry=self._on_entry, synced=self._synced),
            name="watch-volumes")]

    async def wait_synced(self, timeout: float | None) -> None:
        await asyncio.wait_for(self._synced.wait(), timeout)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, *self._chores, return_exceptions=True)

    def _on_entry(self, entry: KeyValue.Entry) -> None:
        if entry.operation in (KV_DEL, KV_PURGE):
            self._stored.pop(entry.key, None)
            return
        rev = entry.revision or 0
        cur = self._stored.get(entry.key)
        if cur is not None and cur[0] >= rev:
            return
        try:
            self._stored[entry.key] = (rev, _DECODE.decode(entry.value or b""))
        except (msgspec.DecodeError, msgspec.ValidationError):
            log.warning("undecodable volume entry %s", entry.key)
