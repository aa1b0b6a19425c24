"""The console tail EC2 shows, and the cut that keeps a chatty instance's log bounded."""

from __future__ import annotations

import base64
from pathlib import Path

from roost.node.console import (
    CONSOLE_MAX_BYTES,
    CONSOLE_TAIL_BYTES,
    console_tail,
    trim_console,
    trim_consoles,
)


def test_tail_is_the_last_bytes_base64(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    assert console_tail(log) == ""
    log.write_bytes(b"a" * 100 + b"end")
    assert base64.b64decode(console_tail(log, limit=3)) == b"end"
    assert base64.b64decode(console_tail(log)) == b"a" * 100 + b"end"


def test_trim_keeps_the_tail_once_past_the_limit(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    log.write_bytes(b"x" * 900)
    assert not trim_console(log, keep=100, limit=1000)
    with log.open("ab", buffering=0) as f:  # the instance's own append-mode descriptor
        f.write(b"y" * 200)
        assert trim_console(log, keep=100, limit=1000)
        assert log.read_bytes() == b"y" * 100
        f.write(b"z")
    assert log.read_bytes() == b"y" * 100 + b"z"
    assert not trim_console(tmp_path / "missing.log")


def test_trimming_many_names_the_ones_cut(tmp_path: Path) -> None:
    big, small = tmp_path / "big.log", tmp_path / "small.log"
    big.write_bytes(b"x" * (CONSOLE_MAX_BYTES + 1))
    small.write_bytes(b"x")
    names = [str(big), str(small), str(tmp_path / "missing.log")]
    assert trim_consoles(names) == [str(big)]
    assert big.stat().st_size == CONSOLE_TAIL_BYTES and small.stat().st_size == 1


def test_an_instance_gets_no_secret_of_the_nodes() -> None:
    from roost.node.process import instance_environment

    env = instance_environment({
        "PATH": "/usr/bin", "LANG": "C.UTF-8", "AWS_ACCESS_KEY_ID": "AKIA", "AWS_REGION": "x",
        "ROOST_GATEWAY_CREDENTIALS": "k:s", "ROOST_NODE_NATS": "nats://u:p@h",
        "ROOST_WORKER_LEASE": "3", "ROOST_WORKER_DSN": "postgresql://u:p@h/db",
        "PGPASSWORD": "p", "GITHUB_TOKEN": "t", "MY_API_KEY": "k", "DB_SECRET": "s",
    })
    assert env == {"PATH": "/usr/bin", "LANG": "C.UTF-8", "ROOST_WORKER_LEASE": "3"}
