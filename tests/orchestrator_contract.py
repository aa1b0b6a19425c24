"""The Orchestrator contract: what every adapter (fake, static, native roost nodes,
Kubernetes) must do for the controller to drive it safely.

To run it against a new adapter, subclass `OrchestratorContract` in a test module (name
the subclass ``Test...``) and give it a ``harness`` fixture::

    from tests.orchestrator_contract import ContractHarness, OrchestratorContract

    class TestKubernetesContract(OrchestratorContract):
        @pytest.fixture
        async def harness(self, kind_cluster) -> AsyncIterator[ContractHarness]:
            orch = KubernetesOrchestrator(...)
            yield ContractHarness(orch, PoolRef("p", "default/workers"),
                                  actuates=True, settle=wait_for_rollout,
                                  unavailable=partition_api_server)
            await orch.close()

The harness's pool must exist with at least two ready replicas. ``actuates`` says
whether replicas follow ``scale_pool`` (the static adapter only records targets);
``settle`` waits until the orchestrator has converged; ``unavailable`` is an async
context manager inside which the orchestrator cannot be reached (omit it to skip that
test).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import msgspec
import pytest

from roost.controller.orchestrator import (
    InstanceView,
    NodeFigures,
    Orchestrator,
    OrchestratorError,
    PoolRef,
    PoolState,
    ScaleResult,
    UnknownInstance,
    UnknownPool,
)


async def _no_wait() -> None:
    return None


@dataclass
class ContractHarness:
    orchestrator: Orchestrator
    pool: PoolRef
    actuates: bool
    settle: Callable[[], Awaitable[None]] = _no_wait
    unavailable: Callable[[], contextlib.AbstractAsyncContextManager[None]] | None = None
    missing_pool: PoolRef = field(default_factory=lambda: PoolRef("nope", "no-such-pool"))


class OrchestratorContract:
    """The contract tests. Not collected by itself (no ``Test`` prefix)."""

    @pytest.fixture
    async def harness(self) -> AsyncIterator[ContractHarness]:
        raise NotImplementedError("a contract subclass provides the harness fixture")
        yield  # pragma: no cover

    async def _state(self, h: ContractHarness) -> PoolState:
        await h.settle()
        return await h.orchestrator.pool_state(h.pool)

    async def test_it_is_an_orchestrator(self, harness: ContractHarness) -> None:
        assert isinstance(harness.orchestrator, Orchestrator)
        assert isinstance(harness.orchestrator.name, str) and harness.orchestrator.name

    async def test_pool_state_is_plain_data(self, harness: ContractHarness) -> None:
        state = await self._state(harness)
        assert isinstance(state, PoolState)
        assert isinstance(state.target_replicas, int) and state.target_replicas >= 2
        assert len(state.instances) >= 2
        assert all(isinstance(i, InstanceView) and i.ref for i in state.instances)
        assert len({i.ref for i in state.instances}) == len(state.instances)
        assert all(isinstance(n, NodeFigures) for n in state.nodes)
        for n in state.nodes:
            assert min(n.allocatable_cpu_milli, n.allocatable_mem_mib) > 0
            assert min(n.used_cpu_milli, n.used_mem_mib) >= 0
        assert isinstance(state.observed_at, float)
        # Plain data: it survives a JSON round trip unchanged.
        assert msgspec.json.decode(msgspec.json.encode(state), type=PoolState) == state

    async def test_an_unknown_pool_is_unknown_pool(self, harness: ContractHarness) -> None:
        orch, missing = harness.orchestrator, harness.missing_pool
        with pytest.raises(UnknownPool):
            await orch.pool_state(missing)
        with pytest.raises(UnknownPool):
            await orch.scale_pool(missing, 1, request_id="contract-missing")
        with pytest.raises(UnknownPool):
            await orch.set_instance_termination_priority(missing, "x", priority=-1000)

    async def test_scale_pool_is_absolute_and_idempotent(self, harness: ContractHarness) -> None:
        orch, pool = harness.orchestrator, harness.pool
        n = (await self._state(harness)).target_replicas
        try:
            assert await orch.scale_pool(pool, n + 1, request_id="contract-up") == ScaleResult(
                n, n + 1)
            again = await orch.scale_pool(pool, n + 1, request_id="contract-up")
            assert again == ScaleResult(n + 1, n + 1)
            assert (await self._state(harness)).target_replicas == n + 1
        finally:
            await orch.scale_pool(pool, n, request_id="contract-restore")
        assert (await self._state(harness)).target_replicas == n

    async def test_negative_replicas_are_refused(self, harness: ContractHarness) -> None:
        with pytest.raises(ValueError):
            await harness.orchestrator.scale_pool(harness.pool, -1, request_id="contract-neg")

    async def test_termination_priority_is_reported(self, harness: ContractHarness) -> None:
        orch, pool = harness.orchestrator, harness.pool
        ref = (await self._state(harness)).instances[0].ref
        try:
            for _ in range(2):  # idempotent
                await orch.set_instance_termination_priority(pool, ref, priority=-1000)
            prio = {i.ref: i.termination_priority for i in (await self._state(harness)).instances}
            assert prio[ref] == -1000
        finally:
            await orch.set_instance_termination_priority(pool, ref, priority=0)

    async def test_an_unknown_instance_is_unknown_instance(self, harness: ContractHarness
                                                           ) -> None:
        with pytest.raises(UnknownInstance):
            await harness.orchestrator.set_instance_termination_priority(
                harness.pool, "no-such-instance", priority=-1000)

    async def test_scale_up_adds_ready_instances(self, harness: ContractHarness) -> None:
        if not harness.actuates:
            pytest.skip("this adapter records targets; it does not start instances")
        orch, pool = harness.orchestrator, harness.pool
        before = await self._state(harness)
        try:
            await orch.scale_pool(pool, before.target_replicas + 1, request_id="contract-add")
            after = await self._state(harness)
            assert len(after.instances) == before.target_replicas + 1
            assert all(i.ready for i in after.instances)
            assert {i.ref for i in before.instances} < {i.ref for i in after.instances}
        finally:
            await orch.scale_pool(pool, before.target_replicas, request_id="contract-add-undo")

    async def test_scale_down_removes_the_lowest_priority_instance(
        self, harness: ContractHarness
    ) -> None:
        if not harness.actuates:
            pytest.skip("this adapter records targets; it does not stop instances")
        orch, pool = harness.orchestrator, harness.pool
        before = await self._state(harness)
        refs = [i.ref for i in before.instances]
        doomed = refs[len(refs) // 2]  # not the oldest nor the newest: no lucky default
        await orch.set_instance_termination_priority(pool, doomed, priority=-1000)
        await orch.scale_pool(pool, before.target_replicas - 1, request_id="contract-remove")
        after = await self._state(harness)
        assert sorted(i.ref for i in after.instances) == sorted(r for r in refs if r != doomed)
        await orch.scale_pool(pool, before.target_replicas, request_id="contract-remove-undo")

    async def test_failures_are_orchestrator_errors(self, harness: ContractHarness) -> None:
        if harness.unavailable is None:
            pytest.skip("the harness cannot make this orchestrator unreachable")
        orch, pool = harness.orchestrator, harness.pool
        ref = (await self._state(harness)).instances[0].ref
        async with harness.unavailable():
            with pytest.raises(OrchestratorError):
                await orch.pool_state(pool)
            with pytest.raises(OrchestratorError):
                await orch.scale_pool(pool, 3, request_id="contract-down")
            with pytest.raises(OrchestratorError):
                await orch.set_instance_termination_priority(pool, ref, priority=-1)
        await orch.pool_state(pool)  # and it recovers
