"""Instance drivers: what "running an instance" means on this node.

- `ProcessDriver`: the user data runs as a real child process in its own process group
  (its own session), so terminate can kill everything it started and an agent crash
  leaves it running for the restarted agent to re-adopt.
- `SimDriver`: nothing runs. For benchmarks and large simulated clusters.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from roost.domain.images import Image

ExitCallback = Callable[[str, int | None], Awaitable[None]]
"""Called with (instance id, exit code or None if unknown) when an instance's process
ends without being asked to."""


@dataclass(frozen=True, slots=True)
class ProcessRef:
    """Enough to find a process again after an agent restart, and to tell it from a
    later process that reused its pid."""

    pid: int
    start_ticks: int


@dataclass(frozen=True, slots=True)
class StartSpec:
    instance_id: str
    instance_type: str
    image: Image
    user_data: str
    workdir: Path


class InstanceDriver(Protocol):
    name: str

    async def start(self, spec: StartSpec, on_exit: ExitCallback) -> ProcessRef | None: ...

    async def stop(self, instance_id: str, *, grace: float) -> int | None:
        """Stop the instance (TERM, then KILL after ``grace``); its exit code if known."""
        ...

    def adopt(self, instance_id: str, ref: ProcessRef | None, on_exit: ExitCallback) -> bool:
        """Re-attach to an instance after an agent restart; False if it is gone."""
        ...

    async def close(self) -> None:
        """Stop watching (the agent is exiting). Instances keep running."""
        ...


class SimDriver:
    name = "sim"

    async def start(self, spec: StartSpec, on_exit: ExitCallback) -> ProcessRef | None:
        return None

    async def stop(self, instance_id: str, *, grace: float) -> int | None:
        return None

    def adopt(self, instance_id: str, ref: ProcessRef | None, on_exit: ExitCallback) -> bool:
        return True

    async def close(self) -> None:
        return None


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/pid/stat),
    or None if no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie has finished; its parent just hasn't reaped it
        return None
    return int(fields[19])


def alive(ref: ProcessRef) -> bool:
    return start_ticks(ref.pid) == ref.start_ticks


_IDLE = "exec sleep 2147483647\n"  # an instance with no user data idles, like a booted host


class ProcessDriver:
    name = "process"

    def __init__(self, *, poll_seconds: float = 0.5) -> None:
        self._poll = poll_seconds
        self._refs: dict[str, ProcessRef] = {}
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._stopping: set[str] = set()

    def _command(self, spec: StartSpec) -> list[str]:
        spec.workdir.mkdir(parents=True, exist_ok=True)
        script = spec.workdir / "user-data"
        script.write_text(spec.user_data or _IDLE)
        script.chmod(0o700)
        if spec.image.interpreter == "python" and spec.user_data:
            return [sys.executable, str(script)]
        if spec.user_data.startswith("#!"):
            return [str(script)]
        return ["/bin/sh", str(script)]

    async def start(self, spec: StartSpec, on_exit: ExitCallback) -> ProcessRef | None:
        env = dict(os.environ)
        env.update(ROOST_INSTANCE_ID=spec.instance_id, ROOST_INSTANCE_TYPE=spec.instance_type)
        command = self._command(spec)
        with (spec.workdir / "console.log").open("ab") as log:
            proc = await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.DEVNULL, stdout=log,
                stderr=log, cwd=spec.workdir, env=env, start_new_session=True,
            )
        ticks = start_ticks(proc.pid)
        ref = ProcessRef(proc.pid, ticks if ticks is not None else -1)
        self._refs[spec.instance_id] = ref
        self._watchers[spec.instance_id] = asyncio.create_task(
            self._wait_child(spec.instance_id, proc, on_exit)
        )
        return ref

    async def _wait_child(
        self, instance_id: str, proc: asyncio.subprocess.Process, on_exit: ExitCallback
    ) -> None:
        code = await proc.wait()
        await self._exited(instance_id, code, on_exit)

    async def _exited(self, instance_id: str, code: int | None, on_exit: ExitCallback) -> None:
        self._refs.pop(instance_id, None)
        self._watchers.pop(instance_id, None)
        if instance_id not in self._stopping:
            await on_exit(instance_id, code)

    def adopt(self, instance_id: str, ref: ProcessRef | None, on_exit: ExitCallback) -> bool:
        if ref is None or not alive(ref):
            return False
        self._refs[instance_id] = ref
        self._watchers[instance_id] = asyncio.create_task(
            self._poll_adopted(instance_id, ref, on_exit)
        )
        return True

    async def _poll_adopted(self, instance_id: str, ref: ProcessRef, on_exit: ExitCallback) -> None:
        # Not our child any more (the old agent was its parent), so we can't wait(2) on
        # it: poll /proc instead. Its exit code is lost with its old parent.
        while alive(ref):  # noqa: ASYNC110 - /proc offers no event to wait on
            await asyncio.sleep(self._poll)
        await self._exited(instance_id, None, on_exit)

    async def stop(self, instance_id: str, *, grace: float) -> int | None:
        ref = self._refs.get(instance_id)
        if ref is None or not alive(ref):
            return None
        self._stopping.add(instance_id)
        try:
            self._signal_group(ref, signal.SIGTERM)
            watcher = self._watchers.get(instance_id)
            if watcher is not None:
                try:
                    await asyncio.wait_for(asyncio.shield(watcher), grace)
                except TimeoutError:
                    self._signal_group(ref, signal.SIGKILL)
                    await watcher
            # The leader is gone; anything it left in its group goes with it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(ref.pid, signal.SIGKILL)
            return None
        finally:
            self._stopping.discard(instance_id)

    @staticmethod
    def _signal_group(ref: ProcessRef, sig: int) -> None:
        # The instance leads its own session and group (start_new_session), so its pid
        # is its group id; re-check identity first so a reused pid is never signalled.
        if alive(ref):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(ref.pid, sig)

    async def close(self) -> None:
        for task in list(self._watchers.values()):
            task.cancel()
        await asyncio.gather(*self._watchers.values(), return_exceptions=True)
        self._watchers.clear()


def make_driver(name: str) -> InstanceDriver:
    if name == "process":
        return ProcessDriver()
    if name == "sim":
        return SimDriver()
    raise ValueError(f"unknown driver {name!r}: expected 'process' or 'sim'")
