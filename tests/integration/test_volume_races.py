"""A volume change whose conditional write lost to another writer is judged again on
what won, instead of answering 503 (CI once saw DeleteVolume, just after the instance
ended, lose to the gateway's own background store of that kept volume)."""

from __future__ import annotations

import msgspec
import nats

from roost.bus import subjects
from roost.bus.connect import key_value
from roost.domain.volumes import Volume
from roost.embedded import NatsServer
from roost.gateway.volservice import VolumeService
from roost.gateway.volumes import VolumeStore


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
