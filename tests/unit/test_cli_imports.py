"""numpy and matplotlib belong to the ``bench`` extra: the CLI runs without them.

Each check runs ``roost`` in a subprocess whose imports of numpy and matplotlib fail, as
in an install of plain ``roost``: help and ``roost up --help`` work, the benchmarks that
need the extra say so in one line, and the ones that do not (launch, controller-tick)
still load.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from roost.cli import BENCH_EXTRA, BENCHMARKS, bench

WITHOUT_EXTRA = f"""
import importlib.abc, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {sorted(BENCH_EXTRA)!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
from roost.cli import main
main(sys.argv[1:], prog_name="roost")
"""


def roost_without_extra(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", WITHOUT_EXTRA, *args], capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.mark.parametrize("args", [
    ["--help"], ["up", "--help"], ["demo", "--help"], ["gateway", "--help"],
    ["controller", "--help"], ["bench", "--help"], ["bench", "launch", "--help"],
    ["bench", "controller-tick", "--help"],
])
def test_commands_run_without_the_bench_extra(args: list[str]) -> None:
    done = roost_without_extra(*args)
    assert done.returncode == 0, done.stderr
    assert "Usage: roost" in done.stdout


@pytest.mark.parametrize("name", ["placement", "vm-trace", "autoscale"])
def test_a_benchmark_that_needs_the_extra_names_it(name: str) -> None:
    done = roost_without_extra("bench", name, "--quick")
    assert done.returncode == 1
    assert f"roost bench {name} needs the bench extra" in done.stderr
    assert "pip install 'roost[bench]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_importing_the_cli_loads_neither_numpy_nor_matplotlib() -> None:
    code = ("import sys, roost.cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'matplotlib')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_bench_help_lines_are_the_commands_own() -> None:
    """`BENCHMARKS` repeats each benchmark's summary so help need not import it."""
    for name, entry in BENCHMARKS.items():
        command = bench.get_command(None, name)  # type: ignore[arg-type]
        assert command is not None and command.name == name
        assert command.get_short_help_str(limit=1000) == entry.summary
