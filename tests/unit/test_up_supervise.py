"""`roost up`'s supervisor: a component that died is restarted with a bounded backoff,
a restart that fails is tried again later, and every step is said."""

from __future__ import annotations

import asyncio

from roost.up.supervise import Supervisor
from tests.polling import until


class Flaky:
    name = "postgres"

    def __init__(self, fail_starts: int) -> None:
        self.dead = False
        self.fail_starts = fail_starts
        self.starts = self.stops = 0

    def exited(self) -> str | None:
        return "was killed by SIGKILL" if self.dead else None

    async def start(self) -> None:
        self.starts += 1
        if self.fail_starts:
            self.fail_starts -= 1
            raise RuntimeError("lock file busy")
        self.dead = False

    async def stop(self) -> None:
        self.stops += 1


def test_the_backoff_doubles_up_to_its_bound() -> None:
    s = Supervisor([], say=print, first_delay=1, max_delay=30)
    assert [s.delay(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


async def test_a_dead_component_is_restarted_after_failed_tries_and_it_is_said() -> None:
    said: list[str] = []
    comp = Flaky(fail_starts=2)
    sup = Supervisor([comp, object()], say=said.append, check_every=0.001,
                     first_delay=0.001, max_delay=0.004)
    stop = asyncio.Event()
    task = asyncio.create_task(sup.run(stop))
    comp.dead = True
    await until("postgres restarted", lambda: sup.restarts.get("postgres"), timeout=5,
                interval=0.005)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert comp.starts == 3 and not comp.dead and sup.restarts == {"postgres": 1}
    assert said[0] == ("roost up: postgres was killed by SIGKILL; restarting it in 0.001s "
                       "(attempt 1)")
    assert "restarting postgres failed: lock file busy; will retry" in said[1]
    assert "(attempt 3)" in said[4] and said[-1] == "roost up: postgres is back"


async def test_a_stop_ends_the_wait_before_a_restart() -> None:
    comp = Flaky(fail_starts=0)
    comp.dead = True
    sup = Supervisor([comp], say=lambda m: None, first_delay=60)
    stop = asyncio.Event()
    task = asyncio.create_task(sup.run(stop))
    await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 1)
    assert comp.starts == 0
