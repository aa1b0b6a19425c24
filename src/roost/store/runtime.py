"""What the controller reads each tick: demand, workers, database health, and the plan
the leader last published (for followers' /status).

One query per kind for all pools, not one per pool: a tick over 100 pools and 10,000
workers is a handful of round trips.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from roost.decide.snapshot import DbHealth, Demand, PastArrivals, WorkerStatus, WorkerView
from roost.store.timeconv import from_ts


async def read_demand(conn: Any, *, timeout: float | None = None) -> dict[str, Demand]:
    rows = await conn.fetch("SELECT pool_id, queued, running FROM pool_queue", timeout=timeout)
    return {str(r["pool_id"]): Demand(int(r["queued"]), int(r["running"])) for r in rows}


# Each query reads the tasks pool by pool (a LATERAL subquery per row of worker_pools),
# so that every range is an index range on (pool_id, created_at) or (pool_id,
# finished_at). A range on the time alone cannot use those indexes before Postgres 18's
# skip scan, and finished tasks are kept: on Postgres 15 each read was a sequential scan
# of the whole table (0.4 s a query at 2.1 million tasks), every tick.

_RATES = """
SELECT p.id AS pool_id, c.created, d.service, d.completed
FROM worker_pools AS p
CROSS JOIN LATERAL (
    SELECT count(*) AS created FROM tasks AS t
    WHERE t.pool_id = p.id AND t.created_at > now() - make_interval(secs => $1)) AS c
CROSS JOIN LATERAL (
    -- the mean and the count of completions are over the same tasks
    SELECT avg(extract(epoch FROM t.finished_at - t.started_at)) AS service,
           count(*) AS completed
    FROM tasks AS t
    WHERE t.pool_id = p.id AND t.finished_at > now() - make_interval(secs => $1)
      AND t.status = 'done' AND t.started_at IS NOT NULL) AS d
WHERE c.created > 0 OR d.completed > 0
"""


_PEAKS = """
SELECT p.id AS pool_id, b.peak
FROM worker_pools AS p
CROSS JOIN LATERAL (
    SELECT max(n) AS peak
    FROM (SELECT count(*) AS n FROM tasks AS t
          WHERE t.pool_id = p.id AND t.created_at > now() - make_interval(secs => $1)
          GROUP BY floor(extract(epoch FROM t.created_at) / $2)) AS buckets) AS b
