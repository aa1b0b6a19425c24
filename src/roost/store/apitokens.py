"""Bearer tokens for the task API, stored as hashes in ``api_tokens``.

A token reaches one pool, or every pool when it was made without one (an operator
token). Its text is shown once, at creation; the database keeps only its SHA-256, so
neither a dump nor a log of the table holds a usable token. Revoking deletes the row:
the next request with that token is refused, on every controller replica at once.

Errors (`roost.store.errors.StoreError`): `PoolNotFound` for a token of a missing pool,
`TokenExists` for a name already taken, `TokenNotFound` for a revoke of an unknown name.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Any

import asyncpg

from roost.store.errors import PoolNotFound, StoreError
from roost.store.timeconv import from_ts

PREFIX = "rpt_"
"""Every token starts with it, so secret scanners and people can tell what one is."""
NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


class TokenExists(StoreError):
    def __init__(self, name: str) -> None:
        super().__init__(f"an API token named {name!r} exists already")


class TokenNotFound(StoreError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no API token named {name!r}")


@dataclass(frozen=True, slots=True)
class Grant:
    """What a presented token may reach."""

    name: str
    pool_id: str | None
    """None: every pool."""

    def reaches(self, pool_id: str) -> bool:
        return self.pool_id is None or self.pool_id == pool_id


@dataclass(frozen=True, slots=True)
class TokenInfo:
    name: str
    pool_id: str | None
    created_at: float


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return PREFIX + secrets.token_urlsafe(32)


async def create(db: Any, name: str, pool_id: str | None) -> str:
    """Make a token for ``pool_id`` (None: every pool) and return its text, the only
    time it is ever available."""
    if not NAME.fullmatch(name):
        raise ValueError(f"token name {name!r}: 1-64 letters, digits, '.', '_' or '-'")
    token = new_token()
    try:
        await db.execute(
            "INSERT INTO api_tokens (name, token_hash, pool_id) VALUES ($1, $2, $3)",
            name, digest(token), pool_id,
        )
    except asyncpg.UniqueViolationError:
        raise TokenExists(name) from None
    except asyncpg.ForeignKeyViolationError:
        assert pool_id is not None
        raise PoolNotFound(pool_id) from None
    return token


async def lookup(db: Any, token: str) -> Grant | None:
    """The grant of a presented token, or None for one that is unknown or revoked."""
    if not token.startswith(PREFIX) or len(token) > 200:
        return None
    row = await db.fetchrow("SELECT name, pool_id FROM api_tokens WHERE token_hash = $1",
                            digest(token))
    return None if row is None else Grant(str(row["name"]), row["pool_id"])


async def list_tokens(db: Any) -> list[TokenInfo]:
    rows = await db.fetch("SELECT name, pool_id, created_at FROM api_tokens ORDER BY name")
    return [TokenInfo(str(r["name"]), r["pool_id"], from_ts(r["created_at"]) or 0.0)
            for r in rows]


async def revoke(db: Any, name: str) -> None:
    done = await db.fetchval("DELETE FROM api_tokens WHERE name = $1 RETURNING true", name)
    if not done:
        raise TokenNotFound(name)
