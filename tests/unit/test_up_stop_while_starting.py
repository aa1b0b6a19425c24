"""`roost up` stopped while it is still starting: the component starting now finishes,
no further one starts, and those started stop in reverse order.

The components here are stand-ins that record calls: what is under test is the order
`LocalCluster` and `run_until` impose, not NATS or Postgres (tests/e2e start those).
"""

from __future__ import annotations

import asyncio

import pytest

from roost.up.cli import run_until
from roost.up.cluster import LocalCluster


class Recorder:
    def __init__(self, name: str, log: list[str], *, start_for: float = 0.0,
                 started: asyncio.Event | None = None) -> None:
        self.name, self.log, self.start_for, self.started = name, log, start_for, started

    async def start(self) -> None:
        self.log.append(f"start {self.name}")
        if self.started is not None:
            self.started.set()
        await asyncio.sleep(self.start_for)
        self.log.append(f"up {self.name}")

    async def stop(self) -> None:
        self.log.append(f"stop {self.name}")


async def stop_once_started(cluster: LocalCluster, started: asyncio.Event) -> list[str]:
    """Run ``cluster`` and press Ctrl-C as soon as ``started`` is set; what was
    announced as ready (nothing, if the stop is honoured)."""
    stop = asyncio.Event()
    ready: list[str] = []

    async def press_ctrl_c() -> None:
        await started.wait()
        stop.set()

    await asyncio.gather(run_until(cluster, lambda: ready.append("ready") or "", stop=stop),
                         press_ctrl_c())
    return ready


async def test_a_stop_while_starting_skips_the_rest_and_stops_what_started() -> None:
    log: list[str] = []
    slow_started = asyncio.Event()
    cluster = LocalCluster([Recorder("nats", log),
                            Recorder("postgres", log, start_for=0.3, started=slow_started),
                            Recorder("gateway", log)])
    ready = await stop_once_started(cluster, slow_started)
    assert log == ["start nats", "up nats", "start postgres", "up postgres",
                   "stop postgres", "stop nats"]
    assert ready == []  # never announced as ready


async def test_a_stop_after_start_stops_everything_in_reverse() -> None:
    log: list[str] = []
    stop = asyncio.Event()
    cluster = LocalCluster([Recorder("nats", log), Recorder("gateway", log)])

    def on_ready() -> str:
        stop.set()
        return "ready"

    await run_until(cluster, on_ready, stop=stop)
    assert log == ["start nats", "up nats", "start gateway", "up gateway",
                   "stop gateway", "stop nats"]


async def test_a_failed_start_stops_what_started_and_raises() -> None:
    log: list[str] = []

    class Broken(Recorder):
        async def start(self) -> None:
            raise OSError("port in use")

    cluster = LocalCluster([Recorder("nats", log), Broken("gateway", log)])
    with pytest.raises(OSError, match="port in use"):
        await run_until(cluster, lambda: "ready", stop=asyncio.Event())
    assert log == ["start nats", "up nats", "stop nats"]


async def test_a_stop_while_the_last_component_starts_never_announces_ready() -> None:
    log: list[str] = []
    last_started = asyncio.Event()
    cluster = LocalCluster([Recorder("nats", log),
                            Recorder("controller", log, start_for=0.3, started=last_started)])
    ready = await stop_once_started(cluster, last_started)
    assert ready == []
    assert log[-2:] == ["stop controller", "stop nats"]


async def test_cancelled_while_starting_it_still_stops_what_the_start_finished() -> None:
    log: list[str] = []
    slow_started = asyncio.Event()
    cluster = LocalCluster([Recorder("nats", log),
                            Recorder("postgres", log, start_for=0.3, started=slow_started),
                            Recorder("gateway", log)])
    job = asyncio.ensure_future(run_until(cluster, lambda: "ready", stop=asyncio.Event()))
    await slow_started.wait()
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    assert log == ["start nats", "up nats", "start postgres", "up postgres",
                   "stop postgres", "stop nats"]