WHERE b.peak IS NOT NULL
"""


async def read_rates(conn: Any, window: float, *, grain: float, span: float,
                     timeout: float | None = None
                     ) -> dict[str, tuple[float, float | None, int, float]]:
    """Per pool: tasks created per second over the last ``window`` seconds (on the
    database's clock), the mean run time of the tasks completed in it (None if none)
    and how many they are, and the most tasks created in any ``grain`` seconds
    (buckets aligned to the epoch) of the last ``span`` seconds, per second. A pool
    with no task in the window is absent: its rates are 0."""
    rows = await conn.fetch(_RATES, float(window), timeout=timeout)
    peaks = {str(r["pool_id"]): int(r["peak"]) / grain
             for r in await conn.fetch(_PEAKS, float(span), float(grain), timeout=timeout)}
    return {
        str(r["pool_id"]): (int(r["created"]) / window,
                            None if r["service"] is None else float(r["service"]),
                            int(r["completed"]),
                            peaks.get(str(r["pool_id"]), 0.0))
        for r in rows
    }


_PAST = """
SELECT p.id AS pool_id, false AS finish, c.k, c.n, NULL::float8 AS ran
FROM worker_pools AS p
CROSS JOIN LATERAL (
    SELECT floor(extract(epoch FROM now() - t.created_at) / $2)::int AS k, count(*) AS n
    FROM tasks AS t
    WHERE t.pool_id = p.id AND t.created_at > now() - make_interval(secs => $1)
      AND t.created_at <= now()
    GROUP BY 1) AS c
UNION ALL
SELECT p.id, true, d.k, d.n, d.ran
FROM worker_pools AS p
CROSS JOIN LATERAL (
    SELECT floor(extract(epoch FROM now() - t.finished_at) / $2)::int AS k, count(*) AS n,
           sum(extract(epoch FROM t.finished_at - t.started_at)) AS ran
    FROM tasks AS t
    WHERE t.pool_id = p.id AND t.finished_at > now() - make_interval(secs => $1)
      AND t.finished_at <= now() AND t.status = 'done' AND t.started_at IS NOT NULL
    GROUP BY 1) AS d
"""


async def read_past(conn: Any, span: float, *, grain: float,
                    timeout: float | None = None) -> dict[str, PastArrivals]:
    """Per pool: its tasks created and completed over the last ``span`` seconds (on the
    database's clock), counted by age in buckets of ``grain`` seconds, in one statement
    (one ``now()``). A pool with no task in the span is absent: it had no arrivals."""
    n = max(1, math.ceil(span / grain))
    created: dict[str, list[int]] = defaultdict(lambda: [0] * n)
    completed: dict[str, list[int]] = defaultdict(lambda: [0] * n)
    ran: dict[str, list[float]] = defaultdict(lambda: [0.0] * n)
    for r in await conn.fetch(_PAST, float(span), float(grain), timeout=timeout):
        pool, k = str(r["pool_id"]), int(r["k"])
        if not 0 <= k < n:
            continue  # the span's own edge, to the float
        if r["finish"]:
            completed[pool][k] += int(r["n"])
            ran[pool][k] += float(r["ran"])
        else:
            created[pool][k] += int(r["n"])
    return {pool: PastArrivals(grain, span, tuple(created[pool]), tuple(completed[pool]),
                               tuple(ran[pool])) for pool in set(created) | set(completed)}


_PRUNE = """
DELETE FROM tasks
WHERE id IN (
    SELECT id FROM tasks
    WHERE pool_id = $1 AND finished_at < now() - make_interval(secs => $2)
      AND status IN ('done', 'failed')
    ORDER BY finished_at
    LIMIT $3)
"""


async def prune_finished(conn: Any, pool_id: str, older_than: float, *, batch: int,
                         timeout: float | None = None) -> int:
    """Delete up to ``batch`` tasks of the pool that finished (done or failed) more than
    ``older_than`` seconds ago (on the database's clock), oldest first: how many went.
    Queued and running tasks are never touched, however old. One pool and one batch a
    statement, so that each is short whatever the pools and the backlog."""
    status = await conn.execute(_PRUNE, pool_id, float(older_than), int(batch),
                                timeout=timeout)
    return int(status.split()[-1])


async def read_workers(
    conn: Any, *, timeout: float | None = None
) -> dict[str, list[WorkerView]]:
    """Every live (not gone) worker, by pool."""
    rows = await conn.fetch(
        "SELECT id, pool_id, status, running_tasks, active_leases, revision, instance_ref, "
        "heartbeat_at, draining_since, removal_target, slots FROM workers "
        "WHERE status <> 'gone'",
        timeout=timeout,
    )
    out: dict[str, list[WorkerView]] = defaultdict(list)
    for r in rows:
        out[str(r["pool_id"])].append(
            WorkerView(
                worker_id=str(r["id"]),
                status=WorkerStatus(r["status"]),
                running_tasks=int(r["running_tasks"]),
                active_leases=int(r["active_leases"]),
                revision=str(r["revision"]),
                instance_ref=str(r["instance_ref"]),
                heartbeat_at=float(r["heartbeat_at"].timestamp()),
                draining_since=from_ts(r["draining_since"]),
                removal_target=r["removal_target"],
                slots=r["slots"],
            )
        )
    return dict(out)


async def read_db_health(conn: Any, *, observed_at: float,
                         timeout: float | None = None) -> DbHealth:
    """Connection limits and replication state of the server the workers use.

    ``reserved_connections`` exists from Postgres 16; before, only the superuser slots
    are reserved. Synchronous peers are the walsenders in 'sync' or 'quorum' state.
    ``clock_offset`` is the server's clock minus ``observed_at`` (the caller's clock just
    before the query), so it includes up to one round trip.
    """
    row = await conn.fetchrow(
        "SELECT current_setting('max_connections')::int AS max_connections, "
        "current_setting('superuser_reserved_connections')::int "
        "  + coalesce(nullif(current_setting('reserved_connections', true), ''), '0')::int "
        "  AS reserved, "
        "(SELECT count(*) FROM pg_stat_replication "
        "  WHERE sync_state IN ('sync', 'quorum'))::int AS sync_peers, "
        "pg_is_in_recovery() AS in_recovery, "
        "extract(epoch FROM clock_timestamp())::float8 AS db_time",
        timeout=timeout,
    )
    return DbHealth(
        max_connections=int(row["max_connections"]),
        reserved_connections=int(row["reserved"]),
        sync_peers=int(row["sync_peers"]),
        in_recovery=bool(row["in_recovery"]),
        observed_at=observed_at,
        clock_offset=float(row["db_time"]) - observed_at,
    )


@dataclass(frozen=True, slots=True)
class Published:
    """A row of ``desired_capacity``: what the leader last decided for a pool."""

    pool_id: str
    desired: int | None
    current: int | None
    raw_desired: int | None
    reason: str
    frozen_reason: str | None
    valid_until: float
    leader_epoch: int
    published_at: float
    startup: float | None = None
    """The leader's replica start-up estimate for the pool, seconds (None: none yet)."""
    startup_revision: str | None = None
    """The pool's ``expected_revision`` when that estimate was published."""


async def read_published(conn: Any, *, timeout: float | None = None) -> list[Published]:
    rows = await conn.fetch(
        "SELECT pool_id, desired, current, raw_desired, reason, frozen_reason, valid_until, "
        "leader_epoch, published_at, startup_seconds, startup_revision "
        "FROM desired_capacity ORDER BY pool_id",
        timeout=timeout,
    )
    return [
        Published(
            pool_id=str(r["pool_id"]),
            desired=r["desired"],
            current=r["current"],
            raw_desired=r["raw_desired"],
            reason=str(r["reason"]),
            frozen_reason=r["frozen_reason"],
            valid_until=float(r["valid_until"].timestamp()),
            leader_epoch=int(r["leader_epoch"]),
            published_at=float(r["published_at"].timestamp()),
            startup=r["startup_seconds"],
            startup_revision=r["startup_revision"],
        )
        for r in rows
    ]
