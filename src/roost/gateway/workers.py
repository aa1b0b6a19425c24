"""Several gateway processes on one port: ``roost gateway --workers N`` and `roost up`.

Each worker is a whole `Gateway` in a process of its own (``python -m
roost.gateway.workers``): its own NATS connection, capacity view and instance index, fed
by the same subscriptions and buckets as any other gateway. They share nothing in
memory; what must hold across them already lives outside a process:

- a ClientToken is claimed in the KV bucket, fenced by revision (`TokenStore`), so the
  same token raced through two workers yields one reservation and one instance;
- a launch id is the node's key: a repeat of it on any worker finds the same instance.

Every worker binds its own socket to the one port with ``SO_REUSEPORT``, and the kernel
spreads new connections over them. The pool itself holds the port with a socket it
binds but never listens on, so ``port=0`` resolves once and a restarted worker comes
back on the same port.

Metrics: the workers run prometheus-client's multiprocess mode on a directory of the
pool's, so a ``/metrics`` scrape of any worker answers the sum over all of them (a dead
worker's counts stay in). The learned placement workload (recent launch shapes) is per
worker: each learns from the launches it placed itself, which over many requests is the
same mix.

Supervision: a worker that exits is restarted after a backoff of 1, 2, 4 ... 30 s (reset
once it has stayed up a minute). Stopping the pool sends SIGTERM to each worker by pid
and waits for it (SIGKILL after ``grace`` seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from prometheus_client import CollectorRegistry

from roost.gateway.metrics import merged_registry
from roost.gateway.server import GatewayConfig, endpoint_url

log = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
READY = b"ready\n"
ORPHAN_GRACE = 15.0
"""Seconds a worker whose pool is gone drains before it exits regardless."""


def default_workers() -> int:
    """`roost up`'s gateway processes: one per core, less one core for the nodes and
    NATS that run beside them, between 1 and 2. On two cores that is 1: measured side by
    side there, a second process added work without adding throughput
    (docs/benchmarks.md)."""
    return max(1, min(2, (os.cpu_count() or 1) - 1))


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) with SO_REUSEPORT, not listening."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    attempts: int = 0
    up_since: float = 0.0
    restarts: int = 0


class GatewayPool:
    """N gateway worker processes on one port, supervised."""

    def __init__(self, config: GatewayConfig, workers: int, *, grace: float = 10.0,
                 start_timeout: float = 60.0, first_delay: float = 1.0,
                 max_delay: float = 30.0, healthy_after: float = 60.0) -> None:
        if workers < 1:
            raise ValueError("a gateway pool needs at least one worker")
        config.check()
        self.config = config
        self.grace, self.start_timeout = grace, start_timeout
        self.first_delay, self.max_delay, self.healthy_after = (first_delay, max_delay,
                                                                healthy_after)
        self._workers = [_Worker(i) for i in range(workers)]
        self._holder: socket.socket | None = None
        self._metrics_dir: Path | None = None

    @property
    def port(self) -> int:
        if self._holder is None:
            raise RuntimeError("the gateway pool is not started")
        return int(self._holder.getsockname()[1])

    @property
    def endpoint(self) -> str:
        return endpoint_url(self.config.host, self.port)

    @property
    def workers(self) -> int:
        return len(self._workers)

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers if w.proc is not None and
                w.proc.poll() is None]

    @property
    def restarts(self) -> int:
        return sum(w.restarts for w in self._workers)

    def metrics_registry(self) -> CollectorRegistry:
        """The workers' metrics summed, for a reader in this process (the dashboard)."""
        if self._metrics_dir is None:
            return CollectorRegistry()
        return merged_registry(str(self._metrics_dir))

    async def start(self) -> None:
        self._holder = reuse_port_socket(self.config.host, self.config.port)
        self._metrics_dir = Path(tempfile.mkdtemp(prefix="roost-gateway-metrics-"))
        try:
            await asyncio.gather(*(self._spawn(w) for w in self._workers))
        except BaseException:
            await self.stop()
            raise
        log.info("gateway pool of %d workers serving on %s", len(self._workers),
                 self.endpoint)

    def _popen(self, w: _Worker) -> subprocess.Popen[bytes]:
        assert self._metrics_dir is not None
        cfg = replace(self.config, port=self.port, reuse_port=True,
                      address_stripe=(w.index, len(self._workers)))
        env = {**os.environ, MULTIPROC_ENV: str(self._metrics_dir)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "roost.gateway.workers", str(w.index),
             logging.getLevelName(logging.getLogger().getEffectiveLevel())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
            # Its own session: a terminal's Ctrl-C reaches this process only, which
            # then stops every worker by pid, in order.
            start_new_session=True,
        )
        assert proc.stdin is not None
        # The config, then the pipe stays open: the worker stops when it closes, so
        # no worker outlives a pool that was killed outright.
        proc.stdin.write(pickle.dumps(cfg))
        proc.stdin.flush()
        return proc

    async def _spawn(self, w: _Worker) -> None:
        w.proc = proc = self._popen(w)
        assert proc.stdout is not None
        loop = asyncio.get_running_loop()
        stdout = proc.stdout
        try:
            line = await asyncio.wait_for(loop.run_in_executor(None, stdout.readline),
                                          self.start_timeout)
        except TimeoutError:
            self._end(proc)
            raise RuntimeError(f"gateway worker {w.index} did not start in "
                               f"{self.start_timeout:g} s") from None
        if line != READY:
            self._end(proc)
            raise RuntimeError(f"gateway worker {w.index} exited while starting "
                               f"(code {proc.returncode})")
        w.up_since = time.monotonic()

    def exited(self) -> str | None:
        """None: the pool runs (its own restarts included)."""
        return None

    async def supervise(self, stop: asyncio.Event, *, every: float = 0.5) -> None:
        """Restart workers that exit, until ``stop``."""
        while not stop.is_set():
            for w in self._workers:
                if stop.is_set():
                    return
                if w.proc is not None and w.proc.poll() is not None:
                    await self._restart(w, stop)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every)

    async def _restart(self, w: _Worker, stop: asyncio.Event) -> None:
        assert w.proc is not None
        code = w.proc.returncode
        if time.monotonic() - w.up_since >= self.healthy_after:
            w.attempts = 0
        w.attempts += 1
        delay = min(self.max_delay, self.first_delay * 2 ** (w.attempts - 1))
        log.warning("gateway worker %d (pid %d) exited with %s; restarting it in %g s",
                    w.index, w.proc.pid, code, delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        if stop.is_set():
            return
        try:
            await self._spawn(w)
        except RuntimeError as exc:
            log.warning("restarting gateway worker %d failed: %s; will retry", w.index, exc)
            return
        w.restarts += 1
        log.warning("gateway worker %d is back (pid %d)", w.index, w.proc.pid)

    def _end(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(self.grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    async def stop(self) -> None:
        """SIGTERM every worker by pid (they drain in parallel), then wait for each."""
        procs = [w.proc for w in self._workers if w.proc is not None]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, self._end, p) for p in procs))
        for w in self._workers:
            w.proc = None
        if self._holder is not None:
            self._holder.close()
            self._holder = None
        if self._metrics_dir is not None:
            shutil.rmtree(self._metrics_dir, ignore_errors=True)
            self._metrics_dir = None


