"""Fan-out responders: DescribeInstanceTypes from every node, launch lookup by id."""

from __future__ import annotations

from pathlib import Path

from roost.bus import schemas as s
from roost.bus import subjects
from roost.domain.catalog import BUILTIN
from roost.embedded import NatsServer
from tests.nodes import client, launch, running_nodes


async def gather_replies(nc, subject: str, data: bytes, expect: int = 0,  # type: ignore[no-untyped-def]
                         window: float = 0.5, patience: float = 10.0) -> list[bytes]:
    """Replies to one request: up to ``patience`` seconds for the ``expect`` awaited
    (a loaded host may take a while to answer), then until none comes for ``window``
    (one more than awaited must show)."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(subject, data, reply=inbox)
    out = []
    try:
        while True:
            wait = patience if len(out) < expect else window
            out.append((await sub.next_msg(timeout=wait)).data)
    except TimeoutError:
        return out
    finally:
        await sub.unsubscribe()


async def test_describe_types_fans_out_to_every_node(nats_server: NatsServer,
                                                     tmp_path: Path) -> None:
    async with running_nodes([nats_server.url], ["4vcpu,16GiB", "8vcpu,32GiB"], tmp_path), \
            client(nats_server.url) as nc:
        replies = [s.decode(d, s.DescribeTypesReply)
                   for d in await gather_replies(nc, subjects.DESCRIBE_INSTANCE_TYPES, b"",
                                              expect=2)]
        assert sorted(r.node_id for r in replies) == ["n1", "n2"]
        for r in replies:
            assert {t.name for t in r.types} == set(BUILTIN)  # the full set, full or not
        free = {r.node_id: {t.name: t.free for t in r.types} for r in replies}
        assert free["n1"]["m7i.large"] == 2 and free["n2"]["m7i.large"] == 4
        assert free["n1"]["m7i.2xlarge"] == 0


async def test_lookup_finds_the_node_holding_a_launch(nats_server: NatsServer,
                                                      tmp_path: Path) -> None:
    async with running_nodes([nats_server.url], ["4vcpu,16GiB"] * 3, tmp_path), \
            client(nats_server.url) as nc:
        made = await launch(nc, "t3.micro", node_id="n2", launch_id="L-42")
        assert made and made.ok
        found = await gather_replies(nc, subjects.LAUNCH_LOOKUP,
                                     s.encode(s.LaunchLookup(launch_id="L-42")), expect=1)
        assert [s.decode(d, s.LaunchReply).node_id for d in found] == ["n2"]
        none = await gather_replies(nc, subjects.LAUNCH_LOOKUP,
                                    s.encode(s.LaunchLookup(launch_id="L-43")))
        assert none == []
        # A node's own lookup subject: that node alone, and it answers either way.
        for node, lid, held in (("n2", "L-42", 1), ("n1", "L-42", 0), ("n2", "L-43", 0)):
            msg = await nc.request(subjects.node_lookup(node),
                                   s.encode(s.LaunchLookup(launch_ids=[lid])), timeout=5)
            reply = s.decode(msg.data, s.LaunchesFound)
            assert reply.node_id == node and len(reply.instances) == held


async def test_bad_messages_get_explicit_errors(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_nodes([nats_server.url], ["4vcpu,16GiB"], tmp_path), \
            client(nats_server.url) as nc:
        bad = await nc.request(subjects.node_launch("n1"), b"{not json", timeout=5)
        assert s.decode(bad.data, s.LaunchReply).error == "bad_request"
        future = await nc.request(subjects.node_launch("n1"), b'{"v": 2, "launch_id": "x"}',
                                  timeout=5)
        assert s.decode(future.data, s.LaunchReply).error == "bad_request"
        unknown = await launch(nc, "zz.huge", node_id="n1")
        assert unknown and unknown.error == "unknown_type"
        ami = await launch(nc, "t3.micro", node_id="n1", image_id="ami-12345678")
        assert ami and ami.error == "bad_request"
