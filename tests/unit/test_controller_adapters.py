"""Adapter behaviour beyond the shared contract: the static adapter's files and the fake's
Kubernetes-like removal order; and the controller's config layering."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from roost.controller.adapters import FakeOrchestrator, StaticOrchestrator
from roost.controller.adapters.static import parse_config
from roost.controller.clock import FakeClock
from roost.controller.config import build, load_file
from roost.controller.orchestrator import OrchestratorError, PoolRef

CONFIG = """
targets_file = "targets.json"
[pools.web]
replicas = 2
not_ready = ["web-2"]
[[pools.web.nodes]]
id = "h1"
cpu_milli = 4000
memory_mib = 8192
memory_pressure = true
"""


def _bump(path: Path, text: str) -> None:
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


async def test_static_reports_the_file_and_records_targets(tmp_path: Path) -> None:
    path = tmp_path / "static.toml"
    path.write_text(CONFIG)
    orch = StaticOrchestrator(path, now=FakeClock(50.0).time)
    pool = PoolRef("web", "web")
    state = await orch.pool_state(pool)
    assert [(i.ref, i.ready) for i in state.instances] == [("web-1", True), ("web-2", False)]
    assert state.nodes[0].memory_pressure and state.observed_at == 50.0
    await orch.scale_pool(pool, 1, request_id="r1")
    await orch.set_instance_termination_priority(pool, "web-2", priority=-1000)
    recorded = json.loads((tmp_path / "targets.json").read_text())
    assert recorded["web"]["target"] == 1 and recorded["web"]["priorities"] == {"web-2": -1000}
    # A restarted controller reads its targets back.
    again = await StaticOrchestrator(path, now=FakeClock().time).pool_state(pool)
    assert again.target_replicas == 1 and not again.settled  # until the operator acts
    # The operator edits the file; the adapter picks it up.
    _bump(path, CONFIG.replace("replicas = 2", "replicas = 1").replace(
        'not_ready = ["web-2"]', ""))
    state = await orch.pool_state(pool)
    assert [i.ref for i in state.instances] == ["web-1"] and state.settled


async def test_static_with_a_broken_file_is_an_error_not_zero_replicas(tmp_path: Path) -> None:
    path = tmp_path / "static.toml"
    path.write_text(CONFIG)
    orch = StaticOrchestrator(path, now=FakeClock().time)
    _bump(path, "[pools.web]\nreplicas = 'many'\n")
    with pytest.raises(OrchestratorError, match="static orchestrator config"):
        await orch.pool_state(PoolRef("web", "web"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[pools.a]\nreplicas = -1\n", "replicas must be >= 0"),
        ("[pools.a]\nreplicas = 1\n[[pools.a.nodes]]\nid = 'n'\n", "needs vcpu"),
        ("[pools.a]\nreplicas = 1\nextra = 2\n", "extra"),
        ("not toml at all [", "static orchestrator config"),
    ],
)
def test_static_config_errors_name_the_fault(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_config(text)


async def test_fake_removes_not_ready_then_lowest_priority_then_newest() -> None:
    fake = FakeOrchestrator(now=FakeClock().time)
    a, b, c, d = fake.add_pool("p", replicas=4)
    pool = PoolRef("p", "p")
    fake.set_ready("p", c, False)
    await fake.set_instance_termination_priority(pool, a, priority=-1000)
    await fake.scale_pool(pool, 3, request_id="x")
    assert fake.instances("p") == [a, b, d]  # the not-ready one, despite a's priority
    await fake.scale_pool(pool, 2, request_id="y")
    assert fake.instances("p") == [b, d]
    await fake.scale_pool(pool, 1, request_id="z")
    assert fake.instances("p") == [b]  # the newest among equals


def test_config_layers_and_validation(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("interval = 4\nmemory-hard-percent = 95\n")  # top level, dashes ok
    cfg = build(load_file(path), {"interval": None, "shadow": True})
    assert (cfg.interval, cfg.memory_hard_percent, cfg.shadow) == (4, 95, True)
    assert cfg.input_age_limit == 30 and cfg.plan_settings().max_input_age == 30
    assert build({"interval": 20}).input_age_limit == 60
    with pytest.raises(ValueError, match="interval must be > 0"):
        build({"interval": 0})
    with pytest.raises(ValueError, match="controller config"):
        build({"interval": "soon"})
