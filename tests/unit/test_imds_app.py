"""The IMDS app over an in-memory transport: paths, bodies, content types, token rules.

The caller is fixed by a fake resolver here; identification by real sockets is in
tests/integration/test_imds.py.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from roost.node.imds import InstanceMetadata, build_app
from roost.node.imds_tree import ec2_time, host_architecture

SECRET = b"k" * 32
BASE = InstanceMetadata(
    instance_id="i-0a", instance_type="r.small", image_id="ami-roost", region="roost-1",
    availability_zone="roost-1a", reservation_id="r-0a", ami_launch_index=2,
    launch_time="2024-05-01T12:30:00+00:00", account_id="000000000000",
    local_hostname="ip-10-0-0-5.roost.internal",
)


class World:
    """One instance, a settable clock, and a client to the app."""

    def __init__(self) -> None:
        self.md: InstanceMetadata | None = BASE
        self.now = 1_700_000_000.0
        self.caller: str | None = "i-0a"
        app = build_app(lambda iid: self.md if self.md and iid == self.md.instance_id
                        else None,
                        lambda host, port: self.caller, secret=SECRET,
                        clock=lambda: self.now)
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                        base_url="http://imds")

    def set(self, **changes: object) -> None:
        assert self.md is not None
        self.md = dataclasses.replace(self.md, **changes)  # type: ignore[arg-type]

    async def token(self, ttl: str = "60") -> str:
        r = await self.client.put("/latest/api/token",
                                  headers={"X-aws-ec2-metadata-token-ttl-seconds": ttl})
        assert r.status_code == 200, r.text
        assert r.headers["x-aws-ec2-metadata-token-ttl-seconds"] == ttl
        return r.text

    async def get(self, path: str, token: str | None = None) -> httpx.Response:
        headers = {"X-aws-ec2-metadata-token": token} if token is not None else {}
        return await self.client.get(path, headers=headers)


@pytest.fixture
async def world() -> AsyncIterator[World]:
    w = World()
    async with w.client:
        yield w


async def text(w: World, path: str) -> str:
    r = await w.get(path)
    assert r.status_code == 200, (path, r.status_code)
    assert r.headers["content-type"].startswith("text/plain")
    return r.text


async def test_listings_follow_ec2(world: World) -> None:
    assert await text(world, "/") == "latest"
    assert await text(world, "/latest/") == "dynamic\nmeta-data"
    assert await text(world, "/latest") == "dynamic\nmeta-data"
    top = (await text(world, "/latest/meta-data/")).split("\n")
    assert top == ["ami-id", "ami-launch-index", "hostname", "instance-id", "instance-type",
                   "local-hostname", "placement/", "reservation-id"]
    assert await text(world, "/latest/meta-data/placement/") == "availability-zone\nregion"
    assert await text(world, "/latest/meta-data/placement") == "availability-zone\nregion"
    assert await text(world, "/latest/dynamic/") == "instance-identity/"
    assert await text(world, "/latest/dynamic/instance-identity/") == "document"


async def test_values(world: World) -> None:
    md = "/latest/meta-data/"
    assert await text(world, md + "instance-id") == "i-0a"
    assert await text(world, md + "instance-type") == "r.small"
    assert await text(world, md + "ami-id") == "ami-roost"
    assert await text(world, md + "ami-launch-index") == "2"
    assert await text(world, md + "reservation-id") == "r-0a"
    assert await text(world, md + "hostname") == "ip-10-0-0-5.roost.internal"
    assert await text(world, md + "local-hostname") == "ip-10-0-0-5.roost.internal"
    assert await text(world, md + "placement/availability-zone") == "roost-1a"
    # botocore asks for the zone with a trailing slash
    assert await text(world, md + "placement/availability-zone/") == "roost-1a"
    assert await text(world, md + "placement/region") == "roost-1"


async def test_optional_items_appear_only_when_known(world: World) -> None:
    md = "/latest/meta-data/"
    for path in ("local-ipv4", "public-ipv4", "public-hostname", "security-groups",
                 "public-keys/", "tags/"):
        assert (await world.get(md + path)).status_code == 404
    world.set(local_ipv4="10.0.0.5", security_groups=["default", "web"],
              public_ipv4="198.18.0.9", public_hostname="ec2-198-18-0-9.roost.public",
              public_keys={"alice": "ssh-ed25519 AAAA alice", "bob": "ssh-rsa BBBB bob"})
    top = (await text(world, md)).split("\n")
    assert {"local-ipv4", "public-ipv4", "public-hostname", "security-groups",
            "public-keys/"} <= set(top)
    assert await text(world, md + "local-ipv4") == "10.0.0.5"
    assert await text(world, md + "public-ipv4") == "198.18.0.9"
    assert await text(world, md + "public-hostname") == "ec2-198-18-0-9.roost.public"
    assert await text(world, md + "security-groups") == "default\nweb"
    assert await text(world, md + "public-keys/") == "0=alice\n1=bob"
    assert await text(world, md + "public-keys/1/") == "openssh-key"
    assert await text(world, md + "public-keys/1/openssh-key") == "ssh-rsa BBBB bob"
    assert (await world.get(md + "public-keys/2/openssh-key")).status_code == 404


async def test_tags_only_when_allowed(world: World) -> None:
    world.set(tags={"Name": "web-1", "team": "infra", "a/b": "hidden"})
    assert (await world.get("/latest/meta-data/tags/instance/")).status_code == 404
    assert (await world.get("/latest/meta-data/tags/instance/Name")).status_code == 404
    assert "tags/" not in (await text(world, "/latest/meta-data/")).split("\n")
    world.set(instance_metadata_tags="enabled")
    assert "tags/" in (await text(world, "/latest/meta-data/")).split("\n")
    assert await text(world, "/latest/meta-data/tags/") == "instance/"
    assert await text(world, "/latest/meta-data/tags/instance/") == "Name\nteam"
    assert await text(world, "/latest/meta-data/tags/instance/Name") == "web-1"


async def test_user_data_is_octet_stream_and_404_when_none(world: World) -> None:
    assert (await world.get("/latest/user-data")).status_code == 404
    world.set(user_data=b"#!/bin/sh\necho \xff\n")
    r = await world.get("/latest/user-data")
    assert r.status_code == 200 and r.content == b"#!/bin/sh\necho \xff\n"
    assert r.headers["content-type"] == "application/octet-stream"
    assert await text(world, "/latest/") == "dynamic\nmeta-data\nuser-data"


async def test_identity_document(world: World) -> None:
    doc = json.loads(await text(world, "/latest/dynamic/instance-identity/document"))
    assert doc == {
        "accountId": "000000000000", "architecture": host_architecture(),
        "availabilityZone": "roost-1a", "billingProducts": None,
        "devpayProductCodes": None, "marketplaceProductCodes": None,
        "imageId": "ami-roost", "instanceId": "i-0a", "instanceType": "r.small",
        "kernelId": None, "pendingTime": "2024-05-01T12:30:00Z", "privateIp": None,
        "ramdiskId": None, "region": "roost-1", "version": "2017-09-30",
    }
    world.set(local_ipv4="10.0.0.5", architecture="arm64")
    doc = json.loads(await text(world, "/latest/dynamic/instance-identity/document"))
    assert doc["privateIp"] == "10.0.0.5" and doc["architecture"] == "arm64"


@pytest.mark.parametrize(("machine", "arch"), [("x86_64", "x86_64"), ("AMD64", "x86_64"),
                                               ("aarch64", "arm64"), ("i686", "i386"),
                                               ("riscv64", "riscv64")])
def test_architecture_names(machine: str, arch: str) -> None:
    assert host_architecture(machine) == arch


@pytest.mark.parametrize(("iso", "ec2"), [
    ("2024-05-01T12:30:00+00:00", "2024-05-01T12:30:00Z"),
    ("2024-05-01T12:30:00.123Z", "2024-05-01T12:30:00Z"),
    ("2024-05-01T14:30:00+02:00", "2024-05-01T12:30:00Z"),
    ("2024-05-01T12:30:00", "2024-05-01T12:30:00Z"),
    ("yesterday", "yesterday"),
])
def test_pending_time_in_ec2_form(iso: str, ec2: str) -> None:
    assert ec2_time(iso) == ec2


async def test_unknown_paths_are_404(world: World) -> None:
    for path in ("/nope", "/latest/meta-data/nope", "/latest/meta-data/instance-id/x",
                 "/latest//meta-data/", "/latest/meta-data//instance-id",
                 "/2009-04-04/meta-data/instance-id", "/latest/dynamic/instance-identity/pkcs7"):
        assert (await world.get(path)).status_code == 404, path


async def test_unknown_caller_is_404_whatever_it_asks(world: World) -> None:
    world.caller = None
    assert (await world.get("/latest/meta-data/instance-id")).status_code == 404
    r = await world.client.put("/latest/api/token",
                               headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
    assert r.status_code == 404
    world.caller = "i-gone"  # resolved, but the node no longer has it
    assert (await world.get("/latest/meta-data/instance-id")).status_code == 404


async def test_disabled_endpoint_is_403(world: World) -> None:
    token = await world.token()
    world.set(http_endpoint="disabled")
    assert (await world.get("/latest/meta-data/instance-id")).status_code == 403
    assert (await world.get("/latest/meta-data/instance-id", token)).status_code == 403
    r = await world.client.put("/latest/api/token",
                               headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
    assert r.status_code == 403


async def test_token_flow_with_tokens_required(world: World) -> None:
    world.set(http_tokens="required")
    assert (await world.get("/latest/meta-data/instance-id")).status_code == 401
    token = await world.token("120")
    r = await world.get("/latest/meta-data/instance-id", token)
    assert r.status_code == 200 and r.text == "i-0a"
    assert r.headers["x-aws-ec2-metadata-token-ttl-seconds"] == "120"
    world.now += 100.5
    r = await world.get("/latest/meta-data/instance-id", token)
    assert r.headers["x-aws-ec2-metadata-token-ttl-seconds"] == "20"
    world.now += 20
    assert (await world.get("/latest/meta-data/instance-id", token)).status_code == 401


async def test_a_bad_token_is_401_even_when_tokens_are_optional(world: World) -> None:
    r = await world.get("/latest/meta-data/instance-id")
    assert r.status_code == 200 and TTL not in r.headers
    assert (await world.get("/latest/meta-data/instance-id", "bogus")).status_code == 401
    token = await world.token()
    world.caller = "i-0b"
    world.set(instance_id="i-0b")  # the same token, now presented by another instance
    assert (await world.get("/latest/meta-data/instance-id", token)).status_code == 401


TTL = "x-aws-ec2-metadata-token-ttl-seconds"


@pytest.mark.parametrize("ttl", [None, "", "0", "21601", "abc", "-1"])
async def test_bad_ttl_is_400(world: World, ttl: str | None) -> None:
    headers = {TTL: ttl} if ttl is not None else {}
    assert (await world.client.put("/latest/api/token", headers=headers)).status_code == 400


async def test_put_through_a_proxy_is_403(world: World) -> None:
    r = await world.client.put("/latest/api/token",
                               headers={TTL: "60", "X-Forwarded-For": "203.0.113.9"})
    assert r.status_code == 403


async def test_other_methods_are_405(world: World) -> None:
    assert (await world.client.post("/latest/meta-data/")).status_code == 405
    assert (await world.client.delete("/latest/meta-data/instance-id")).status_code == 405
    assert (await world.client.put("/latest/meta-data/instance-id",
                                   headers={TTL: "60"})).status_code == 405
    r = await world.client.get("/latest/api/token")
    assert r.status_code == 405 and r.headers["allow"] == "PUT"


async def test_head_is_allowed(world: World) -> None:
    r = await world.client.head("/latest/meta-data/instance-id")
    assert r.status_code == 200 and r.headers["content-length"] == "4"


async def test_errors_are_ec2_style_pages(world: World) -> None:
    r = await world.get("/latest/meta-data/nope")
    assert r.headers["content-type"].startswith("text/html")
    assert "<title>404 - Not Found</title>" in r.text


class Recording:
    """A ConnectionResolver that notes which connection ends it was asked about."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def __call__(self, peer_host: str, peer_port: int) -> str | None:
        self.calls.append(("plain", peer_host, peer_port))
        return "i-0a"

    def resolve_connection(self, peer_host: str, peer_port: int, server_host: str,
                           server_port: int) -> str | None:
        self.calls.append((peer_host, peer_port, server_host, server_port))
        return "i-0a"


