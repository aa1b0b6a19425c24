"""Versioned schema migrations, applied by ``roost db migrate`` and on controller start.

Each migration is a module ``vNNNN_<name>.py`` in this package holding ``SQL``. A new
migration is a new module: no list to edit, so work on different tables never collides.
Applied versions are recorded with a checksum in ``roost_schema_migrations``; editing a
migration that has already run is refused, since the databases it ran on would silently
differ from new ones.

Each migration runs in its own transaction under a transaction-scoped advisory lock, so
two controllers starting at once apply each migration exactly once.
"""

from __future__ import annotations

import hashlib
import importlib
import pkgutil
import re
from dataclasses import dataclass
from typing import Any

from roost.store.session import SessionBounds, connect

_MODULE = re.compile(r"v(\d{4})_([a-z0-9_]+)")
_LOCK = (0x726F6F73, 1)  # ('roos', 1): schema migrations
_TABLE = """
CREATE TABLE IF NOT EXISTS roost_schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


class MigrationError(RuntimeError):
    """The migrations in this build and those recorded in the database disagree."""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()[:16]


def discover() -> list[Migration]:
    """Every migration module of this package, by version."""
    found: dict[int, Migration] = {}
    for info in pkgutil.iter_modules(__path__):
        m = _MODULE.fullmatch(info.name)
        if not m:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        version = int(m.group(1))
        if version in found:
            raise MigrationError(f"two migrations numbered {version}")
        found[version] = Migration(version, m.group(2), str(module.SQL))
    return [found[v] for v in sorted(found)]


async def applied(conn: Any) -> dict[int, str]:
    """Version -> checksum of every migration the database has run."""
    exists = await conn.fetchval("SELECT to_regclass('roost_schema_migrations') IS NOT NULL")
    if not exists:
        return {}
    rows = await conn.fetch("SELECT version, checksum FROM roost_schema_migrations")
    return {int(r["version"]): str(r["checksum"]) for r in rows}


async def migrate(conn: Any, migrations: list[Migration] | None = None) -> list[Migration]:
    """Apply every pending migration in order; return the ones applied now."""
    todo = discover() if migrations is None else migrations
    async with conn.transaction():  # CREATE TABLE IF NOT EXISTS races without the lock
        await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", *_LOCK)
        await conn.execute(_TABLE)
    done: list[Migration] = []
    for mig in todo:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", *_LOCK)
            have = await applied(conn)
            if mig.version in have:
                if have[mig.version] != mig.checksum:
                    raise MigrationError(
                        f"migration {mig.version} ({mig.name}) changed after it was applied"
                    )
                continue
            await conn.execute(mig.sql)
            await conn.execute(
                "INSERT INTO roost_schema_migrations (version, name, checksum) "
                "VALUES ($1, $2, $3)", mig.version, mig.name, mig.checksum,
            )
            done.append(mig)
    # Versions the database has and this build lacks are left alone: during a rolling
    # upgrade the newer build migrates first and older replicas must keep running.
    return done


async def migrate_dsn(dsn: str) -> list[Migration]:
    """Migrate over a connection of its own, bounded like every controller session: a
    migration waits for another controller's (the advisory lock), never forever."""
    bounds = SessionBounds(statement_timeout=120.0, transaction_bound=120.0,
                           application_name="roost migrate")
    conn = await connect(dsn, bounds, timeout=10.0)
    try:
        return await migrate(conn)
    finally:
        await conn.close()
