"""The fake and static orchestrators against the shared adapter contract
(tests/orchestrator_contract.py); later adapters subclass the same suite."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from roost.controller.adapters import FakeOrchestrator, StaticOrchestrator
from roost.controller.clock import FakeClock
from roost.controller.orchestrator import NodeFigures, OrchestratorUnavailable, PoolRef
from tests.orchestrator_contract import ContractHarness, OrchestratorContract


class TestFakeOrchestratorContract(OrchestratorContract):
    @pytest.fixture
    async def harness(self) -> AsyncIterator[ContractHarness]:
        fake = FakeOrchestrator(now=FakeClock().time)
        fake.add_pool("workers", replicas=3, nodes=[NodeFigures("n1", 8000, 32768, 500, 1024)])

        @contextlib.asynccontextmanager
        async def unavailable() -> AsyncIterator[None]:
            fake.fail("*", OrchestratorUnavailable("partitioned"), times=1000)
            try:
                yield
            finally:
                fake.heal()

        yield ContractHarness(fake, PoolRef("p", "workers"), actuates=True,
                              unavailable=unavailable)
        await fake.close()


STATIC = """
[pools.workers]
replicas = 3
instances = ["host-a", "host-b", "host-c"]

[[pools.workers.nodes]]
id = "host-a"
vcpu = 8
memory_gib = 32
used_cpu_milli = 500
used_memory_mib = 1024
"""


class TestStaticOrchestratorContract(OrchestratorContract):
    @pytest.fixture
    async def harness(self, tmp_path: Path) -> AsyncIterator[ContractHarness]:
        path = tmp_path / "static.toml"
        path.write_text(STATIC)
        orch = StaticOrchestrator(path, now=FakeClock().time)

        @contextlib.asynccontextmanager
        async def unavailable() -> AsyncIterator[None]:
            hidden = path.with_suffix(".away")
            path.rename(hidden)
            try:
                yield
            finally:
                hidden.rename(path)

        yield ContractHarness(orch, PoolRef("p", "workers"), actuates=False,
                              unavailable=unavailable)
        await orch.close()
