"""The ``static`` orchestrator: pools on a fixed host list, described in a TOML file.

It cannot start or stop hosts. It reports what the file says (replicas, instances,
node figures) and records the targets and termination priorities the controller asks
for in a JSON file next to it, for an operator or a script to act on. The file is
re-read when it changes, so the operator closes the loop by editing it; until then the
pool is not settled and the controller removes nothing more. A file that no longer
parses makes the pool's state unreadable, which freezes its plan: a broken config is
missing data, never "zero replicas"::

    targets_file = "static-targets.json"   # optional, relative to this file

    [pools.batch]
    replicas = 3
    instances = ["host-a", "host-b", "host-c"]   # default: batch-1 .. batch-N
    not_ready = []

    [[pools.batch.nodes]]
    id = "host-a"
    vcpu = 8              # or cpu_milli
    memory_gib = 32       # or memory_mib
    used_cpu_milli = 0
    used_memory_mib = 0
    memory_pressure = false
"""

from __future__ import annotations

import asyncio
import json
import os
import tomllib
from collections.abc import Callable
from pathlib import Path

import msgspec

from roost.controller.orchestrator import (
    InstanceView,
    NodeFigures,
    OrchestratorError,
    PoolRef,
    PoolState,
    ScaleResult,
    UnknownInstance,
    UnknownPool,
    check_replicas,
)


class _Node(msgspec.Struct, forbid_unknown_fields=True):
    id: str
    vcpu: float | None = None
    cpu_milli: int | None = None
    memory_gib: float | None = None
    memory_mib: int | None = None
    used_cpu_milli: int = 0
    used_memory_mib: int = 0
    memory_pressure: bool = False

    def figures(self) -> NodeFigures:
        cpu = self.cpu_milli if self.cpu_milli is not None else round((self.vcpu or 0) * 1000)
        mem = self.memory_mib if self.memory_mib is not None else round(
            (self.memory_gib or 0) * 1024)
        if cpu <= 0 or mem <= 0:
            raise ValueError(f"node {self.id!r} needs vcpu/cpu_milli and memory_gib/memory_mib")
        return NodeFigures(self.id, cpu, mem, self.used_cpu_milli, self.used_memory_mib,
                           self.memory_pressure)


class _Pool(msgspec.Struct, forbid_unknown_fields=True):
    replicas: int
    instances: list[str] | None = None
    not_ready: list[str] = []
    nodes: list[_Node] = []


class _File(msgspec.Struct, forbid_unknown_fields=True):
    pools: dict[str, _Pool] = {}
    targets_file: str = ""


def parse_config(text: str) -> tuple[dict[str, PoolState], str]:
    """Pools (observed_at 0) and the targets file name, or ValueError saying what's wrong."""
    try:
        doc = msgspec.convert(tomllib.loads(text), _File)
    except (tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"static orchestrator config: {exc}") from None
    pools: dict[str, PoolState] = {}
    for ref, p in doc.pools.items():
        if p.replicas < 0:
            raise ValueError(f"pools.{ref}.replicas must be >= 0")
        names = p.instances if p.instances is not None else [
            f"{ref}-{i + 1}" for i in range(p.replicas)]
        pools[ref] = PoolState(
            target_replicas=p.replicas,
            instances=tuple(InstanceView(n, n not in p.not_ready) for n in names),
            nodes=tuple(n.figures() for n in p.nodes),
            observed_at=0.0,
        )
    return pools, doc.targets_file


class StaticOrchestrator:
    name = "static"

    def __init__(self, path: Path, *, now: Callable[[], float]) -> None:
        self.path = path
        self._now = now
        self._mtime = -1
        self._pools: dict[str, PoolState] = {}
        self._error = ""
        self.targets_path = path.with_name("static-targets.json")
        self._reload()
        self.targets: dict[str, dict[str, object]] = self._load_targets()

    def _reload(self) -> None:
        try:
            mtime = self.path.stat().st_mtime_ns
        except OSError as exc:
            self._error = f"cannot read {self.path}: {exc.strerror}"
            self._mtime = -1  # re-parse when it comes back, whatever its mtime
            return
        if mtime == self._mtime:
            return
        self._mtime = mtime
        try:
            self._pools, targets = parse_config(self.path.read_text())
            self._error = ""
        except (OSError, ValueError) as exc:
            self._error = str(exc)
            return
        if targets:
            self.targets_path = self.path.parent / targets

    def _load_targets(self) -> dict[str, dict[str, object]]:
        try:
            data = json.loads(self.targets_path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write_targets(self) -> None:
        tmp = self.targets_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.targets, indent=2, sort_keys=True))
        os.replace(tmp, self.targets_path)

    async def _state(self, ref: str) -> PoolState:
        await asyncio.to_thread(self._reload)
        if self._error:
            raise OrchestratorError(self._error)
        try:
            return self._pools[ref]
        except KeyError:
            raise UnknownPool(f"{self.path} has no pool {ref!r}") from None

    async def pool_state(self, pool: PoolRef) -> PoolState:
        state = await self._state(pool.ref)
        rec = self.targets.get(pool.ref, {})
        target = rec.get("target")
        prio = rec.get("priorities", {})
        assert isinstance(prio, dict)
        return PoolState(
            target_replicas=target if isinstance(target, int) else state.target_replicas,
            instances=tuple(
                InstanceView(i.ref, i.ready, int(prio.get(i.ref, 0))) for i in state.instances
            ),
            nodes=state.nodes,
            observed_at=self._now(),
        )

    async def scale_pool(self, pool: PoolRef, replicas: int, *, request_id: str) -> ScaleResult:
        check_replicas(replicas)
        previous = (await self.pool_state(pool)).target_replicas
        rec = self.targets.setdefault(pool.ref, {})
        rec.update(target=replicas, request_id=request_id, updated_at=self._now())
        await asyncio.to_thread(self._write_targets)
        return ScaleResult(previous, replicas)

    async def set_instance_termination_priority(
        self, pool: PoolRef, instance_ref: str, *, priority: int
    ) -> None:
        state = await self._state(pool.ref)
        if instance_ref not in {i.ref for i in state.instances}:
            raise UnknownInstance(f"pool {pool.ref!r} has no instance {instance_ref!r}")
        rec = self.targets.setdefault(pool.ref, {})
        prio = rec.setdefault("priorities", {})
        assert isinstance(prio, dict)
        prio[instance_ref] = priority
        await asyncio.to_thread(self._write_targets)

    async def close(self) -> None:
        return None
