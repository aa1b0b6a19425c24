"""A port found free can be taken before nats-server binds it: the embedded servers
pick fresh ports and start again rather than fail (once a CI failure)."""

from __future__ import annotations

import socket
from pathlib import Path

from roost.embedded import NatsCluster, NatsServer
from roost.embedded.proc import port_open


def _occupy(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def test_a_server_whose_port_was_taken_starts_on_another(tmp_path: Path) -> None:
    server = NatsServer(base_dir=tmp_path, jetstream=False)
    taken = server.port
    with _occupy(taken):
        server.start()
        try:
            assert server.port != taken and port_open(server.port)
        finally:
            server.stop()


def test_a_cluster_whose_route_port_was_taken_forms_on_others(tmp_path: Path) -> None:
    cluster = NatsCluster(3, base_dir=tmp_path)
    taken = cluster.servers[1].cluster_port
    assert taken is not None
    with _occupy(taken):
        cluster.start()
        try:
            assert taken not in [s.cluster_port for s in cluster.servers]
            assert all(port_open(s.port) for s in cluster.servers)
        finally:
            cluster.stop()
