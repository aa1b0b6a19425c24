"""`roost demo` end to end, as a user runs it: a subprocess, a burst of tasks, a summary."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _marked(marker: str) -> list[int]:
    """Pids of live processes whose environment carries ``marker`` (everything the demo
    started inherits it), so leftovers are found by pid, never by name."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if marker.encode() in env and stat.rsplit(")", 1)[1].split()[0] != "Z":
            found.append(int(entry.name))
    return found


def test_roost_demo_runs_every_task_once_and_scales_back_down(
        tmp_path: Path, outside_tmp: Path) -> None:
    marker = f"ROOST_DEMO_TEST={uuid.uuid4().hex}"
    env = {**os.environ, marker.split("=")[0]: marker.split("=")[1],
           "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "roost", "demo", "--tasks", "12", "--task-seconds", "0.2",
         "--timeout", "100", "--no-live", "--data-dir", str(outside_tmp / "demo")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        deadline = time.monotonic() + 10
        while _marked(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _marked(marker)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode == 0, out
    m = re.search(r"tasks done (\d+)/(\d+), duplicates (\d+), lost (\d+), "
                  r"peak replicas (\d+)", out)
    assert m is not None, out
    done, total, dups, lost, peak = map(int, m.groups())
    assert (done, total, dups, lost) == (12, 12, 0, 0), out
    assert peak >= 1, out
    assert not left, f"processes left behind: {left}\n{out}"
