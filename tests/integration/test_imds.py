"""The metadata service for real: uvicorn on 127.0.0.1 port 0, callers that are real
child processes, identified by which process holds the client socket (/proc), and
botocore itself fetching metadata through AWS_EC2_METADATA_SERVICE_ENDPOINT."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import socket
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from urllib.parse import urlsplit

import httpx
import pytest

from roost.node.imds import InstanceMetadata, MetadataServer
from roost.node.imds_tree import host_architecture
from roost.node.peers import resolver_by_groups, socket_owner_pids

TTL = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN = "X-aws-ec2-metadata-token"


def instance(iid: str, **more: object) -> InstanceMetadata:
    md = InstanceMetadata(
        instance_id=iid, instance_type="r.small", image_id="ami-roost", region="roost-1",
        availability_zone="roost-1b", reservation_id=f"r-{iid}", ami_launch_index=0,
        launch_time="2024-05-01T12:30:00Z", account_id="123456789012",
        local_hostname=f"{iid}.roost.internal", local_ipv4="10.1.0.7")
    return dataclasses.replace(md, **more)  # type: ignore[arg-type]


# A caller: a child process that makes one HTTP request per JSON line on stdin, each
# on a new connection, and answers one JSON line. Stdlib only, so it starts fast.
CALLER = r"""
import http.client, json, sys
host, port = sys.argv[1], int(sys.argv[2])
for line in sys.stdin:
    req = json.loads(line)
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request(req["method"], req["path"], headers=req["headers"])
    r = conn.getresponse()
    body = r.read()
    conn.close()
    print(json.dumps({"status": r.status, "headers": {k.lower(): v for k, v in r.getheaders()},
                      "body": body.decode("latin-1")}), flush=True)
