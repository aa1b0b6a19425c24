"""`roost up` is authenticated end to end, against one real `roost up` (process driver,
two nodes, Postgres and the controller) shared by the module:

- NATS refuses a client without credentials, so it can neither command a node nor read a
  bucket; a node's credentials cannot command another node nor open the buckets it has
  no business with.
- The task API refuses anonymous and wrong-pool callers, answers a pool or task the
  caller may not see exactly as a missing one, and its ids cannot be enumerated; a
  native pool's worker enrolls for its DSN and runs the task.
- No secret the run made appears in user data, in any KV bucket (nor in JetStream's files
  behind them), in node state, or in any log, including roost up's own output at DEBUG.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import httpx
import nats
import pytest
from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError

from roost.bus.auth import NatsAuth
from roost.bus.contents import live_entries
from roost.embedded.proc import free_port
from roost.store import apitokens
from roost.store import pools as pools_q
from tests.e2e.test_up_awscli import read_until
from tests.integration.test_controller_helpers import open_db, pool_spec

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Up:
    data: Path
    log: Path
    env: dict[str, str]
    controller: str
    nats_url: str
    made: dict[str, str] = field(default_factory=dict)
    """Secrets the tests made (pool tokens), for the grep at the end."""

    def nats_auth(self, user: str) -> NatsAuth:
        return NatsAuth.load(self.data / "nats-auth" / f"{user}.creds.json")


def _env(path: Path) -> dict[str, str]:
    pairs = (shlex.split(line.removeprefix("export "))[0].split("=", 1)
             for line in path.read_text().splitlines() if line.startswith("export "))
    return {k: v for k, v in pairs}


@pytest.fixture(scope="module")
def up() -> Iterator[Up]:
    base = Path(tempfile.mkdtemp(prefix="roost-test-sec-"))
    data, log = base / "up", base / "up.log"
    env = {**os.environ, "ROOST_WORKER_POLL": "0.1", "ROOST_WORKER_HEARTBEAT": "0.5"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from roost.up.cli import up; up()", "--nodes", "2",
             "--driver", "process", "--port", "0", "--nats-port", "0",
             "--postgres-port", "0", "--controller-port", str(free_port()), "--no-dashboard",
             "--log-level", "DEBUG", "--data-dir", str(data)],
            stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        banner = read_until(proc, log, "Ctrl-C stops everything")
        nats_url = next(line.split()[1] for line in banner.splitlines()
                        if line.strip().startswith("NATS "))
        values = _env(data / "env")
        u = Up(data, log, values, values["ROOST_CONTROLLER_URL"], nats_url)
        yield u
        asyncio.run(_no_instance_left(u))
    finally:
        os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        shutil.rmtree(base, ignore_errors=True)


async def _no_instance_left(up: Up) -> None:
    """Pools capped at 0 (so the controller launches nothing more), then every instance
    terminated and waited for: a node that stops leaves its instances running, by
    design, so the test ends its own workers before it stops `roost up`."""
    db = await open_db(up.env["ROOST_DSN"])
    try:
        for spec in await pools_q.list_pools(db):
            await pools_q.update_pool(db, spec.pool_id, min_replicas=0, max_replicas=0)
    finally:
        await db.close()
    ec2 = boto3.client("ec2", endpoint_url=up.env["AWS_ENDPOINT_URL_EC2"],
                       region_name=up.env["AWS_DEFAULT_REGION"],
                       aws_access_key_id=up.env["AWS_ACCESS_KEY_ID"],
                       aws_secret_access_key=up.env["AWS_SECRET_ACCESS_KEY"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        live = [i["InstanceId"] for r in ec2.describe_instances()["Reservations"]
                for i in r["Instances"] if i["State"]["Name"] != "terminated"]
        if not live:
            return
        ec2.terminate_instances(InstanceIds=live)
        await asyncio.sleep(1.0)
    raise AssertionError(f"instances still live after 60 s: {live}")


async def _refused(url: str, **auth: str) -> str:
    """Why the server refused a raw client (with these credentials, or none)."""
    nc = NATS()
    try:
        await nc.connect(url, allow_reconnect=False, max_reconnect_attempts=0,
                         connect_timeout=3, **auth)
    except NatsError as exc:
        return str(exc)
    finally:
        await nc.close()  # a refused connect leaves its socket open otherwise
    return "connected"


async def test_nats_wants_credentials_and_scopes_each_node(up: Up) -> None:
    assert "Authorization Violation" in await _refused(up.nats_url)
    assert "Authorization Violation" in await _refused(up.nats_url, user="node-1",
                                                       password="guessed")

    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    node1 = await nats.connect(up.nats_url, error_cb=on_error, **up.nats_auth("node-1").options())
    spy = await nats.connect(up.nats_url, **up.nats_auth("admin").options())
    try:
        heard = await spy.subscribe("roost.node.node-2.>")
        await spy.flush()
        await node1.publish("roost.node.node-2.command", b'{"action": "terminate"}')
        await node1.flush()
        with pytest.raises(nats.errors.TimeoutError):
            await heard.next_msg(timeout=0.5)  # the server dropped it
        js = node1.jetstream(timeout=1.0)
        for bucket in ("roost_user_data", "roost_client_tokens", "roost_accounts"):
            with pytest.raises((nats.errors.TimeoutError, nats.js.errors.Error)):
                await js.key_value(bucket)
        await js.key_value("roost_instances")  # its own bucket opens
        # Orders (deferred terminates): a node deletes its own, never another node's
        # (node-9: no agent of that name runs here to carry out and delete its own).
        orders = await spy.jetstream().key_value("roost_node_orders")
        for key in ("node-1.i-0000000000000000a", "node-9.i-0000000000000000b"):
            await orders.put(key, b"{}")
        mine = await js.key_value("roost_node_orders")
        await mine.delete("node-1.i-0000000000000000a")
        with pytest.raises(nats.errors.TimeoutError):  # dropped: no acknowledgement
            await mine.delete("node-9.i-0000000000000000b")
        await asyncio.sleep(0.2)
        assert (await orders.get("node-9.i-0000000000000000b")).value == b"{}"
        with pytest.raises(nats.js.errors.KeyNotFoundError):
            await orders.get("node-1.i-0000000000000000a")
        joined = " ".join(errors).lower()
        assert 'publish to "roost.node.node-2.command"' in joined, errors
        assert "$kv.roost_node_orders.node-9" in joined, errors
        assert "kv_roost_user_data" in joined, errors
    finally:
        await node1.close()
        await spy.close()


async def _pools(up: Up) -> None:
    """Pool ``sec`` (native: its tasks run on workers roost launches) and ``other``, with
    a token each; made once per cluster, by whichever test asks first."""
    if "sec" in up.made:
        return
    db = await open_db(up.env["ROOST_DSN"])
    try:
        await pools_q.create_pool(db, pool_spec(
            "sec", orchestrator="native", max_replicas=1, worker_cpu_milli=2000,
            worker_mem_mib=2048,
            orchestrator_ref=f"type=t3.small; target=tests.worker_tasks:slow; app_dir={ROOT}"))
        await pools_q.create_pool(db, pool_spec("other"))
        up.made["sec"] = await apitokens.create(db, "sec", "sec")
        up.made["other"] = await apitokens.create(db, "other", "other")
    finally:
        await db.close()


async def _succeeded(http: httpx.AsyncClient, tid: str, headers: dict[str, str]) -> None:
    deadline = time.monotonic() + 60
    while (doc := (await http.get(f"/api/v1/tasks/{tid}", headers=headers)).json()
           )["status"] != "succeeded":
        assert time.monotonic() < deadline, doc
        await asyncio.sleep(0.3)


async def test_the_task_api_refuses_hides_and_runs_on_an_enrolled_worker(up: Up) -> None:
    await _pools(up)
    bearer = {name: {"authorization": f"Bearer {t}"} for name, t in up.made.items()}
    bearer["ops"] = {"authorization": f"Bearer {up.env['ROOST_API_TOKEN']}"}
    async with httpx.AsyncClient(base_url=up.controller, timeout=10) as http:
        task = {"payload": {"seconds": 0, "log": str(up.data.parent / "tasks.log")}}
        for headers, why in (({}, "none"), ({"authorization": "Basic eDp4"}, "not bearer"),
                             ({"authorization": "Bearer rpt_made-up"}, "unknown")):
            r = await http.post("/api/v1/pools/sec/tasks", json=task, headers=headers)
            assert r.status_code == 401 and "Bearer" in r.headers["www-authenticate"], why

        # Another pool's token: its pool and a missing one answer alike.
        theirs = await http.post("/api/v1/pools/sec/tasks", json=task, headers=bearer["other"])
        missing = await http.post("/api/v1/pools/nope/tasks", json=task,
                                  headers=bearer["other"])
        assert theirs.status_code == missing.status_code == 404
        assert theirs.json()["title"] == missing.json()["title"] == "Unknown pool"

        r = await http.post("/api/v1/pools/sec/tasks", json=task, headers=bearer["sec"])
        assert r.status_code == 201, r.text
        tid = r.json()["id"]
        seen = await http.get(f"/api/v1/tasks/{tid}", headers=bearer["other"])
        ghost = await http.get("/api/v1/tasks/t-" + "0" * 32, headers=bearer["other"])
        assert seen.status_code == ghost.status_code == 404
        assert seen.json()["title"] == ghost.json()["title"] == "Unknown task"
        seen = await http.get(f"/api/v1/tasks/{tid}", headers=bearer["ops"])
        assert seen.status_code == 200

        # Enumeration: database ids are not task ids, and random ones name nothing.
        guesses = [*map(str, range(1, 21)), *(f"t-{os.urandom(16).hex()}" for _ in range(20))]
        for guess in guesses:
            r = await http.get(f"/api/v1/tasks/{guess}", headers=bearer["ops"])
            assert r.status_code in (400, 404), (guess, r.text)

        await _succeeded(http, tid, bearer["sec"])
        # The worker that ran it enrolled: its instance is in the table, once.
        db = await open_db(up.env["ROOST_DSN"])
        try:
            enrolled = await db.fetchval("SELECT count(*) FROM worker_enrollments "
                                         "WHERE pool_id = 'sec'")
        finally:
            await db.close()
        assert enrolled >= 1


def _secrets(up: Up) -> dict[str, str]:
    pg = up.data / "postgres"
    found = {
        "postgres superuser": (pg / "superuser.password").read_text().strip(),
        "postgres worker role": (pg / "worker.password").read_text().strip(),
        "operator API token": up.env["ROOST_API_TOKEN"],
        "AWS secret key": up.env["AWS_SECRET_ACCESS_KEY"],
        **{f"API token {k}": v for k, v in up.made.items()},
    }
    for creds in (up.data / "nats-auth").glob("*.creds.json"):
        found[f"NATS {creds.name}"] = json.loads(creds.read_text())["password"]
    return found


# Where secrets are kept on purpose, all 0600: nothing else may hold one.
_KEPT = {"env", "credentials.json", "superuser.password", "worker.password", "api-token"}


async def test_no_secret_in_user_data_buckets_node_state_or_logs(up: Up) -> None:
    # A worker the native pool launched, so that its user data is among what is read.
    await _pools(up)
    sec = {"authorization": f"Bearer {up.made['sec']}"}
    async with httpx.AsyncClient(base_url=up.controller, timeout=10) as http:
        r = await http.post("/api/v1/pools/sec/tasks", headers=sec, json={
            "payload": {"seconds": 0, "log": str(up.data.parent / "tasks.log")}})
        assert r.status_code == 201, r.text
        await _succeeded(http, r.json()["id"], sec)
    secrets = _secrets(up)
    assert all(len(v) >= 16 for v in secrets.values()), secrets.keys()

    # User data, as any caller with a key reads it.
    ec2 = boto3.client("ec2", endpoint_url=up.env["AWS_ENDPOINT_URL_EC2"],
                       region_name=up.env["AWS_DEFAULT_REGION"],
                       aws_access_key_id=up.env["AWS_ACCESS_KEY_ID"],
                       aws_secret_access_key=up.env["AWS_SECRET_ACCESS_KEY"])
    ids = [i["InstanceId"] for r in ec2.describe_instances()["Reservations"]
           for i in r["Instances"]]
    assert ids, "the native pool launched no worker"
    blobs: dict[str, bytes] = {}
    for iid in ids:
        value = ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")[
            "UserData"].get("Value", "")
        blobs[f"user data of {iid}"] = base64.b64decode(value)

    # Every KV bucket, read as the admin user.
    nc = await nats.connect(up.nats_url, **up.nats_auth("admin").options())
    try:
        js = nc.jetstream()
        for info in await js.streams_info():
            name = info.config.name
            if not name.startswith("KV_"):
                continue
            kv = await js.key_value(name.removeprefix("KV_"))
            for key, value in (await live_entries(kv, timeout=30)).items():
                blobs[f"bucket {name}:{key}"] = key.encode() + b"=" + value
    finally:
        await nc.close()
    assert any(k.startswith("bucket KV_roost_user_data") for k in blobs), list(blobs)

    # Every file of the run (logs, node state, JetStream's own files), and its output,
    # but those that keep secrets on purpose and Postgres's data files.
    for path in up.data.rglob("*"):
        if path.is_file() and path.name not in _KEPT and "pgdata" not in path.parts \
                and path.parent.name != "nats-auth":
            blobs[str(path.relative_to(up.data))] = path.read_bytes()
    output = up.log.read_bytes()
    # The banner prints the access key pair for pasting, as EC2's console shows a new
    # key's secret once; nothing else of the output may hold a secret.
    blobs["roost up output"] = b"\n".join(
        line for line in output.splitlines()
        if b"secret key" not in line and b"AWS_SECRET_ACCESS_KEY=" not in line)
    assert len(output) > 10_000  # DEBUG logs of the whole run, not an empty file

    leaks = [f"{what} in {where}" for where, blob in blobs.items()
             for what, secret in secrets.items() if secret.encode() in blob]
    assert not leaks, leaks
