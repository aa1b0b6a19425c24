"""The least-privilege Postgres role workers connect as, and the record of which
instances have enrolled for it.

``roost_worker`` may read pools, register and heartbeat workers, and claim, extend and
settle tasks: SELECT on ``worker_pools``, SELECT/INSERT/UPDATE on ``workers``,
SELECT/UPDATE on ``tasks``. Nothing else: not the API tokens, not the enrollments, not
the leader lease or the published plan, and it cannot submit or delete tasks.
Making it needs a role with CREATEROLE (`roost db worker-role` as the superuser).
"""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

WORKER_ROLE = "roost_worker"
GRANTS = (
    f"GRANT SELECT ON worker_pools TO {WORKER_ROLE}",
    f"GRANT SELECT, INSERT, UPDATE ON workers TO {WORKER_ROLE}",
    f"GRANT SELECT, UPDATE ON tasks TO {WORKER_ROLE}",
)


async def ensure_worker_role(conn: Any, password: str) -> None:
    """Create the worker role, or set its password; (re)grant what it needs. Run after
    the migrations, by a role that may create roles."""
    literal = await conn.fetchval("SELECT quote_literal($1)", password)
    async with conn.transaction():
        exists = await conn.fetchval("SELECT true FROM pg_roles WHERE rolname = $1",
                                     WORKER_ROLE)
        verb = "ALTER" if exists else "CREATE"
        await conn.execute(f"{verb} ROLE {WORKER_ROLE} LOGIN PASSWORD {literal}")
        for grant in GRANTS:
            await conn.execute(grant)


def new_password() -> str:
    return secrets.token_urlsafe(24)


def dsn_as(dsn: str, role: str, password: str) -> str:
    """``dsn`` (a URL) with its user and password replaced: same host, port, database
    and options."""
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgres", "postgresql") or not parts.hostname:
        raise ValueError("want a postgresql://user@host/db DSN")
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc = f"{quote(role, safe='')}:{quote(password, safe='')}@{host}" + (
        f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


async def record_enrollment(db: Any, instance_id: str, pool_id: str) -> bool:
    """Record that ``instance_id`` enrolled; False if it had already (refuse it then).
    Rows older than a week go: by then their instances are far past the enroll window."""
    await db.execute("DELETE FROM worker_enrollments "
                     "WHERE enrolled_at < now() - interval '7 days'")
    first = await db.fetchval(
        "INSERT INTO worker_enrollments (instance_id, pool_id) VALUES ($1, $2) "
        "ON CONFLICT (instance_id) DO NOTHING RETURNING true", instance_id, pool_id)
    return bool(first)
