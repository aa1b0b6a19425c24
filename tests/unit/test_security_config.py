"""The pure parts of roost's access control: NATS credentials files and the permissions
`roost up` writes, DSNs rewritten for the worker role or redacted for the banner."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from roost.bus.auth import ClusterAuth, NatsAuth, node_permissions
from roost.bus.options import nats_auth_command
from roost.store.roles import dsn_as
from roost.up.cli import banner, redact_dsn
from roost.up.cluster import ClusterSpec


def test_credentials_files_round_trip_and_bad_ones_say_why(tmp_path: Path) -> None:
    auth = NatsAuth(user="node-1", password="pw", tls_ca="/ca.pem")
    path = tmp_path / "c.json"
    auth.dump(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert NatsAuth.load(path) == auth
    assert "pw" not in repr(auth)
    opts = NatsAuth(user="node-1", password="pw").options()
    assert (opts["user"], opts["password"], opts["inbox_prefix"]) == ("node-1", "pw",
                                                                       "_INBOX.node-1")
    jwt = tmp_path / "u.creds"
    jwt.write_text("-----BEGIN NATS USER JWT-----\neyJ0\n------END NATS USER JWT------\n")
    assert NatsAuth.load(jwt).options()["user_credentials"] == str(jwt)
    for text in ("nope", '{"user": 1}', '{"user": "a", "pasword": "typo"}', "[]"):
        path.write_text(text)
        with pytest.raises(ValueError, match=str(path)):
            NatsAuth.load(path)


def test_a_node_gets_its_own_subjects_and_bucket_only() -> None:
    perms = node_permissions("node-1")
    pub, sub = perms["publish"]["allow"], perms["subscribe"]["allow"]
    assert "roost.capacity.node-1" in pub and "$KV.roost_instances.>" in pub
    assert not [s for s in pub if s.startswith("roost.node.")], "it could command nodes"
    assert not [s for s in pub + sub if "node-2" in s or "roost_user_data" in s
                or "roost_accounts" in s or s in (">", "$JS.API.>", "$KV.>")]
    assert {"roost.node.node-1.command", "roost.node.node-1.launch", "_INBOX.node-1.>",
            "roost.node.node-1.lookup",
            "ec2.RunInstances.> roost-nodes"} <= set(sub)
    assert perms["allow_responses"] is True


def test_cluster_auth_writes_a_server_config_and_private_files(tmp_path: Path) -> None:
    auth = ClusterAuth.generate(["node-1", "node-2"])
    conf = auth.write(tmp_path / "auth")
    assert stat.S_IMODE((tmp_path / "auth").stat().st_mode) == 0o700
    body = json.loads(conf.read_text().removeprefix("authorization "))
    users = {u["user"]: u for u in body["users"]}
    assert set(users) == {"admin", "gateway", "node-1", "node-2"}
    assert len({u["password"] for u in users.values()}) == 4  # one each, all different
    for name in users:
        f = tmp_path / "auth" / f"{name}.creds.json"
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
        assert NatsAuth.load(f) == auth.auth(name)
    assert auth.node("node-2").user == "node-2"


def test_roost_nats_auth_writes_users_for_a_cluster_run_by_hand(tmp_path: Path) -> None:
    out = tmp_path / "auth"
    done = CliRunner().invoke(nats_auth_command, ["gpu-a", "node-b", "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert {p.name for p in out.iterdir()} == {
        "nats.conf", "admin.creds.json", "gateway.creds.json", "node-gpu-a.creds.json",
        "node-b.creds.json"}
    assert NatsAuth.load(out / "node-gpu-a.creds.json").user == "node-gpu-a"
    for bad_ids, why in ((["no.dots"], "node id"), (["a", "node-a"], "share a NATS user")):
        bad = CliRunner().invoke(nats_auth_command, [*bad_ids, "--out", str(out)])
        assert bad.exit_code == 2 and why in bad.output, bad.output


def test_dsns_are_rewritten_for_the_worker_and_redacted_for_the_banner() -> None:
    assert dsn_as("postgresql://postgres:x@db:5433/roost?sslmode=require", "roost_worker",
                  "p/w@1") == ("postgresql://roost_worker:p%2Fw%401@db:5433/roost"
                               "?sslmode=require")
    with pytest.raises(ValueError):
        dsn_as("host=db user=x", "roost_worker", "p")
    assert redact_dsn("postgresql://postgres:s3cret@127.0.0.1:5432/postgres") == (
        "postgresql://postgres:***@127.0.0.1:5432/postgres")
    assert redact_dsn("postgresql://postgres@h/d") == "postgresql://postgres@h/d"


def test_the_banner_shows_where_secrets_are_not_what(tmp_path: Path) -> None:
    spec = ClusterSpec(data_dir=tmp_path, credentials={"AKIAX": "s"})
    text = banner(spec, endpoint="http://127.0.0.1:8773", nats_url="nats://127.0.0.1:4222",
                  key="AKIAX", secret="s", controller_url="http://127.0.0.1:9180",
                  dsn="postgresql://postgres:pg-s3cret-pw@127.0.0.1:5432/postgres",
                  env_file=tmp_path / "env")
    assert "pg-s3cret-pw" not in text and "postgres:***@" in text
    assert f"source {tmp_path / 'env'}" in text and "$ROOST_API_TOKEN" in text
    assert "users and permissions" in text
    open_nats = banner(ClusterSpec(data_dir=tmp_path, nats_auth=False), endpoint="e",
                       nats_url="nats://x", key="k", secret="s")
    assert "OPEN" in open_nats
