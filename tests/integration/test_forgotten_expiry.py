"""A forgotten node's records expire through the gateways (the node, gone, cannot), on a
real NATS: only its terminated ones past the retention, only each process's share, with
their tags, and nothing more once the node has come back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import nats
import pytest
from nats.js.errors import KeyNotFoundError

from roost.bus import schemas as s
from roost.bus import subjects
from roost.bus.connect import key_value
from roost.embedded import NatsServer
from roost.gateway.index import InstanceIndex
from tests.polling import until


def stamp(seconds_from_now: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds_from_now)).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


def rec(iid: str, node: str, state: str, updated: float) -> s.InstanceRecord:
    return s.InstanceRecord(instance_id=iid, node_id=node, instance_type="t3.nano",
                            image_id="ami-0", state=state, launch_id=f"l-{iid}",
                            reservation_id="r-1", launch_time=stamp(-7200),
                            availability_zone="roost-1a", updated_at=stamp(updated))


@pytest.mark.timeout(60)
async def test_a_forgotten_nodes_terminated_records_expire_through_the_gateways(
        nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    records = await key_value(nc, subjects.INSTANCES_BUCKET)
    tags = await key_value(nc, subjects.TAGS_BUCKET)
    orders = await key_value(nc, subjects.NODE_ORDERS_BUCKET, direct=True)
    index = InstanceIndex(records, tags, await key_value(nc, subjects.USER_DATA_BUCKET), orders)
    cases = {
        "i-old": rec("i-old", "gone", "terminated", -100),  # expires
        "i-recent": rec("i-recent", "gone", "terminated", +3600),  # within the retention
        "i-running": rec("i-running", "gone", "running", -100),  # never a terminated one
        "i-alive": rec("i-alive", "alive", "terminated", -100),  # its own node's to expire
        "i-other": rec("i-other", "gone", "terminated", -100),  # another process's share
    }
    for iid, r in cases.items():
        await records.put(iid, s.encode(r))
    await tags.put("i-old", b'{"Name":"web"}')
    await orders.put(subjects.node_order("gone", subjects.FORGOTTEN), b"{}")
    index.start(retention=2.0, mine=lambda r: r.instance_id != "i-other")
    try:
        await index.wait_synced(10)
        assert index.is_forgotten("gone") and not index.is_forgotten("alive")
        await until("the old record of the forgotten node deleted",
                    lambda: index.find("i-old") is None)

        async def tags_gone() -> bool:
            try:
                await tags.get("i-old")
            except KeyNotFoundError:
                return True
            return False

        # its tags go with it (deleted when the delete comes back)
        await until("the expired instance's tags go", tags_gone, timeout=5, interval=0.05)
        assert {r.instance_id for r in index.all()} == set(cases) - {"i-old"}
        # The node comes back: it clears the mark, and owns its records again.
        await orders.delete(subjects.node_order("gone", subjects.FORGOTTEN))
        await records.put("i-back", s.encode(rec("i-back", "gone", "terminated", -100)))
        await until("the mirror sees it", lambda: index.find("i-back") is not None)
        await until("the mark's delete mirrored", lambda: not index.is_forgotten("gone"))
        assert await index.expire_forgotten(datetime.now(UTC).timestamp(), 2.0,
                                            lambda _r: True) == 0
        assert index.find("i-back") is not None
    finally:
        await index.stop()
        await nc.close()


@pytest.mark.timeout(60)
async def test_a_record_written_again_after_the_look_is_not_expired(
        nats_server: NatsServer) -> None:
    """The forgotten node came back without a restart and put a newer record, which this
    mirror has not seen yet: the expiry reads the record again before it deletes."""
    nc = await nats.connect(nats_server.url)
    records = await key_value(nc, subjects.INSTANCES_BUCKET)
    orders = await key_value(nc, subjects.NODE_ORDERS_BUCKET, direct=True)
    index = InstanceIndex(records, await key_value(nc, subjects.TAGS_BUCKET),
                          await key_value(nc, subjects.USER_DATA_BUCKET), orders)
    await records.put("i-due", s.encode(rec("i-due", "gone", "terminated", -100)))
    await records.put("i-back", s.encode(rec("i-back", "gone", "terminated", -100)))
    await orders.put(subjects.node_order("gone", subjects.FORGOTTEN), b"{}")
    index.start()  # no expirer: the test calls the expiry itself
    try:
        await index.wait_synced(10)
        await until("the mark mirrored", lambda: index.is_forgotten("gone"))
        await until("both records mirrored", lambda: index.find("i-back") is not None
                    and index.find("i-due") is not None)
    finally:
        await index.stop()  # the mirror stands still from here
    try:
        await records.put("i-back", s.encode(rec("i-back", "gone", "shutting-down", +3600)))
        now = datetime.now(UTC).timestamp()
        assert await index.expire_forgotten(now, 2.0, lambda _r: True) == 1
        assert s.decode((await records.get("i-back")).value or b"",
                        s.InstanceRecord).state == "shutting-down"
        with pytest.raises(KeyNotFoundError):
            await records.get("i-due")
    finally:
        await nc.close()
