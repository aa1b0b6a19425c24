"""Parsing /proc/net/tcp{,6} tables; real sockets are in tests/integration/test_imds.py."""

from __future__ import annotations

import ipaddress
import struct
from pathlib import Path

from roost.node.peers import connection_inodes, parse_tcp_table, socket_owner_pids

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid" \
         "  timeout inode\n"


def hex4(addr: str) -> str:
    """An address as the kernel prints it: its in-memory 32-bit words in host order."""
    packed = ipaddress.ip_address(addr).packed
    words = struct.unpack(f"={len(packed) // 4}I", packed)
    return "".join(f"{w:08X}" for w in words)


def line(n: int, local: tuple[str, int], remote: tuple[str, int], inode: int) -> str:
    return (f"  {n}: {hex4(local[0])}:{local[1]:04X} {hex4(remote[0])}:{remote[1]:04X} 01 "
            f"00000000:00000000 00:00000000 00000000     0        0 {inode} 1 0 20 4 30 10 -1\n")


def fake_proc(tmp_path: Path, tcp: str, tcp6: str = "") -> Path:
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "tcp").write_text(HEADER + tcp)
    if tcp6:
        (tmp_path / "net" / "tcp6").write_text(HEADER + tcp6)
    return tmp_path


def test_parse_v4_and_v6_with_mapped_addresses_unmapped() -> None:
    text = HEADER + line(0, ("127.0.0.1", 40000), ("127.0.0.1", 8080), 111) \
        + line(1, ("::ffff:127.0.0.1", 40001), ("::1", 9), 222) + "garbage line\n"
    rows = list(parse_tcp_table(text))
    assert rows == [
        (ipaddress.ip_address("127.0.0.1"), 40000, ipaddress.ip_address("127.0.0.1"), 8080,
         111),
        (ipaddress.ip_address("127.0.0.1"), 40001, ipaddress.ip_address("::1"), 9, 222),
    ]


def test_connection_is_matched_on_both_ends(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path,
                     line(0, ("127.0.0.1", 40000), ("127.0.0.1", 8080), 111)   # client side
                     + line(1, ("127.0.0.1", 8080), ("127.0.0.1", 40000), 112)  # server side
                     + line(2, ("127.0.0.1", 40000), ("127.0.0.1", 5432), 113)  # same port, other
                     + line(3, ("127.0.0.1", 40000), ("127.0.0.1", 8080), 0),   # TIME_WAIT
                     line(0, ("::ffff:127.0.0.1", 40000), ("::ffff:127.0.0.1", 8080), 114))
    assert connection_inodes("127.0.0.1", 40000, "127.0.0.1", 8080, proc=proc) == {111, 114}
    assert connection_inodes("::ffff:127.0.0.1", 40000, "127.0.0.1", 8080,
                             proc=proc) == {111, 114}
    assert connection_inodes("127.0.0.1", 40000, "127.0.0.1", 0,
                             proc=proc) == {111, 113, 114}
    assert connection_inodes("127.0.0.1", 40000, "0.0.0.0", 8080, proc=proc) == {111, 114}
    assert connection_inodes("127.0.0.1", 40001, "127.0.0.1", 8080, proc=proc) == set()


def test_owner_pids_skip_vanished_and_unreadable(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, line(0, ("127.0.0.1", 40000), ("127.0.0.1", 8080), 111))
    for pid, targets in {10: ["socket:[111]", "/dev/null"], 11: ["socket:[999]"],
                         12: ["pipe:[5]", "socket:[111]"]}.items():
        fd = proc / str(pid) / "fd"
        fd.mkdir(parents=True)
        for n, target in enumerate(targets):
            (fd / str(n)).symlink_to(target)
    owners = socket_owner_pids("127.0.0.1", 40000, "127.0.0.1", 8080, [10, 11, 12, 13],
                               proc=proc)
    assert owners == {10, 12}
    assert socket_owner_pids("127.0.0.1", 1, "127.0.0.1", 8080, [10], proc=proc) == set()
