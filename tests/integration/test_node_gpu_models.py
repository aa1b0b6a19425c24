"""A type that accepts a set of GPU models lands only on devices of those models, on a
real node agent over a real nats-server."""

from __future__ import annotations

from pathlib import Path

from roost.bus import schemas as s
from roost.bus import subjects
from roost.domain.catalog import BUILTIN, parse_types_toml
from roost.domain.host import HostCapacity, parse_gpus
from roost.domain.resources import Resources
from roost.embedded import NatsServer
from roost.gateway.types import from_info
from roost.node.agent import NodeAgent, NodeConfig
from tests.nodes import client, launch

TYPES = parse_types_toml("""
    [types."v.one"]
    vcpu = 1
    memory_gib = 1
    gpus = 1
    gpu_models = ["V100M32", "V100M16"]
    [types."v.half"]
    vcpu = 1
    memory_gib = 1
    gpu_fraction = 0.5
    gpu_models = ["V100M16", "V100M32"]
    [types."t.one"]
    vcpu = 1
    memory_gib = 1
    gpus = 1
    gpu_model = "T4"
""")
V100 = {2, 3, 4, 5}  # devices 0-1 are T4s, 2-3 V100M16s, 4-5 V100M32s


async def test_a_model_set_lands_only_on_its_models(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    host = HostCapacity(Resources(32_000, 65_536), gpus=parse_gpus("2xT4,2xV100M16,2xV100M32"),
                        reserve=Resources(0, 0))
    agent = NodeAgent(NodeConfig(
        node_id="n1", nats_urls=[nats_server.url], data_dir=tmp_path / "n1", host=host,
        catalog=BUILTIN.with_types(TYPES), driver="sim", heartbeat_seconds=1.0,
        stop_grace_seconds=2.0,
    ))
    await agent.start()
    try:
        async with client(nats_server.url) as nc:
            msg = await nc.request(subjects.DESCRIBE_INSTANCE_TYPES, b"{}", timeout=5)
            info = {t.name: t for t in s.decode(msg.data, s.DescribeTypesReply).types}
            assert info["v.one"].gpu_models == ["V100M16", "V100M32"]
            assert info["v.one"].gpu_model == "V100M16"
            learnt = from_info(info["v.one"])
            assert learnt is not None and learnt.gpu_models == ("V100M16", "V100M32")

            # A hint naming a T4 is ignored: the node picks a device of the set.
            first = await launch(nc, "v.half", gpu_devices=[0])
            assert first is not None and first.ok and first.instance is not None
            assert {d for d, _ in first.instance.gpus} <= V100
            for _ in range(3):
                reply = await launch(nc, "v.one")
                assert reply is not None and reply.ok and reply.instance is not None
                assert {d for d, _ in reply.instance.gpus} <= V100
            # Three whole V100s and half of the fourth are taken: one more half fits,
            # a whole one does not, though both T4s are free.
            assert await launch(nc, "v.one") is None
            half = await launch(nc, "v.half")
            assert half is not None and half.ok
            t4 = await launch(nc, "t.one")
            assert t4 is not None and t4.ok and t4.instance is not None
            assert {d for d, _ in t4.instance.gpus} <= {0, 1}
        used = {d for a in agent.ledger.allocations.values() for d, _ in a.gpus}
        assert used - V100 <= {0, 1}
        assert agent.ledger.free.gpu_free[2:] == (0, 0, 0, 0)
    finally:
        await agent.stop()
