"""The network buckets on a real NATS: two gateways' stores racing for addresses and
names, release by revision, and the sweep of addresses a crashed gateway left."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import msgspec
import nats
import pytest
from nats.aio.client import Client

from roost.bus import schemas as s
from roost.bus import subjects
from roost.bus.connect import key_value
from roost.domain.errors import InvalidIPAddressInUse
from roost.domain.network import PUBLIC_POOL_ID, SecurityGroup
from roost.embedded import NatsServer
from roost.gateway.network import ORPHAN_AFTER, NetworkStore
from tests.polling import until


async def _store(nc: Client) -> NetworkStore:
    store = NetworkStore(await key_value(nc, subjects.NETWORK_BUCKET),
                         await key_value(nc, subjects.ADDRESSES_BUCKET),
                         await key_value(nc, subjects.KEY_PAIRS_BUCKET),
                         region="roost-1", owner_id="000000000000",
                         zones=lambda: ["roost-1a"])
    store.start(list)
    await store.wait_synced(10)
    return store


@pytest.fixture
async def stores(nats_server: NatsServer) -> AsyncIterator[tuple[NetworkStore, NetworkStore]]:
    conns = [await nats.connect(nats_server.url) for _ in range(2)]
    a, b = await _store(conns[0]), await _store(conns[1])
    yield a, b
    await a.stop()
    await b.stop()
    for nc in conns:
        await nc.close()


async def test_two_gateways_never_hand_out_one_address(
        stores: tuple[NetworkStore, NetworkStore]) -> None:
    a, b = stores
    subnet = a.default_subnet_for("roost-1a")
    got = await asyncio.gather(*(store.allocate(subnet, f"r-{i}")
                                 for i in range(20) for store in (a, b)))
    assert len(set(got)) == 40
    assert min(got, key=lambda ip: tuple(map(int, ip.split(".")))) == "172.31.0.4"
    with pytest.raises(InvalidIPAddressInUse):
        await b.allocate(subnet, "r-x", got[0])


async def test_release_is_by_revision(stores: tuple[NetworkStore, NetworkStore]) -> None:
    a, b = stores
    subnet = a.default_subnet_for("roost-1a")
    ip = await a.allocate(subnet, "r-1")
    await a.release(subnet.subnet_id, ip, "r-1")
    await until("b's mirror sees the address go",
                lambda: b.addresses_in_use(subnet.subnet_id) == 0)
    again = await b.allocate(subnet, "r-2", ip)  # free again, taken by another launch
    await until("a's mirror sees it taken again",
                lambda: a.addresses_in_use(subnet.subnet_id) == 1)
    await a.release(subnet.subnet_id, ip, "r-1")  # a late release of the old holder
    await asyncio.sleep(0.2)
    assert again == ip and a.addresses_in_use(subnet.subnet_id) == 1


async def test_terminated_instance_gives_its_addresses_back(
        stores: tuple[NetworkStore, NetworkStore]) -> None:
    a, b = stores
    subnet = a.default_subnet_for("roost-1a")
    ip = await a.allocate(subnet, "r-1-0")
    public = await a.allocate(a.public_pool, "r-1-0")
    # b releases only what its own copy holds: wait until it holds both
    await until("b's mirror holds both addresses",
                lambda: b.addresses_in_use(subnet.subnet_id) == 1
                and b.addresses_in_use(PUBLIC_POOL_ID) == 1)
    rec = s.InstanceRecord(instance_id="i-0123456789abcdef0", node_id="n1",
                           instance_type="t3.micro", image_id="ami-00000000000000001",
                           state="running", launch_id="r-1-0", reservation_id="r-1",
                           launch_time="2026-01-01T00:00:00Z", availability_zone="roost-1a",
                           private_ip=ip, public_ip=public,
                           network=s.InstanceNetwork(subnet_id=subnet.subnet_id))
    # A live instance's addresses, public one included, are not orphans to the sweep.
    assert await a.sweep([rec], now=time.time() + ORPHAN_AFTER + 1) == 0
    b.instance_gone(msgspec.structs.replace(rec, state="terminated"))  # seen by another
    await until("a's mirror sees both addresses given back",
                lambda: a.addresses_in_use(subnet.subnet_id) == 0
                and a.addresses_in_use(PUBLIC_POOL_ID) == 0, timeout=2.5, interval=0.05,
                detail=lambda: (f"in use: {a.addresses_in_use(subnet.subnet_id)} private, "
                                f"{a.addresses_in_use(PUBLIC_POOL_ID)} public"))


async def test_a_stopped_instance_gives_its_public_address_back(
        stores: tuple[NetworkStore, NetworkStore]) -> None:
    a, b = stores
    old = await a.allocate(a.public_pool, "r-2-0")
    new = await a.allocate(a.public_pool, "r-2-0")  # started again: a new one
    await until("b's mirror holds both public addresses",
                lambda: b.addresses_in_use(PUBLIC_POOL_ID) == 2)
    rec = s.InstanceRecord(instance_id="i-0123456789abcdef1", node_id="n1",
                           instance_type="t3.micro", image_id="ami-00000000000000001",
                           state="running", launch_id="r-2-0", reservation_id="r-2",
                           launch_time="2026-01-01T00:00:00Z", availability_zone="roost-1a",
                           public_ip=old)
    b.public_dropped(rec)  # another gateway saw the node clear it on stop
    await until("a's mirror sees the old public address given back",
                lambda: a.addresses_in_use(PUBLIC_POOL_ID) == 1, timeout=2.5, interval=0.05,
                detail=lambda: f"{a.addresses_in_use(PUBLIC_POOL_ID)} public in use")
    assert await b.allocate(b.public_pool, "r-3-0", old) == old  # free again
    assert new != old


async def test_sweep_frees_addresses_no_instance_holds(
        stores: tuple[NetworkStore, NetworkStore]) -> None:
    a, _ = stores
    subnet = a.default_subnet_for("roost-1a")
    ip = await a.allocate(subnet, "r-crashed-0")
    assert await a.sweep([], now=0.0) == 0  # young: a launch may still be under way

    assert await a.sweep([], now=time.time() + ORPHAN_AFTER + 1) == 1
    assert a.addresses_in_use(subnet.subnet_id) == 0, ip


async def test_one_process_of_a_pool_gives_back_and_the_sweep_covers_a_miss(
        stores: tuple[NetworkStore, NetworkStore]) -> None:
    """Of a pool's processes one gives back an ended instance's address (not all n);
    should it miss it, the sweep of any process takes it back at once, young or not."""
    a, b = stores
    a.stripe, b.stripe = (0, 2), (1, 2)
    owners = [[store.gives_back(f"r-{k}-0") for store in (a, b)] for k in range(200)]
    assert all(sum(o) == 1 for o in owners)
    assert 60 < sum(o[0] for o in owners) < 140  # spread over both
    subnet = a.default_subnet_for("roost-1a")
    k = next(k for k, o in enumerate(owners) if o[1])  # b's to give back
    ip = await a.allocate(subnet, f"r-{k}-0")
    rec = s.InstanceRecord(instance_id="i-0123456789abcdef2", node_id="n1",
                           instance_type="t3.micro", image_id="ami-00000000000000001",
                           state="terminated", launch_id=f"r-{k}-0", reservation_id=f"r-{k}",
                           launch_time="2026-01-01T00:00:00Z", availability_zone="roost-1a",
                           private_ip=ip, network=s.InstanceNetwork(subnet_id=subnet.subnet_id))
    a.instance_gone(rec)  # not a's: nothing written
    await asyncio.sleep(0.2)
    assert a.addresses_in_use(subnet.subnet_id) == 1
    assert await a.sweep([rec], now=time.time()) == 1  # b missed it (say it restarted)
    assert a.addresses_in_use(subnet.subnet_id) == 0


async def test_group_names_are_unique_across_gateways(
        stores: tuple[NetworkStore, NetworkStore]) -> None:
    a, b = stores
    vpc = a.default_vpc.vpc_id
    won = await asyncio.gather(a.claim_name(vpc, "web", "sg-1"), b.claim_name(vpc, "web", "sg-2"))
    assert sorted(won) == [False, True]
    group = SecurityGroup("sg-00000000000000001", "db", "d", vpc, "000000000000")
    await a.create(group)
    await until("the group reaches b's mirror",
                lambda: b.group("sg-00000000000000001") is not None, timeout=2.5, interval=0.05)
    assert b.group("sg-00000000000000001") == group


async def test_two_gateways_deleting_a_default_subnet_one_wins(
        stores: tuple[NetworkStore, NetworkStore]) -> None:
    """Deleting, then creating again, the default subnet from two gateways at once: one
    write wins each time, the other answers its ``already`` error; both mirrors agree."""
    a, b = stores
    subnet = a.default_subnet_for("roost-1a")
    assert subnet is not None
    for removed in (True, False):
        outcomes = await asyncio.gather(
            *(store.mark_removed(subnet, removed=removed, already=KeyError(removed))
              for store in (a, b)), return_exceptions=True)
        assert sorted(type(o).__name__ for o in outcomes) == ["KeyError", "Subnet"], outcomes
        await until(f"the winner's write (removed={removed}) reaches the other mirror",
                    lambda: all(st.removed(subnet.subnet_id) is removed  # noqa: B023
                                for st in (a, b)))  # (awaited in this iteration)
        for store in (a, b):
            assert store.removed(subnet.subnet_id) is removed
            assert (store.default_subnet_for("roost-1a") is None) is removed
