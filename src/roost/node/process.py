"""The ``process`` driver: an instance's user data runs as a real process on the host.

The process leads its own session, so an agent crash leaves it running for the restarted
agent to re-adopt. Where the node has cgroups (`roost.node.isolation`), the process
joins its instance's cgroup before any user code runs; stop and terminate then empty the
whole group (freeze, signal every pid, thaw; SIGKILL after the grace period), so a
double-forked daemon goes with it. Without cgroups the process group is all there is.

When the instance's main program ends by itself, the instance is off, as a machine whose
init exits: whatever it left running is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from roost.domain.catalog import InstanceType
from roost.domain.images import Image
from roost.node.cgroups import CgroupError, InstanceCgroup, Limits
from roost.node.drivers import (
    Exit,
    ExitCallback,
    ProcessRef,
    StartSpec,
    Unrunnable,
    Usage,
    alive,
    start_ticks,
)
from roost.node.isolation import Isolation, limits_for

log = logging.getLogger(__name__)

_IDLE = "exec sleep 2147483647\n"  # an instance with no user data idles, like a booted host
_LEFT_RUNNING: list[asyncio.subprocess.Process] = []
"""Handles of instances still running when their agent stopped. Instances outlive the
agent by design (the next one re-adopts them); a handle collected while its process
runs would only make asyncio warn, and closing it would kill the instance."""
_JOIN_SECONDS = 10.0
_KILL_ROUNDS = 200  # SIGKILL rounds, 50 ms apart, before a group that won't empty is reported


class ProcessDriver:
    name = "process"
    overhead_mib = 0

    def __init__(self, isolation: Isolation, *, poll_seconds: float = 0.5) -> None:
        self._iso = isolation
        self._poll = poll_seconds
        self._refs: dict[str, ProcessRef] = {}
        self._groups: dict[str, InstanceCgroup] = {}
        self._mem_mib: dict[str, int] = {}
        self._oom_base: dict[str, int] = {}
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._procs: dict[str, asyncio.subprocess.Process] = {}
        self._stopping: set[str] = set()

    @property
    def isolation(self) -> str:
        return self._iso.level

    @property
    def isolation_note(self) -> str:
        return self._iso.note

    # -- starting ------------------------------------------------------------------

    def limits(self, itype: InstanceType) -> Limits:
        """What the instance's cgroup holds it to: its type (a subclass that runs more
        than the instance's own program in the group adds room for that)."""
        return limits_for(itype)

    @property
    def cannot_launch(self) -> str:
        return ""

    def check_image(self, image: Image) -> None:
        """Raise `Unrunnable` if this driver cannot run ``image``: a registered image is
        a kernel or a disk to boot, which only the vm driver can."""
        if image.registered:
            raise Unrunnable(f"image {image.image_id} ({image.name}) boots a kernel or "
                             f"a disk: only a node with --driver vm runs it")

    def prepare(self, spec: StartSpec) -> None:
        self.check_image(spec.image)
        group = self._iso.group(spec.instance_id, spec.itype, limits=self.limits(spec.itype))
        if group is not None:
            self._groups[spec.instance_id] = group

    def _command(self, spec: StartSpec) -> list[str]:
        spec.workdir.mkdir(parents=True, exist_ok=True)
        spec.workdir.chmod(0o700)
        script = spec.workdir / "user-data"
        script.write_text(spec.user_data or _IDLE)
        script.chmod(0o700)
        if spec.image.interpreter == "python" and spec.user_data:
            return [sys.executable, str(script)]
        if spec.user_data.startswith("#!"):
            return [str(script)]
        return ["/bin/sh", str(script)]

    async def start(self, spec: StartSpec, on_exit: ExitCallback) -> ProcessRef | None:
        iid = spec.instance_id
        group = self._groups.get(iid) or self._iso.group(iid, spec.itype,
                                                         limits=self.limits(spec.itype))
        if group is not None:
            self._groups[iid] = group
            self._oom_base[iid] = group.usage().oom_kills
        self._mem_mib[iid] = spec.itype.mem_mib
        env = instance_environment(os.environ)
        env.update(spec.env)
        argv = self._iso.command(self._command(spec), group=group, workdir=spec.workdir)
        with (spec.workdir / "console.log").open("ab") as console:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=console, stderr=console,
                cwd=spec.workdir, env=env, start_new_session=True,
            )
        if group is not None:
            await _joined(group, proc)
        ticks = start_ticks(proc.pid)
        ref = ProcessRef(proc.pid, ticks if ticks is not None else -1)
        self._refs[iid] = ref
        self._procs[iid] = proc
        self._watchers[iid] = asyncio.create_task(self._wait_child(iid, proc, on_exit))
        return ref

    async def _wait_child(self, iid: str, proc: asyncio.subprocess.Process,
                          on_exit: ExitCallback) -> None:
        code = await proc.wait()
        if self._procs.get(iid) is proc:
            del self._procs[iid]
        await self._ended(iid, code, on_exit)

    async def _ended(self, iid: str, code: int | None, on_exit: ExitCallback) -> None:
        """The main program ended. Unless a stop is under way (it cleans up itself), the
        rest of the instance goes too, and the agent hears how it ended."""
        self._watchers.pop(iid, None)
        ref = self._refs.pop(iid, None)
        if iid in self._stopping:
            return
        group = self._groups.pop(iid, None)
        base, mem_mib = self._oom_base.pop(iid, 0), self._mem_mib.pop(iid, None)
        oom: int | None = None
        if group is not None:
            if group.usage().oom_kills > base:
                oom = mem_mib  # the agent logs it, naming the node
            await _empty(group, grace=0.0)
            _remove(group)
        elif ref is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(ref.pid, signal.SIGKILL)
        await on_exit(iid, Exit(code, oom))

    # -- re-adoption -------------------------------------------------------------------

    def adopt(self, spec: StartSpec, ref: ProcessRef | None, on_exit: ExitCallback) -> bool:
        iid = spec.instance_id
        self._mem_mib[iid] = spec.itype.mem_mib
        group = self._iso.open(iid)
        if group is not None:
            pids = group.pids()
            if not pids:
                _remove(group)
                return False
            try:  # the types file may have changed while the agent was down
                group.set_limits(self.limits(spec.itype))
            except CgroupError as exc:
                log.error("instance %s: could not re-apply its limits: %s", iid, exc)
            self._groups[iid] = group
            self._oom_base[iid] = group.usage().oom_kills
            main = ref if ref is not None and alive(ref) and ref.pid in pids else None
            if main is not None:
                self._refs[iid] = main
            running: Callable[[], bool] = ((lambda: alive(main)) if main is not None
                                           else group.populated)
        elif ref is not None and alive(ref):
            self._refs[iid] = ref
            running = lambda: alive(ref)  # noqa: E731 - the same shape as the line above
        else:
            return False
        self._watchers[iid] = asyncio.create_task(self._poll_adopted(iid, running, on_exit))
        return True

    async def _poll_adopted(self, iid: str, running: Callable[[], bool],
                            on_exit: ExitCallback) -> None:
        # Not our child any more (the old agent was its parent), so we can't wait(2) on
        # it: poll instead. Its exit code is lost with its old parent.
        while running():  # noqa: ASYNC110 - /proc and cgroupfs offer no event to await here
            await asyncio.sleep(self._poll)
        await self._ended(iid, None, on_exit)

    # -- stopping ----------------------------------------------------------------------

    async def stop(self, instance_id: str, *, grace: float, keep: bool = False) -> None:
        self._stopping.add(instance_id)
        try:
            group = self._groups.get(instance_id) or self._iso.open(instance_id)
            ref = self._refs.get(instance_id)
            if group is not None:
                await _empty(group, grace=grace)
            elif ref is not None and alive(ref):
                await self._stop_session(ref, instance_id, grace)
            watcher = self._watchers.get(instance_id)
            if watcher is not None:
                await watcher
            if group is not None and not keep:
                _remove(group)
                self._groups.pop(instance_id, None)
                self._oom_base.pop(instance_id, None)
                self._mem_mib.pop(instance_id, None)
        finally:
            self._stopping.discard(instance_id)
            self._refs.pop(instance_id, None)

    async def _stop_session(self, ref: ProcessRef, instance_id: str, grace: float) -> None:
        """Without a cgroup: TERM the process group, KILL it after ``grace``."""
        _signal_group(ref, signal.SIGTERM)
        watcher = self._watchers.get(instance_id)
        if watcher is not None:
            try:
                await asyncio.wait_for(asyncio.shield(watcher), grace)
            except TimeoutError:
                _signal_group(ref, signal.SIGKILL)
        # The leader is gone; anything it left in its group goes with it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(ref.pid, signal.SIGKILL)

    # -- accounting and identity -----------------------------------------------------

    def usage(self, instance_id: str) -> Usage | None:
        group = self._groups.get(instance_id)
        if group is None:
            return None
        try:
            return group.usage()
        except CgroupError:
            return None

    def instance_of(self, pid: int) -> str | None:
        if self._iso.cgroups is not None:
            return self._iso.cgroups.group_of(pid)
        sid = _session_of(pid)
        return next((iid for iid, ref in self._refs.items() if ref.pid == sid), None)

    def pids(self, instance_id: str) -> set[int]:
        group = self._groups.get(instance_id)
        if group is not None:
            return group.pids()
        ref = self._refs.get(instance_id)
        if ref is None:
            return set()
        return {pid for pid in _all_pids() if _session_of(pid) == ref.pid}

    async def close(self) -> None:
        for task in list(self._watchers.values()):
            task.cancel()
        await asyncio.gather(*self._watchers.values(), return_exceptions=True)
        self._watchers.clear()
        _LEFT_RUNNING.extend(p for p in self._procs.values() if p.returncode is None)
        self._procs.clear()
        groups = self._iso.cgroups
        if groups is not None and not groups.instance_ids():
            # Nothing of this node's left running: leave no empty node group behind.
            # (With instances still running, the root stays for the next agent.)
            try:
                groups.remove_root()
            except CgroupError as exc:
                log.warning("could not remove this node's cgroup root: %s", exc)


