"""The controller's TOML files (its own settings, the kubernetes and native adapters'):
read in one place, so that every file fails with the same kind of message."""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def read(path: Path) -> dict[str, Any]:
    """The document in ``path``, or ValueError naming the file and what is wrong."""
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: invalid TOML: {exc}") from None


def section(doc: dict[str, Any], name: str, path: Path) -> dict[str, Any]:
    """The ``[name]`` table, or the top level when there is none; ``a-b`` keys read as
    ``a_b``, as the command-line flags spell them."""
    table = doc.get(name, doc)
    if not isinstance(table, dict):
        raise ValueError(f"{path}: [{name}] must be a table")
    return {k.replace("-", "_"): v for k, v in table.items()}


def resolve_paths(table: dict[str, Any], keys: Iterable[str], path: Path) -> None:
    """Make the paths under ``keys`` relative to the file they were read from."""
    for key in keys:
        if isinstance(table.get(key), str):
            table[key] = str(path.parent / Path(table[key]).expanduser())
