"""NATS users and permissions: who may publish and subscribe to what.

`roost up` (and an operator, with `server_config`) gives each kind of component a user
of its own, with only the subjects and KV buckets it needs:

- **node** ``node-<id>``: its own ``roost.node.<id>.{launch,command,drain,lookup}`` subjects,
  the fan-out subjects every node answers (``ec2.RunInstances.>`` in the node queue
  group, ``ec2.DescribeInstanceTypes``, ``roost.launch.lookup``), replies to what it
  receives, publishing its own ``roost.capacity.<id>``, and the ``roost_instances``
  bucket. No other bucket: not user data, not client tokens, not accounts. It cannot
  publish to any ``roost.node.*`` subject, so it cannot command another node.
- **gateway**: the request side of the subjects above, ``roost.capacity.*``, and every
  KV bucket (it serves all of them to EC2 callers).
- **admin**: everything. For the CLI (``roost node drain``), the dashboard and
  operator tools.

Each user's replies come to its own inbox prefix (``_INBOX.<user>``), so no user can
subscribe to the replies meant for another. What NATS permissions cannot express is in
docs/security.md: a node may write any key of ``roost_instances`` (keys are instance
ids, not node-scoped), and JetStream's API is granted per stream, not per key.

Credentials reach a component as a file (``--nats-creds FILE`` or ``ROOST_NATS_CREDS``):
either JSON ``{"user": ..., "password": ...}`` (optionally ``tls_ca``, ``tls_cert``,
``tls_key``), written 0600 by `roost up`, or a NATS ``.creds`` file (JWT and nkey seed).
"""

from __future__ import annotations

import json
import os
import secrets
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roost.bus import subjects

ENV = "ROOST_NATS_CREDS"
_JWT_MARK = "-----BEGIN NATS USER JWT-----"