def _worker_main(index: int, level: str) -> None:
    """One worker: read the config from stdin, serve until SIGTERM/SIGINT."""
    import threading

    import click

    from roost.gateway.cli import run_gateway
    from roost.gateway.server import Gateway

    config: GatewayConfig = pickle.load(sys.stdin.buffer)

    def orphaned() -> None:
        while os.read(0, 4096):  # until the pool closes the pipe, or dies
            pass
        os.kill(os.getpid(), signal.SIGTERM)
        # A pool killed outright waits for nobody: bound the drain (a stop can hang on
        # a NATS that went away with the pool).
        time.sleep(ORPHAN_GRACE)
        os._exit(1)

    threading.Thread(target=orphaned, daemon=True, name="pool-watch").start()
    logging.basicConfig(level=level, format=f"%(asctime)s %(levelname)s gw{index} "
                        "%(name)s: %(message)s")
    # The pool reads one line from stdout; anything else printed goes to stderr.
    ready = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)

    def started() -> None:
        ready.write(READY)
        ready.close()

    try:
        run_gateway(Gateway(config), on_ready=started, quiet=True)
    except click.ClickException as exc:
        exc.show()
        sys.exit(1)


if __name__ == "__main__":
    _worker_main(int(sys.argv[1]), sys.argv[2])
