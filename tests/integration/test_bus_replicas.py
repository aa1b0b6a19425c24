"""How many copies `key_value` gives a bucket it makes, on real NATS clusters: three on
a cluster of three even when the client connected before the server had met the others
(a bucket of two copies there is lost with either server that holds it), two on a
cluster of two, one on a lone server; and a bucket found with fewer copies is warned of."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from nats.js.api import KeyValueConfig
from nats.js.errors import NoStreamResponseError
from nats.js.kv import KeyValue

from roost.bus.connect import connect, key_value
from roost.embedded import NatsCluster, NatsServer
from tests.polling import until


async def _put(kv: KeyValue) -> bool:
    try:
        await kv.put("k", b"v")
    except NoStreamResponseError:
        return False
    return True


async def _copies(url: str, bucket: str) -> int:
    nc = await connect([url], name="replicas-test")
    try:
        await key_value(nc, bucket)
        info = await nc.jetstream().stream_info(f"KV_{bucket}")
        assert info.config.num_replicas is not None
        return info.config.num_replicas
    finally:
        await nc.close()


async def test_a_client_that_connected_before_the_cluster_formed_makes_three_copies(
        tmp_path: Path) -> None:
    cluster = NatsCluster(3, base_dir=tmp_path)
    first, *rest = cluster.servers
    first.start()
    try:
        nc = await connect([first.url], name="replicas-test")
        try:
            # The race this guards against: the server names no other server yet.
            assert len(nc._server_info.get("connect_urls") or []) <= 1
            for s in rest:
                s.start()
            kv = await key_value(nc, "early")
            await until("the new bucket takes a put", lambda: _put(kv))
            info = await nc.jetstream().stream_info("KV_early")
            assert info.config.num_replicas == 3
            assert info.cluster is not None and len(info.cluster.replicas or []) == 2
            await key_value(nc, "later")
            assert (await nc.jetstream().stream_info("KV_later")).config.num_replicas == 3
        finally:
            await nc.close()
    finally:
        cluster.stop()


async def test_a_bucket_found_with_fewer_copies_is_warned_of(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A bucket made with one copy on a cluster of three (by an earlier roost) opens,
    keeping its entries, with a warning that says how to give it three; it is not
    scaled up behind the operator's back (JetStream would place a copy on a server
    that is down)."""
    with NatsCluster(3, base_dir=tmp_path) as cluster:
        nc = await connect([cluster.urls[0]], name="replicas-test")
        try:
            await key_value(nc, "warm")  # JetStream has its meta leader
            js = nc.jetstream()
            kv = await js.create_key_value(KeyValueConfig(bucket="old", replicas=1))
            # The new stream's interest reaches the connected server over a route: a
            # put at once may find no responder yet.
            await until("the new bucket takes a put", lambda: _put(kv))
            # A connection made once the cluster has formed, so that its server names
            # all three (the count the warning gives).
            nc2 = await connect([cluster.urls[0]], name="replicas-test")
            assert len(nc2._server_info.get("connect_urls") or []) == 3
            with caplog.at_level(logging.WARNING, logger="roost.bus.connect"):
                again = await key_value(nc2, "old")
            assert "bucket old has 1 copies" in caplog.text
            assert "--replicas 3" in caplog.text
            assert (await js.stream_info("KV_old")).config.num_replicas == 1
            entry = await again.get("k")
            assert entry.value == b"v"
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="roost.bus.connect"):
                await key_value(nc2, "warm")
            assert "copies" not in caplog.text
            await nc2.close()
        finally:
            await nc.close()


async def test_a_cluster_of_two_servers_gets_two_copies(tmp_path: Path) -> None:
    with NatsCluster(2, base_dir=tmp_path) as cluster:
        assert await _copies(cluster.urls[0], "pair") == 2


async def test_a_lone_server_gets_one_copy(nats_server: NatsServer) -> None:
    assert await _copies(nats_server.url, "lone") == 1
