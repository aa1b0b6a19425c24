"""The node's side of the instance metadata service: what each instance is told about
itself, and how a caller is recognised.

The service (`roost.node.imds`) asks two questions of the node:
- who is calling? The socket's owner, found from kernel facts (the pids of each
  instance, from its cgroup), never from anything the caller sends;
- what does that instance see? Its record and user data, as the node holds them now.

The port is kept in the node's data directory, so instances re-adopted after an agent
restart still reach the endpoint they were given at start.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path

from roost.bus.schemas import InstanceRecord
from roost.domain.lifecycle import InstanceState
from roost.domain.network import public_dns_name
from roost.node.drivers import InstanceDriver
from roost.node.imds import InstanceMetadata, MetadataServer
from roost.node.peers import resolver_by_groups
from roost.node.state import NodeState

log = logging.getLogger(__name__)

ENDPOINT_ENV = "AWS_EC2_METADATA_SERVICE_ENDPOINT"
"""Read by botocore and the AWS CLI inside the instance: where IMDS is."""


def region_of(zone: str) -> str:
    """EC2's zone names are the region plus one letter (``us-east-1a``)."""
    return re.sub(r"[a-z]$", "", zone) or zone


def metadata_for(rec: InstanceRecord, user_data: str | None) -> InstanceMetadata:
    opts = rec.opts
    host = f"ip-{rec.private_ip.replace('.', '-')}.roost.internal" if rec.private_ip else (
        f"{rec.instance_id}.roost.internal")
    return InstanceMetadata(
        instance_id=rec.instance_id, instance_type=rec.instance_type, image_id=rec.image_id,
        availability_zone=rec.availability_zone, region=region_of(rec.availability_zone),
        reservation_id=rec.reservation_id, ami_launch_index=rec.ami_launch_index,
        launch_time=rec.launch_time, account_id=rec.owner_id or "000000000000",
        local_hostname=host, local_ipv4=rec.private_ip, tags=dict(rec.tags),
        public_ipv4=rec.shown_public_ip, public_hostname=public_dns_name(rec.shown_public_ip),
        user_data=user_data.encode() if user_data else None,
        http_tokens=opts.http_tokens, http_endpoint=opts.http_endpoint,
        instance_metadata_tags=opts.instance_metadata_tags,
        public_keys={rec.net.key_name: rec.net.public_key} if rec.net.public_key else {},
    )


class NodeMetadata:
    """Runs the metadata service for one node agent."""

    def __init__(self, *, records: Mapping[str, InstanceRecord], state: NodeState,
                 driver: InstanceDriver, data_dir: Path, port: int) -> None:
        self._records = records
        self._state = state
        self._driver = driver
        self._port_file = data_dir / "imds-port"
        self._port = port
        self._server: MetadataServer | None = None

    @property
    def endpoint(self) -> str:
        return self._server.endpoint if self._server is not None else ""

    def _lookup(self, instance_id: str) -> InstanceMetadata | None:
        rec = self._records.get(instance_id)
        if rec is None or not InstanceState(rec.state).holds_capacity:
            return None
        stored = self._state.get(instance_id)
        return metadata_for(rec, stored.user_data if stored else None)

    def _groups(self) -> dict[str, set[int]]:
        # Runs in the metadata service's worker thread: iterate a copy of the records.
        return {iid: self._driver.pids(iid) for iid, rec in list(self._records.items())
                if InstanceState(rec.state).holds_capacity}

    def _secret(self) -> bytes:
        """The key that signs IMDSv2 tokens, kept (0600) so tokens outlive a restart."""
        path = self._port_file.with_name("imds-secret")
        try:
            return bytes.fromhex(path.read_text().strip())
        except (FileNotFoundError, ValueError):
            secret = secrets.token_bytes(32)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secret.hex())
            return secret

    async def start(self) -> None:
        port = self._port or self._saved_port()
        resolve = resolver_by_groups(self._groups, "127.0.0.1", 0)
        secret = self._secret()
        server = MetadataServer(self._lookup, resolve, port=port, secret=secret)
        try:
            await server.start()
        except OSError as exc:
            if not port or self._port:
                raise
            log.warning("metadata port %d is taken (%s); picking another: instances "
                        "started before this restart lose their metadata service", port, exc)
            server = MetadataServer(self._lookup, resolve, port=0, secret=secret)
            await server.start()
        self._port_file.write_text(f"{server.port}\n")
        self._server = server

    def _saved_port(self) -> int:
        try:
            return int(self._port_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return 0

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop()
            self._server = None