"""


@dataclasses.dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: str


class Caller:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.pid = proc.pid

    async def request(self, method: str, path: str,
                      headers: Mapping[str, str] | None = None) -> Reply:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        line = json.dumps({"method": method, "path": path, "headers": dict(headers or {})})
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()
        out = await asyncio.wait_for(self.proc.stdout.readline(), 20)
        assert out, "the caller process died"
        return Reply(**json.loads(out))

    async def get(self, path: str, token: str | None = None) -> Reply:
        return await self.request("GET", path, {TOKEN: token} if token else {})

    async def token(self, ttl: str = "300") -> str:
        r = await self.request("PUT", "/latest/api/token", {TTL: ttl})
        assert r.status == 200, r
        return r.body


class Node:
    """What the node agent would hold: instances, their pids, and the server."""

    def __init__(self) -> None:
        self.instances = {"i-a": instance("i-a"), "i-b": instance("i-b")}
        self.pids: dict[str, set[int]] = {"i-a": set(), "i-b": set()}
        self.server = MetadataServer(self.instances.get,
                                     resolver_by_groups(lambda: self.pids, "127.0.0.1", 0))
        self.children: list[asyncio.subprocess.Process] = []

    def set(self, iid: str, **changes: object) -> None:
        self.instances[iid] = dataclasses.replace(self.instances[iid], **changes)  # type: ignore[arg-type]

    async def spawn(self, args: list[str], *, group: str | None,
                    env: Mapping[str, str] | None = None) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *args, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, env=dict(env) if env is not None else None)
        self.children.append(proc)
        if group is not None:
            self.pids[group].add(proc.pid)  # before the child can have connected
        return proc

    async def caller(self, group: str | None) -> Caller:
        return Caller(await self.spawn(["-c", CALLER, "127.0.0.1", str(self.server.port)],
                                       group=group))

    async def close(self) -> None:
        for proc in self.children:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        await self.server.stop()


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    n = Node()
    await n.server.start()
    try:
        yield n
    finally:
        await n.close()


async def test_endpoint_is_ec2_shaped(node: Node) -> None:
    url = urlsplit(node.server.endpoint)
    assert (url.scheme, url.hostname, url.port, url.path) == (
        "http", "127.0.0.1", node.server.port, "/")
    assert node.server.port != 0


async def test_each_instance_reads_its_own_metadata(node: Node) -> None:
    a, b = await node.caller("i-a"), await node.caller("i-b")
    ra, rb = await a.get("/latest/meta-data/instance-id"), await b.get(
        "/latest/meta-data/instance-id")
    assert (ra.status, ra.body, rb.status, rb.body) == (200, "i-a", 200, "i-b")
    assert ra.headers["content-type"].startswith("text/plain")
    assert (await b.get("/latest/meta-data/local-hostname")).body == "i-b.roost.internal"
    # headers name nobody: A claiming to be B's address is still A
    claim = await a.request("GET", "/latest/meta-data/instance-id",
                            {"X-Forwarded-For": "127.0.0.1", "X-Real-IP": "127.0.0.1"})
    assert (claim.status, claim.body) == (200, "i-a")


async def test_a_token_is_good_only_on_the_instance_it_was_issued_to(node: Node) -> None:
    a, b = await node.caller("i-a"), await node.caller("i-b")
    token = await a.token()
    mine = await a.get("/latest/meta-data/instance-id", token)
    assert (mine.status, mine.body) == (200, "i-a")
    assert 0 < int(mine.headers["x-aws-ec2-metadata-token-ttl-seconds"]) <= 300
    assert (await b.get("/latest/meta-data/instance-id", token)).status == 401


async def test_a_process_in_no_instance_gets_404(node: Node) -> None:
    stranger = await node.caller(None)
    assert (await stranger.get("/latest/meta-data/instance-id")).status == 404
    assert (await stranger.request("PUT", "/latest/api/token", {TTL: "60"})).status == 404
    # ... and so does the test process itself, whatever it claims
    async with httpx.AsyncClient(base_url=node.server.endpoint) as client:
        r = await client.get("latest/meta-data/instance-id",
                             headers={"X-Forwarded-For": "i-a", "X-Instance-Id": "i-a"})
        assert r.status_code == 404


async def test_tokens_required(node: Node) -> None:
    node.set("i-a", http_tokens="required")
    a = await node.caller("i-a")
    assert (await a.get("/latest/meta-data/instance-id")).status == 401
    token = await a.token("60")
    r = await a.get("/latest/meta-data/instance-id", token)
    assert (r.status, r.body) == (200, "i-a")
    assert r.headers["x-aws-ec2-metadata-token-ttl-seconds"] in ("60", "59")
    assert (await a.get("/latest/meta-data/instance-id", token + "x")).status == 401


async def test_endpoint_disabled_is_403(node: Node) -> None:
    node.set("i-a", http_endpoint="disabled")
    a, b = await node.caller("i-a"), await node.caller("i-b")
    assert (await a.get("/latest/meta-data/instance-id")).status == 403
    assert (await a.request("PUT", "/latest/api/token", {TTL: "60"})).status == 403
    assert (await b.get("/latest/meta-data/instance-id")).status == 200


async def test_tags_on_and_off(node: Node) -> None:
    node.set("i-a", tags={"Name": "web-1", "team": "infra"})
    a = await node.caller("i-a")
    assert (await a.get("/latest/meta-data/tags/instance/Name")).status == 404
    node.set("i-a", instance_metadata_tags="enabled")
    assert (await a.get("/latest/meta-data/tags/instance/")).body == "Name\nteam"
    assert (await a.get("/latest/meta-data/tags/instance/Name")).body == "web-1"
    node.set("i-a", instance_metadata_tags="disabled")
    assert (await a.get("/latest/meta-data/tags/instance/")).status == 404


async def test_user_data(node: Node) -> None:
    node.set("i-a", user_data=b"#cloud-config\nhostname: a\n")
    a, b = await node.caller("i-a"), await node.caller("i-b")
    r = await a.get("/latest/user-data")
    assert (r.status, r.body) == (200, "#cloud-config\nhostname: a\n")
    assert r.headers["content-type"] == "application/octet-stream"
    assert (await b.get("/latest/user-data")).status == 404


async def test_identity_document(node: Node) -> None:
    b = await node.caller("i-b")
    r = await b.get("/latest/dynamic/instance-identity/document")
    doc = json.loads(r.body)
    assert (doc["instanceId"], doc["region"], doc["availabilityZone"]) == (
        "i-b", "roost-1", "roost-1b")
    assert (doc["accountId"], doc["privateIp"], doc["version"]) == (
        "123456789012", "10.1.0.7", "2017-09-30")
    assert doc["pendingTime"] == "2024-05-01T12:30:00Z"
    assert doc["architecture"] == host_architecture()


@pytest.mark.parametrize("ttl", ["0", "21601", "abc", ""])
async def test_bad_ttl_is_400(node: Node, ttl: str) -> None:
    a = await node.caller("i-a")
    assert (await a.request("PUT", "/latest/api/token", {TTL: ttl})).status == 400


async def test_token_put_with_x_forwarded_for_is_refused(node: Node) -> None:
    a = await node.caller("i-a")
    r = await a.request("PUT", "/latest/api/token", {TTL: "60", "X-Forwarded-For": "10.9.9.9"})
    assert r.status == 403


# botocore in a child, configured only by the environment the node would set.
BOTOCORE = r"""
import json
import botocore.session
from botocore.utils import IMDSFetcher, IMDSRegionProvider

