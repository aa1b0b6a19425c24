"""Worker pool configuration: create, read, update, delete.

Pools are returned as `roost.decide.snapshot.PoolSpec`, the very type the plan takes, so
there is no second pool model to keep in step.
"""

from __future__ import annotations

import re
from dataclasses import fields, replace
from typing import Any

import asyncpg

from roost.decide.snapshot import PoolSpec, pool_spec_problems
from roost.store.errors import InvalidPool, PoolBusy, PoolExists, PoolNotFound
from roost.store.tasks import transaction

_COLUMNS = {
    "pool_id": "id",
    "min_replicas": "min_replicas",
    "max_replicas": "max_replicas",
    "target_per_replica": "target_per_replica",
    "worker_cpu_milli": "worker_cpu_milli",
    "worker_mem_mib": "worker_mem_mib",
    "worker_db_pool_size": "worker_db_pool_size",
    "expected_revision": "expected_revision",
    "orchestrator": "orchestrator",
    "orchestrator_ref": "orchestrator_ref",
    "growth_replicas": "growth_replicas",
    "growth_percent": "growth_percent",
    "disruption_replicas": "disruption_replicas",
    "disruption_percent": "disruption_percent",
    "scale_down_window": "scale_down_window",
}
_SELECT = "SELECT " + ", ".join(f"{c} AS {f}" for f, c in _COLUMNS.items()) + " FROM worker_pools"


POOL_ID = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
"""The schema's ``worker_pools_id_check`` (a DNS label), checked here to say the rule
rather than name the constraint."""

INT32_MAX = 2**31 - 1
_INTEGER_FLOORS = {
    "min_replicas": 0, "max_replicas": 0, "target_per_replica": 1, "worker_cpu_milli": 1,
    "worker_mem_mib": 1, "worker_db_pool_size": 0, "growth_replicas": 1,
    "growth_percent": 0, "disruption_replicas": 1, "disruption_percent": 0,
    "scale_down_window": 0,
}
"""The fields stored in ``integer`` (32-bit) columns, each with the least value its
check allows: a value past the column's top is refused naming the range, not left to
fail as asyncpg's "out of int32 range"."""


def _spec(row: Any) -> PoolSpec:
    return PoolSpec(**{f.name: row[f.name] for f in fields(PoolSpec)})


def validate(spec: PoolSpec) -> None:
    """The schema's constraints, checked before a round trip so the message is clear."""
    if not POOL_ID.fullmatch(spec.pool_id):
        raise InvalidPool(f"pool id {spec.pool_id!r} must be 1 to 63 lower-case letters, "
                          "digits and '-', starting and ending with a letter or digit")
    text = [f for f in ("expected_revision", "orchestrator", "orchestrator_ref")
            if "\x00" in getattr(spec, f)]
    if text:
        raise InvalidPool(f"{', '.join(text)} must not contain NUL (U+0000), which "
                          "Postgres text cannot hold")
    if spec.min_replicas < 0 or spec.max_replicas < spec.min_replicas:
        raise InvalidPool("need 0 <= min_replicas <= max_replicas")
    if spec.target_per_replica <= 0:
        raise InvalidPool("target_per_replica must be > 0")
    if spec.worker_cpu_milli <= 0 or spec.worker_mem_mib <= 0:
        raise InvalidPool("worker cpu and memory must be > 0")
    if spec.worker_db_pool_size < 0:
        raise InvalidPool("worker_db_pool_size must be >= 0")
    if not spec.orchestrator:
        raise InvalidPool("orchestrator must be named")
    problems = pool_spec_problems(spec)
    if problems:
        raise InvalidPool("; ".join(problems))
    # last: a field with a narrower range of its own has been named by now
    too_big = [f"{f} must be within {low}..{INT32_MAX} (got {v})"
               for f, low in _INTEGER_FLOORS.items()
               if isinstance(v := getattr(spec, f), int) and v > INT32_MAX]
    if too_big:
        raise InvalidPool("; ".join(too_big))


async def list_pools(conn: Any) -> list[PoolSpec]:
    return [_spec(r) for r in await conn.fetch(_SELECT + " ORDER BY id")]


async def get_pool(conn: Any, pool_id: str) -> PoolSpec:
    row = await conn.fetchrow(_SELECT + " WHERE id = $1", pool_id)
    if row is None:
        raise PoolNotFound(pool_id)
    return _spec(row)


async def create_pool(conn: Any, spec: PoolSpec) -> PoolSpec:
    validate(spec)
    cols = ", ".join(_COLUMNS.values())
    args = ", ".join(f"${i + 1}" for i in range(len(_COLUMNS)))
    try:
        await conn.execute(
            f"INSERT INTO worker_pools ({cols}) VALUES ({args})",
            *(getattr(spec, f) for f in _COLUMNS),
        )
    except asyncpg.UniqueViolationError:
        raise PoolExists(spec.pool_id) from None
    except asyncpg.CheckViolationError as exc:
        raise InvalidPool(f"pool {spec.pool_id!r} rejected: {exc.constraint_name}") from None
    return spec


async def update_pool(db: Any, pool_id: str, /, **changes: Any) -> PoolSpec:
    """Change some fields of a pool; the id cannot change (workers and tasks refer to it)."""
    unknown = set(changes) - set(_COLUMNS) | ({"pool_id"} & set(changes))
    if unknown:
        raise InvalidPool(f"cannot update {', '.join(sorted(unknown))}")
    async with transaction(db) as conn:
        current = await conn.fetchrow(_SELECT + " WHERE id = $1 FOR UPDATE", pool_id)
        if current is None:
            raise PoolNotFound(pool_id)
        spec = replace(_spec(current), **changes)
        validate(spec)
        sets = ", ".join(f"{_COLUMNS[f]} = ${i + 2}" for i, f in enumerate(changes))
        if sets:
            await conn.execute(
                f"UPDATE worker_pools SET {sets}, updated_at = now() WHERE id = $1",
                pool_id, *changes.values(),
            )
    return spec


async def delete_pool(db: Any, pool_id: str, *, force: bool = False) -> None:
    """Delete a pool. Refused while it has live workers or open tasks, unless ``force``:
    deleting it would orphan work that is still running."""
    async with transaction(db) as conn:
        row = await conn.fetchrow(
            "SELECT (SELECT count(*) FROM workers w WHERE w.pool_id = p.id "
            "        AND w.status <> 'gone') AS live, "
            "       (SELECT count(*) FROM tasks t WHERE t.pool_id = p.id "
            "        AND t.status IN ('queued', 'running')) AS open "
            "FROM worker_pools p WHERE p.id = $1 FOR UPDATE",
            pool_id,
        )
        if row is None:
            raise PoolNotFound(pool_id)
        if (row["live"] or row["open"]) and not force:
            raise PoolBusy(
                f"pool {pool_id!r} has {row['live']} live workers and {row['open']} open "
                "tasks; drain it first or force the delete"
            )
        await conn.execute("DELETE FROM worker_pools WHERE id = $1", pool_id)