# httpx reports no port for http://imds (None); the app passes 0, "any server port".
@pytest.mark.parametrize(("server_port", "seen"), [(None, 0), (8123, 8123)])
async def test_a_connection_resolver_is_told_the_server_end(server_port: int | None,
                                                            seen: int) -> None:
    resolver = Recording()
    app = build_app(lambda iid: BASE, resolver, secret=SECRET, server_port=server_port)
    transport = httpx.ASGITransport(app=app, client=("10.0.0.9", 4242))
    async with httpx.AsyncClient(transport=transport, base_url="http://imds") as client:
        r = await client.get("/latest/meta-data/instance-id")
    assert r.text == "i-0a"
    assert resolver.calls == [("10.0.0.9", 4242, "imds", seen)]


async def test_a_plain_resolver_gets_the_peer_only() -> None:
    calls: list[tuple[str, int]] = []

    def resolve(host: str, port: int) -> str:
        calls.append((host, port))
        return "i-0a"

    app = build_app(lambda iid: BASE, resolve, secret=SECRET)
    transport = httpx.ASGITransport(app=app, client=("10.0.0.9", 4242))
    async with httpx.AsyncClient(transport=transport, base_url="http://imds") as client:
        assert (await client.get("/latest/meta-data/instance-id")).text == "i-0a"
    assert calls == [("10.0.0.9", 4242)]