session = botocore.session.get_session()
config = {name: session.get_config_variable(name) for name in
          ("ec2_metadata_service_endpoint", "ec2_metadata_v1_disabled")}
fetcher = IMDSFetcher(timeout=5, config=config)
token = fetcher._fetch_metadata_token()
get = lambda path: fetcher._get_request(path, None, token).text
print(json.dumps({
    "base_url": fetcher.get_base_url(),
    "token": bool(token),
    "instance_id": get("latest/meta-data/instance-id"),
    "zone": get("latest/meta-data/placement/availability-zone"),
    "region": IMDSRegionProvider(session).provide(),
}))
"""


def botocore_env(endpoint: str) -> Iterator[tuple[str, str]]:
    for key, value in os.environ.items():
        if key.startswith("AWS_") or key.lower().endswith("_proxy"):
            continue  # nothing but what the node sets may steer botocore
        yield key, value
    yield "AWS_EC2_METADATA_SERVICE_ENDPOINT", endpoint
    yield "AWS_EC2_METADATA_V1_DISABLED", "true"  # no silent fallback to IMDSv1
    yield "AWS_CONFIG_FILE", os.devnull
    yield "AWS_SHARED_CREDENTIALS_FILE", os.devnull


async def test_botocore_reads_instance_id_and_region_with_tokens_required(
        node: Node) -> None:
    node.set("i-b", http_tokens="required")
    proc = await node.spawn(["-c", BOTOCORE], group="i-b",
                            env=dict(botocore_env(node.server.endpoint)))
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    out = await asyncio.wait_for(proc.stdout.read(), 60)
    assert await proc.wait() == 0, out
    got = json.loads(out)
    assert got == {"base_url": node.server.endpoint, "token": True, "instance_id": "i-b",
                   "zone": "roost-1b", "region": "roost-1"}


async def test_socket_owner_pids_on_real_sockets_v4_and_mapped_v6() -> None:
    """The test process owns the client end; pid 1 and a dead pid do not."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    with listener, socket.create_connection(("127.0.0.1", port)) as client:
        accepted, _ = listener.accept()
        with accepted:
            host, cport = client.getsockname()[:2]
            candidates = [os.getpid(), 1, 2**22 + 7]
            assert socket_owner_pids(host, cport, "127.0.0.1", port,
                                     candidates) == {os.getpid()}
            assert socket_owner_pids(f"::ffff:{host}", cport, "127.0.0.1", port,
                                     candidates) == {os.getpid()}
            assert socket_owner_pids(host, cport, "127.0.0.1", port + 1, candidates) == set()
    if not socket.has_dualstack_ipv6():
        pytest.skip("no dual-stack IPv6 here")
    dual = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    port = dual.getsockname()[1]
    with dual, socket.socket(socket.AF_INET6) as client6:
        client6.connect(("::ffff:127.0.0.1", port))
        accepted, peer = dual.accept()
        with accepted:
            assert peer[0] == "::ffff:127.0.0.1"
            assert socket_owner_pids(peer[0], peer[1], "::ffff:127.0.0.1", port,
                                     [os.getpid()]) == {os.getpid()}
