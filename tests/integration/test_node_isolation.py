"""What a node does when it cannot isolate: one instance whose cgroup cannot be made is
refused with the reason and nothing else is touched; a host without cgroups runs at
isolation none and says so in every snapshot."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from roost.domain.catalog import BUILTIN
from roost.embedded import NatsServer
from roost.node import isolation as iso_mod
from roost.node.agent import NodeAgent, NodeConfig
from roost.node.cgroups import CgroupError, Cgroups, CgroupUnavailable, InstanceCgroup, Limits
from roost.node.isolation import Isolation, make_isolation
from roost.node.process import ProcessDriver
from tests.nodes import client, command, host, launch, wait_state


class RefusesOne:
    """The host's real cgroups, except that the next group made after ``refuse_next`` is
    set fails, as on a cgroupfs that is full or was made read-only."""

    def __init__(self, real: Cgroups) -> None:
        self.real = real
        self.refuse_next = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)

    def create(self, instance_id: str, limits: Limits) -> InstanceCgroup:
        if self.refuse_next:
            self.refuse_next = False
            raise CgroupError(28, f"cannot create {instance_id}: No space left on device")
        return self.real.create(instance_id, limits)


async def test_a_cgroup_that_cannot_be_made_refuses_that_launch_only(
        nats_server: NatsServer, tmp_path: Path) -> None:
    try:
        real = iso_mod.detect("iso1")
    except CgroupError as exc:
        pytest.fail(f"this test needs writable cgroups (root on Linux): {exc}")
    groups = RefusesOne(real)
    driver = ProcessDriver(Isolation("cgroup", "", groups))  # type: ignore[arg-type]
    cfg = NodeConfig(node_id="iso1", nats_urls=[nats_server.url], data_dir=tmp_path / "iso1",
                     host=host("4vcpu,8GiB"), driver="process", stop_grace_seconds=2.0)
    agent = NodeAgent(cfg, driver=driver)
    await agent.start()
    try:
        async with client(nats_server.url) as nc:
            first = await launch(nc, "t3.micro", node_id="iso1")
            assert first and first.ok and first.instance
            kept = first.instance.instance_id
            await wait_state(nc, "iso1", kept, "running")
            room = agent.ledger.free

            groups.refuse_next = True
            refused = await launch(nc, "t3.micro", node_id="iso1")
            assert refused and not refused.ok and refused.error == "internal"
            assert "cannot make a cgroup" in refused.message
            assert "No space left on device" in refused.message
            assert agent.ledger.free == room and set(agent.ledger.allocations) == {kept}
            assert (await command(nc, "iso1", "describe", kept)).instance.state == "running"

            again = await launch(nc, "t3.micro", node_id="iso1")  # the next one works
            assert again and again.ok and again.instance
            for iid in (kept, again.instance.instance_id):
                await command(nc, "iso1", "terminate", iid)
                await wait_state(nc, "iso1", iid, "terminated")
    finally:
        await agent.stop()
        real.remove_root()


async def test_a_host_without_cgroups_runs_at_none_and_says_so(
        nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_cgroups(node_id: str) -> Cgroups:
        raise CgroupUnavailable(2, "no cgroup mounts in /proc/self/mountinfo")

    monkeypatch.setattr(iso_mod, "detect", no_cgroups)
    chosen = make_isolation("sandbox", node_id="iso2", data_dir=tmp_path)
    assert chosen.level == "none" and "cgroups unavailable" in chosen.note
    cfg = NodeConfig(node_id="iso2", nats_urls=[nats_server.url], data_dir=tmp_path / "iso2",
                     host=host("4vcpu,8GiB"), driver="process", catalog=BUILTIN)
    agent = NodeAgent(cfg)
    await agent.start()
    try:
        snap = agent.snapshot()
        assert snap.isolation == "none" and "no cgroup mounts" in snap.isolation_note
    finally:
        await agent.stop()


async def test_usage_metrics_per_instance(nats_server: NatsServer, tmp_path: Path) -> None:
    cfg = NodeConfig(node_id="iso3", nats_urls=[nats_server.url], data_dir=tmp_path / "iso3",
                     host=host("4vcpu,8GiB"), driver="process", metrics_port=0,
                     stop_grace_seconds=1.0)
    agent = NodeAgent(cfg)
    await agent.start()
    try:
        if agent.driver.isolation == "none":
            pytest.fail(f"this test needs cgroups: {agent.driver.isolation_note}")
        async with client(nats_server.url) as nc:
            spin = "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; exec sleep 600"
            reply = await launch(nc, "t3.micro", node_id="iso3", user_data=spin)
            assert reply and reply.instance
            iid = reply.instance.instance_id
            await wait_state(nc, "iso3", iid, "running")
            await asyncio.sleep(0.5)
            assert agent.metrics_server is not None
            url = f"http://127.0.0.1:{agent.metrics_server.server_port}/metrics"
            async with httpx.AsyncClient() as http:
                text = (await http.get(url, timeout=5)).text
            labels = f'instance_id="{iid}",instance_type="t3.micro",node="iso3"'
            cpu = next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith(f"roost_instance_cpu_seconds_total{{{labels}}}"))
            assert cpu > 0
            assert f"roost_instance_memory_peak_bytes{{{labels}}}" in text
            assert f"roost_instance_oom_kills_total{{{labels}}} 0.0" in text
            assert 'roost_node_isolation_info{level="cgroup",node="iso3"} 1.0' in text
            await command(nc, "iso3", "terminate", iid)
            await wait_state(nc, "iso3", iid, "terminated")
    finally:
        await agent.stop()