@dataclass(frozen=True, slots=True)
class NatsAuth:
    """How one client authenticates to NATS, and the TLS it uses (all optional)."""

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    creds_file: str | None = None
    """A NATS ``.creds`` file (decentralized JWT auth), passed to nats-py as is."""
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    @classmethod
    def load(cls, path: str | Path) -> NatsAuth:
        """Read a credentials file; ValueError naming what is wrong with it."""
        p = Path(path)
        text = p.read_text()
        if _JWT_MARK in text:
            return cls(creds_file=str(p))
        try:
            doc = json.loads(text)
        except ValueError:
            raise ValueError(f"{p}: neither JSON credentials nor a NATS .creds file") from None
        known = {"user", "password", "tls_ca", "tls_cert", "tls_key"}
        if not isinstance(doc, dict) or set(doc) - known or not all(
                isinstance(v, str) for v in doc.values()):
            raise ValueError(f"{p}: want a JSON object with string fields among "
                             f"{', '.join(sorted(known))}")
        return cls(**doc)

    @classmethod
    def from_env(cls, path: str | Path | None = None) -> NatsAuth | None:
        """The file named by ``path``, else by ``ROOST_NATS_CREDS``, else None."""
        chosen = path or os.environ.get(ENV)
        return cls.load(chosen) if chosen else None

    @property
    def inbox_prefix(self) -> str:
        """Where this user's replies arrive; its permissions allow only this one."""
        return f"_INBOX.{self.user}" if self.user else "_INBOX"

    def options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect``."""
        opts: dict[str, Any] = {"inbox_prefix": self.inbox_prefix}
        if self.user is not None:
            opts["user"], opts["password"] = self.user, self.password or ""
        if self.creds_file is not None:
            opts["user_credentials"] = self.creds_file
        if self.tls_ca or self.tls_cert:
            ctx = ssl.create_default_context(cafile=self.tls_ca)
            if self.tls_cert:
                ctx.load_cert_chain(self.tls_cert, self.tls_key)
            opts["tls"] = ctx
        return opts

    def dump(self, path: Path) -> None:
        """Write as a JSON credentials file, 0600 from the start."""
        doc = {k: v for k in ("user", "password", "tls_ca", "tls_cert", "tls_key")
               if (v := getattr(self, k)) is not None}
        _write_private(path, json.dumps(doc))


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    path.chmod(0o600)


# ---- permissions ------------------------------------------------------------------------

Permissions = dict[str, Any]


def kv_access(bucket: str, *, write: bool = True) -> list[str]:
    """The publish subjects a client needs to open, read, watch and (with ``write``)
    update one KV bucket. JetStream's API names the stream (``KV_<bucket>``) in each
    subject, so a grant stops at the bucket."""
    stream = f"KV_{bucket}"
    subs = [
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.STREAM.CREATE.{stream}",  # the first to start makes the bucket
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.>",
        f"$JS.API.CONSUMER.CREATE.{stream}",
        f"$JS.API.CONSUMER.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.DELETE.{stream}.>",
        f"$JS.API.CONSUMER.INFO.{stream}.>",
    ]
    if write:
        subs.append(f"$KV.{bucket}.>")
    return subs


_JS_COMMON = ["$JS.API.INFO", "$JS.FC.>"]
"""Account info (nats-py asks on open), and flow-control replies of ordered consumers."""


def node_permissions(node_id: str) -> Permissions:
    subjects.check_node_id(node_id)
    user = node_user(node_id)
    return {
        "publish": {"allow": [
            subjects.capacity(node_id), *_JS_COMMON, *kv_access(subjects.INSTANCES_BUCKET),
            # Its own orders (deferred terminates, docs/architecture.md "Lost nodes"):
            # read them, and delete each once carried out; no other node's.
            *kv_access(subjects.NODE_ORDERS_BUCKET, write=False),
            f"$KV.{subjects.NODE_ORDERS_BUCKET}.{subjects.node_orders(node_id)}",
        ]},
        "subscribe": {"allow": [
            subjects.node_launch(node_id), subjects.node_command(node_id),
            subjects.node_drain(node_id), subjects.node_lookup(node_id),
            subjects.DESCRIBE_INSTANCE_TYPES,
            subjects.LAUNCH_LOOKUP, f"{subjects.run_instances('>')} {subjects.NODE_QUEUE}",
            f"_INBOX.{user}.>",
        ]},
        "allow_responses": True,
    }


def gateway_permissions(user: str = "gateway") -> Permissions:
    return {
        "publish": {"allow": [
            subjects.run_instances(">"), subjects.DESCRIBE_INSTANCE_TYPES,
            subjects.LAUNCH_LOOKUP, subjects.node_launch("*"), subjects.node_command("*"),
            subjects.node_lookup("*"),
            "$JS.API.>", "$KV.>", "$JS.FC.>",
        ]},
        "subscribe": {"allow": [subjects.CAPACITY_ALL, f"_INBOX.{user}.>",
                                "$JS.EVENT.ADVISORY.STREAM.CREATED.*"]},
    }


ADMIN_PERMISSIONS: Permissions = {"publish": {"allow": [">"]},
                                  "subscribe": {"allow": [">"]}}


def node_user(node_id: str) -> str:
    """A node's NATS user: ``node-<id>``, or the id itself when it starts so already
    (`roost up`'s nodes are ``node-1``, ``node-2``, ...)."""
    return node_id if node_id.startswith("node-") else f"node-{node_id}"


@dataclass(frozen=True, slots=True)
class ClusterAuth:
    """A user with a fresh password for each component of a cluster."""

    users: Mapping[str, tuple[NatsAuth, Permissions]]

    @classmethod
    def generate(cls, node_ids: Iterable[str]) -> ClusterAuth:
        def made(user: str, perms: Permissions) -> tuple[str, tuple[NatsAuth, Permissions]]:
            return user, (NatsAuth(user=user, password=secrets.token_urlsafe(24)), perms)

        users = [made("admin", ADMIN_PERMISSIONS), made("gateway", gateway_permissions()),
                 *(made(node_user(n), node_permissions(n)) for n in node_ids)]
        names = [u for u, _ in users]
        clash = sorted({u for u in names if names.count(u) > 1})
        if clash:
            raise ValueError(f"node ids that would share a NATS user: {', '.join(clash)}")
        return cls(dict(users))

    def auth(self, user: str) -> NatsAuth:
        return self.users[user][0]

    def node(self, node_id: str) -> NatsAuth:
        return self.auth(node_user(node_id))

    def server_config(self) -> str:
        """The ``authorization`` block of a nats-server config (JSON is valid there)."""
        users = [{"user": a.user, "password": a.password, "permissions": perms}
                 for a, perms in self.users.values()]
        return "authorization " + json.dumps({"users": users}, indent=2) + "\n"

    def write(self, directory: Path) -> Path:
        """``nats.conf`` and one ``<user>.creds.json`` per user, in a 0700 directory
        whose files are 0600; returns the config's path."""
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
        conf = directory / "nats.conf"
        _write_private(conf, self.server_config())
        for user, (auth, _) in self.users.items():
            auth.dump(directory / f"{user}.creds.json")
        return conf
