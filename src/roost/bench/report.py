"""Shared output helpers for the benchmarks: the machine a run used, JSON, Markdown."""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    """What a reader needs to judge a timing: CPU, cores, Python, OS."""
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def parse_seeds(text: str) -> list[int]:
    """``42-51``, ``42,45`` or ``42`` -> seeds."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if sep:
            a, b = int(lo), int(hi)
            if b < a:
                raise ValueError(f"seed range {part!r} runs backwards")
            out.extend(range(a, b + 1))
        else:
            out.append(int(part))
    if not out:
        raise ValueError("no seeds given")
    return out
