"""A volume change whose conditional write lost to another writer is judged again on
what won, instead of answering 503 (CI once saw DeleteVolume, just after the instance
ended, lose to the gateway's own background store of that kept volume)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import nats

from roost.bus import schemas as s
from roost.bus import subjects
from roost.bus.connect import key_value
from roost.domain.volumes import Attachment, Volume
from roost.embedded import NatsServer
from roost.gateway.volservice import VolumeService
from roost.gateway.volumes import VolumeStore
from tests.polling import until


async def test_a_delete_that_lost_a_race_is_judged_again_and_done(
        nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        kv = await key_value(nc, subjects.VOLUMES_BUCKET)
        store = VolumeStore(kv, list)  # no watch: its view stays behind the bucket
        vol = Volume("vol-0123456789abcdef0", 8, "gp3", "roost-1a", "2026-01-01T00:00:00Z")
        await store.put(vol)
        entry = await kv.get(vol.volume_id)  # another writer moves it on meanwhile
        tagged = msgspec.structs.replace(vol, tags={"by": "another gateway"})
        await kv.update(vol.volume_id, msgspec.json.encode(tagged), last=entry.revision)

        service = VolumeService(store, None, lambda: ["roost-1a"])  # type: ignore[arg-type]
        await service.delete(vol.volume_id)

        now = msgspec.json.decode((await kv.get(vol.volume_id)).value or b"", type=Volume)
        assert now.deleted and now.tags == {"by": "another gateway"}
    finally:
        await nc.close()


async def test_a_late_settle_never_detaches_a_volume_attached_again_meanwhile(
        nats_server: NatsServer) -> None:
    """Two gateways see an instance end. One settles its volume, which is then attached
    to another instance; the other's settle, judged on what it saw before, comes late
    and must not detach it again."""
    nc = await nats.connect(nats_server.url)
    kv = await key_value(nc, subjects.VOLUMES_BUCKET)
    first, late = VolumeStore(kv, list), VolumeStore(kv, list)
    try:
        for store in (first, late):
            store.start()
            await store.wait_synced(5)
        vol = Volume("vol-0fedcba9876543210", 8, "gp3", "roost-1a", "2026-01-01T00:00:00Z",
                     attachment=Attachment("i-0aaaaaaaaaaaaaaaa", "/dev/sdf",
                                           "2026-01-01T00:00:00Z"))
        await first.put(vol)
        await until("the other mirror has it", lambda: late.has_stored(vol.volume_id))
        ended = s.InstanceRecord(
            instance_id="i-0aaaaaaaaaaaaaaaa", node_id="n1", instance_type="t3.nano",
            image_id="ami-00000000000000001", state="terminated", launch_id="l-1",
            reservation_id="r-1", launch_time="2026-01-01T00:00:00Z",
            availability_zone="roost-1a")
        settle = late._settle
        held = asyncio.Event()

        async def slow_settle(*args: Any) -> None:
            await held.wait()  # this gateway's writes are behind a loaded bus
            await settle(*args)

        late._settle = slow_settle  # type: ignore[method-assign]
        late.instance_gone(ended)  # judged now, written later
        first.instance_gone(ended)
        await until("settled by the first",
                    lambda: (first.find(vol.volume_id) or vol).attachment is None)
        free = first.find(vol.volume_id)
        assert free is not None
        again = msgspec.structs.replace(free, attachment=Attachment(
            "i-0bbbbbbbbbbbbbbbb", "/dev/sdg", "2026-01-02T00:00:00Z"))
        await first.put(again, base=free)  # AttachVolume to another instance
        await until("the late mirror sees it attached again",
                    lambda: (late.find(vol.volume_id) or vol).attachment == again.attachment)
        held.set()
        await until("the late settle done", lambda: not late._chores)
        stored = msgspec.json.decode((await kv.get(vol.volume_id)).value or b"", type=Volume)
        assert stored.attachment == again.attachment
    finally:
        for store in (first, late):
            await store.stop()
        await nc.close()