_PRIVATE = ("AWS_", "ROOST_")
_PASSED = ("ROOST_WORKER_",)  # worker settings an operator gives every instance
_PRIVATE_WORDS = ("SECRET", "PASSWORD", "TOKEN", "CREDENTIAL", "DSN", "KEY")


def instance_environment(node_env: Mapping[str, str]) -> dict[str, str]:
    """The node's environment without anything that could be a secret or steer an SDK
    (AWS_*, ROOST_* but the worker's settings, *SECRET*, *TOKEN*, *DSN*, ...): an
    instance learns who it is from its metadata service, never from the node's
    credentials."""
    out = {}
    for k, v in node_env.items():
        name = k.upper()
        if name.startswith(_PRIVATE) and not name.startswith(_PASSED):
            continue
        if any(w in name for w in _PRIVATE_WORDS):
            continue
        out[k] = v
    return out


async def _joined(group: InstanceCgroup, proc: asyncio.subprocess.Process) -> None:
    """Until the new process has joined its group (the shim's first step, a few ms), so
    that "running" means "inside its limits" and a stop right after start finds it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _JOIN_SECONDS
    while proc.returncode is None and proc.pid not in group.pids():
        if loop.time() > deadline:
            log.error("instance %s: its process %d has not joined its cgroup after %.0f s",
                      group.name, proc.pid, _JOIN_SECONDS)
            return
        await asyncio.sleep(0.005)


async def _empty(group: InstanceCgroup, *, grace: float) -> None:
    """TERM every process of ``group``, wait up to ``grace`` for them to go, then KILL
    until the group is empty. Each signal round is freeze, signal, thaw where the host
    can freeze, so a fork racing the kill cannot slip out."""
    loop = asyncio.get_running_loop()
    # kill_all may block while the freezer settles (up to about 2 s): off the loop.
    # TERM goes out again every quarter second of the grace: a process still being set
    # up when the first one came (bubblewrap building the sandbox, where the namespace's
    # init ignores it) gets the next, once the instance's own program runs.
    deadline = loop.time() + grace
    while grace > 0 and group.populated() and loop.time() < deadline:
        await asyncio.to_thread(group.kill_all, signal.SIGTERM)
        resend = min(deadline, loop.time() + 0.25)
        while group.populated() and loop.time() < resend:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    for _ in range(_KILL_ROUNDS):
        if not group.populated():
            return
        await asyncio.to_thread(group.kill_all, signal.SIGKILL)
        await asyncio.sleep(0.05)
    log.error("cgroup of %s still has processes after %d SIGKILL rounds: %s", group.name,
              _KILL_ROUNDS, sorted(group.pids()))


def _remove(group: InstanceCgroup) -> None:
    try:
        group.remove()
    except CgroupError as exc:
        log.error("could not remove the cgroup of %s: %s", group.name, exc)


def _signal_group(ref: ProcessRef, sig: int) -> None:
    # The instance leads its own session and group (start_new_session), so its pid
    # is its group id; re-check identity first so a reused pid is never signalled.
    if alive(ref):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ref.pid, sig)


def _session_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[3])  # field 6: session id


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]
