"""Instance drivers: what "running an instance" means on this node.

- `ProcessDriver` (`roost.node.process`): the user data runs as a real process, inside a
  cgroup sized from its instance type where the host allows it (`roost.node.isolation`).
- `SimDriver`: nothing runs. For benchmarks and large simulated clusters.

The agent talks to a driver only through `InstanceDriver`, so a later driver (a VM per
instance) slots in without the agent knowing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import msgspec

from roost.bus.schemas import LaunchError
from roost.domain.catalog import InstanceType
from roost.domain.images import Image
from roost.node.cgroups import Usage

__all__ = ["Usage"]  # an instance's accounting is its cgroup's


@dataclass(frozen=True, slots=True)
class Exit:
    """How an instance's program ended when nobody asked it to."""

    code: int | None  # None when unknown (an adopted process is not our child)
    oom_limit_mib: int | None = None
    """Set when the memory limit's out-of-memory killer fired: the limit it enforced."""


ExitCallback = Callable[[str, Exit], Awaitable[None]]
"""Called with (instance id, how it ended) when an instance's program ends by itself."""


@dataclass(frozen=True, slots=True)
class ProcessRef:
    """Enough to find a process again after an agent restart, and to tell it from a
    later process that reused its pid."""

    pid: int
    start_ticks: int


@dataclass(frozen=True, slots=True)
class StartSpec:
    instance_id: str
    itype: InstanceType
    image: Image
    user_data: str
    workdir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for the instance's program (its metadata endpoint, its id)."""


class DriverError(Exception):
    """The driver cannot host this instance (e.g. its cgroup cannot be made). The launch
    is refused with this message; nothing else on the node is touched."""


class Unrunnable(DriverError):
    """This node's driver cannot run the image or type at all, and will not until its
    operator acts (no QEMU, the image's files missing here, a kernel image under the
    process driver). The launch is refused as ``unsupported``, so that placement goes
    to another node instead of retrying here."""


class ImageMissing(Unrunnable):
    """The image's files are not on this node (refused as ``image_unavailable``)."""


def launch_refusal(exc: DriverError) -> LaunchError:
    """How a node refuses a launch its driver cannot take (see `LaunchError`)."""
    if isinstance(exc, ImageMissing):
        return "image_unavailable"
    return "unsupported" if isinstance(exc, Unrunnable) else "internal"


IMAGE_FILE = "image.json"


def keep_image(workdir: Path, image: Image) -> None:
    """Keep a registered image in the instance's directory: the node learns it from the
    launch, and boots it again at every start, also after the image is deregistered
    (EC2's instances outlive their AMI)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / IMAGE_FILE).write_bytes(msgspec.json.encode(image))


def kept_image(workdir: Path) -> Image:
    try:
        return msgspec.json.decode((workdir / IMAGE_FILE).read_bytes(), type=Image)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise Unrunnable(f"the instance's image is not kept in {workdir}: {exc}") from None


class InstanceDriver(Protocol):
    name: str
    overhead_mib: int
    """Host memory each instance costs beyond its type (the ledger charges it)."""

    @property
    def isolation(self) -> str:
        """What holds an instance to its type here: "none", "cgroup" or "sandbox"."""
        ...

    @property
    def isolation_note(self) -> str:
        """Why isolation is lower than asked for ("" when it is not)."""
        ...

    @property
    def cannot_launch(self) -> str:
        """Why this driver can launch nothing at all (no QEMU), "" when it can: the
        node says so in its snapshots, and gateways place nothing there."""
        ...

    def prepare(self, spec: StartSpec) -> None:
        """Make what the instance needs before it is accepted (its cgroup); raises
        `DriverError`, and then leaves nothing behind."""
        ...

    async def start(self, spec: StartSpec, on_exit: ExitCallback) -> ProcessRef | None: ...

    async def stop(self, instance_id: str, *, grace: float, keep: bool = False) -> None:
        """Stop everything the instance runs (TERM, then KILL after ``grace``). With
        ``keep`` its cgroup stays for a restart in place (reboot)."""
        ...

    def adopt(self, spec: StartSpec, ref: ProcessRef | None, on_exit: ExitCallback) -> bool:
        """Re-attach to an instance after an agent restart; False if it is gone."""
        ...

    def usage(self, instance_id: str) -> Usage | None:
        """The instance's accounting, or None where nothing accounts for it."""
        ...

    def instance_of(self, pid: int) -> str | None:
        """The instance a host pid belongs to, or None (used to identify metadata
        callers from kernel facts)."""
        ...

    def pids(self, instance_id: str) -> set[int]:
        """Every host pid the instance runs now."""
        ...

    async def close(self) -> None:
        """Stop watching (the agent is exiting). Instances keep running."""
        ...


class SimDriver:
    name = "sim"
    overhead_mib = 0
    isolation = "none"
    isolation_note = ""
    cannot_launch = ""

    def prepare(self, spec: StartSpec) -> None:
        return None

    async def start(self, spec: StartSpec, on_exit: ExitCallback) -> ProcessRef | None:
        return None

    async def stop(self, instance_id: str, *, grace: float, keep: bool = False) -> None:
        return None

    def adopt(self, spec: StartSpec, ref: ProcessRef | None, on_exit: ExitCallback) -> bool:
        return True

    def usage(self, instance_id: str) -> Usage | None:
        return None

    def instance_of(self, pid: int) -> str | None:
        return None

    def pids(self, instance_id: str) -> set[int]:
        return set()

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
