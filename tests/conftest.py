"""Fixtures that start real servers from their wheels: never mocks, never a server that
happens to be running on the machine. Each fixture stops what it started by pid."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from roost.embedded import NatsCluster, NatsServer, PostgresServer


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A fresh nats-server (JetStream on) per test, so no test sees another's state."""
    server = NatsServer(base_dir=tmp_path / "nats").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """Three nats-servers routed on loopback."""
    cluster = NatsCluster(3, base_dir=tmp_path / "nats-cluster").start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    """A fresh directory outside pytest's basetemp, for a roost that starts its own
    Postgres. When we are root, Postgres runs as another user and must traverse every
    parent; a pytest session starting meanwhile makes /tmp/pytest-of-<user> 0700 again."""
    base = Path(tempfile.mkdtemp(prefix="roost-test-"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def fresh_postgres() -> Iterator[PostgresServer]:
    """A Postgres of its own, stopped by pid and removed afterwards.

    Not under pytest's basetemp: pytest prunes the oldest numbered basetemps when a newer
    session starts, and makes /tmp/pytest-of-<user> 0700 again, which a server running as
    another user (we may be root) cannot traverse.
    """
    base = Path(tempfile.mkdtemp(prefix="roost-test-pg-"))
    server = PostgresServer(base_dir=base, durable=False).start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One Postgres for the session; each test gets its own database (see `pg_dsn`)."""
    with fresh_postgres() as server:
        yield server


@pytest.fixture
async def pg_dsn(postgres_server: PostgresServer) -> AsyncIterator[str]:
    """A DSN for a brand-new database, dropped after the test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(postgres_server.dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    yield f"postgresql://postgres@127.0.0.1:{postgres_server.port}/{name}"
    admin = await asyncpg.connect(postgres_server.dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()
