"""Process helpers shared by the embedded servers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path


class EmbeddedError(RuntimeError):
    """An embedded server could not be found, started or reached."""


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1 (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_script(name: str) -> Path:
    """A console script installed by a wheel into this interpreter's environment.

    Looks beside ``sys.executable`` first, so a venv's binary wins over one on PATH.
    """
    candidates = [Path(sys.executable).parent / name, Path(sysconfig.get_path("scripts")) / name]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    for d in os.environ.get("PATH", "").split(os.pathsep):
        c = Path(d) / name
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise EmbeddedError(f"{name} not found: install roost's dependencies (pip install -e .)")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def wait_until(
    ready: Callable[[], bool], *, proc: subprocess.Popen[bytes], what: str, timeout: float,
    log: Path | None = None,
) -> None:
    """Poll ``ready`` until it holds; fail early, with the log's tail, if ``proc`` dies."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EmbeddedError(f"{what} exited with {proc.returncode} while starting{_tail(log)}")
        if ready():
            return
        time.sleep(0.05)
    stop_process(proc, sig=signal.SIGKILL, timeout=5)
    raise EmbeddedError(f"{what} not ready after {timeout:.0f}s{_tail(log)}")


def _tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return ""
    lines = log.read_text(errors="replace").splitlines()[-15:]
    return ":\n" + "\n".join(lines)


def stop_process(
    proc: subprocess.Popen[bytes], *, sig: int = signal.SIGTERM, timeout: float = 10.0
) -> None:
    """Signal ``proc`` by its pid, wait, and SIGKILL it if it outlives ``timeout``."""
    if proc.poll() is not None:
        return
    try:
        os.kill(proc.pid, sig)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    except ProcessLookupError:
        pass


def describe_exit(returncode: int) -> str:
    """``exited with code 1``, ``was killed by SIGKILL``: how a child ended."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


def live_process_named(pid: int, name: str) -> bool:
    """Whether ``pid`` is a running (not zombie) process whose command is ``name``.

    A pid in a lock file may belong to a process that died (a zombie still answers
    ``kill(pid, 0)``), or have been reused by another program since. Where /proc is
    missing, any live pid counts, which errs on the side of leaving the lock alone.
    """
    stat_file = Path(f"/proc/{pid}/stat")
    if not Path("/proc/self/stat").exists():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    try:
        raw = stat_file.read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    comm = raw[raw.index("(") + 1:raw.rindex(")")]
    state = raw[raw.rindex(")") + 2:].split()[0]
    return state not in ("Z", "X") and comm == name


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to a file only its owner can read (0600 from its creation on, so it
    is never readable by others, not even for a moment)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    path.chmod(0o600)
