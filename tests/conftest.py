"""Fixtures that start real servers from their wheels: never mocks, never a server that
happens to be running on the machine. Each fixture stops what it started by pid."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from roost.embedded import NatsCluster, NatsServer, PostgresServer
from roost.node.cgroups import ROOT_ENV, CgroupError, detect

# Every node this test session starts keeps its cgroups under a root of the session's
# own, so that two runs on one host (a developer's and CI's, say) never touch each
# other's instances, and the net below can clear exactly what this session made.
os.environ[ROOT_ENV] = f"roost-test-{os.getpid()}"


def _session_groups() -> dict[str, set[str]]:
    """Node id -> the instance groups it has, under this session's root."""
    try:
        probe = detect("probe")
    except CgroupError:
        return {}
    found: dict[str, set[str]] = {}
    for h in probe.hierarchies:
        root = h.node_dir.parent
        for node_dir in (root.iterdir() if root.is_dir() else ()):
            if node_dir.is_dir() and not node_dir.name.startswith("roost-probe"):
                found.setdefault(node_dir.name, set()).update(
                    d.name for d in node_dir.iterdir() if d.is_dir())
    return found


@pytest.fixture(scope="session", autouse=True)
def no_instance_outlives_the_session() -> Iterator[None]:
    """Tests stop what they start; this is the net under them. Instances that a test left
    running (a node stopped while they ran, a failed test) are killed through their
    cgroups at the end of the session, and the session's groups and root removed."""
    yield
    for node_id, instances in sorted(_session_groups().items()):
        groups = detect(node_id)
        for iid in sorted(instances):
            group = groups.open(iid)
            if group is None:
                continue
            for _ in range(100):
                if not group.populated():
                    break
                group.kill_all(signal.SIGKILL)
                time.sleep(0.02)
            group.remove()
        with contextlib.suppress(CgroupError):
            groups.remove_root()


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
def fresh_postgres(*, password: bool = False) -> Iterator[PostgresServer]:
    """A Postgres of its own, stopped by pid and removed afterwards.

    Not under pytest's basetemp: pytest prunes the oldest numbered basetemps when a newer
    session starts, and makes /tmp/pytest-of-<user> 0700 again, which a server running as
    another user (we may be root) cannot traverse.
    """
    base = Path(tempfile.mkdtemp(prefix="roost-test-pg-"))
    server = PostgresServer(base_dir=base, durable=False, password=password).start()
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
