"""The pure parts of roost's access control: NATS credentials files and the permissions
`roost up` writes, DSNs rewritten for the worker role or redacted for the banner."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from roost.bus.auth import ClusterAuth, NatsAuth, node_permissions
from roost.store.roles import dsn_as
from roost.up.cli import redact_dsn


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


def test_dsns_are_rewritten_for_the_worker_and_redacted_for_the_banner() -> None:
    assert dsn_as("postgresql://postgres:x@db:5433/roost?sslmode=require", "roost_worker",
                  "p/w@1") == ("postgresql://roost_worker:p%2Fw%401@db:5433/roost"
                               "?sslmode=require")
    with pytest.raises(ValueError):
        dsn_as("host=db user=x", "roost_worker", "p")
    assert redact_dsn("postgresql://postgres:s3cret@127.0.0.1:5432/postgres") == (
        "postgresql://postgres:***@127.0.0.1:5432/postgres")
    assert redact_dsn("postgresql://postgres@h/d") == "postgresql://postgres@h/d"
