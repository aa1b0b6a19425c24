"""Who is on the other end of a loopback TCP connection, from kernel facts in /proc.

The metadata service must answer each instance with its own data, and must not take the
caller's word for who it is: a header can be forged by any process. The kernel knows
better. The caller's end of the connection is a socket in /proc/net/tcp (or tcp6) whose
local address is the peer address the server sees and whose remote address is the
server's; its inode appears as ``socket:[inode]`` among the fds of every process holding
it. Each instance's processes are known to the node (its cgroup's pids), so the instance
whose pids hold that socket is the caller.

Requirements and limits, on purpose stated here rather than discovered:
- the server and the instances' processes share one network namespace (/proc/net/tcp
  is per namespace: it is read as the server's);
- reading another process's fds (``/proc/<pid>/fd``) needs root or the same uid
  (ptrace access); pids we may not read are skipped, so such a caller resolves to
  nobody (404), never to the wrong instance;
- a socket shared by processes of two instances (an fd passed over a unix socket, a
  fork across cgroups) is ambiguous and resolves to nobody;
- each lookup reads /proc/net/tcp{,6} and the fds of every candidate pid, so it costs
  O(sockets + candidate fds); run it off the event loop (the IMDS app does).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

log = logging.getLogger(__name__)

PROC = Path("/proc")
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
GroupPids = Callable[[], Mapping[str, Iterable[int]]]
"""Instance id -> the pids in its cgroup now. Called on every resolution, from the IMDS
app's worker thread: it should read files or a snapshot, not touch the event loop."""


def socket_owner_pids(peer_host: str, peer_port: int, server_host: str, server_port: int,
                      candidates: Iterable[int], *, proc: Path = PROC) -> set[int]:
    """The candidate pids holding the client socket of the connection from
    (peer_host, peer_port) to (server_host, server_port).

    ``server_port`` 0 matches any server port and an unspecified ``server_host``
    (0.0.0.0, ::) any server address: weaker, as the same client port may be connected
    to two servers at once. IPv4-mapped IPv6 addresses compare equal to their IPv4 form.
    """
    inodes = connection_inodes(peer_host, peer_port, server_host, server_port, proc=proc)
    if not inodes:
        return set()
    wanted = {f"socket:[{inode}]" for inode in inodes}
    return {pid for pid in set(candidates) if _holds_any(proc, pid, wanted)}


def connection_inodes(peer_host: str, peer_port: int, server_host: str, server_port: int,
                      *, proc: Path = PROC) -> set[int]:
    """Inodes of the sockets whose local end is the peer and remote end the server."""
    peer, server = _address(peer_host), _address(server_host)
    if peer is None or server is None:
        return set()
    any_server = server.is_unspecified
    found: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            text = (proc / "net" / table).read_text()
        except OSError:  # no IPv6 in this kernel, or /proc not mounted
            continue
        for local, l_port, remote, r_port, inode in parse_tcp_table(text):
            if (inode and l_port == peer_port and local == peer
                    and (server_port == 0 or r_port == server_port)
                    and (any_server or remote == server)):
                found.add(inode)
    return found


def parse_tcp_table(text: str) -> Iterator[tuple[Address, int, Address, int, int]]:
    """(local address, local port, remote address, remote port, inode) per socket in a
    /proc/net/tcp or tcp6 table. Addresses are the kernel's in-memory words printed
    in hex, so they are unpacked in this host's byte order."""
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        try:
            local, l_port = _endpoint(fields[1])
            remote, r_port = _endpoint(fields[2])
            inode = int(fields[9])
        except ValueError:
            continue
        yield local, l_port, remote, r_port, inode


class SocketOwnerResolver:
    """A CallerResolver (``(peer host, peer port) -> instance id``) by socket ownership.

    The metadata app calls `resolve_connection` with the server end of the very
    connection (ASGI ``scope["server"]``), so a server bound to port 0 needs no port up
    front; a plain call uses the server address given here.
    """

    def __init__(self, groups: GroupPids, server_host: str, server_port: int, *,
                 proc: Path = PROC) -> None:
        self._groups = groups
        self.server_host = server_host
        self.server_port = server_port
        self._proc = proc

    def __call__(self, peer_host: str, peer_port: int) -> str | None:
        return self.resolve_connection(peer_host, peer_port, self.server_host,
                                       self.server_port)

    def resolve_connection(self, peer_host: str, peer_port: int, server_host: str,
                           server_port: int) -> str | None:
        groups = {iid: set(pids) for iid, pids in self._groups().items()}
        everyone: set[int] = set().union(*groups.values()) if groups else set()
        owners = socket_owner_pids(peer_host, peer_port, server_host, server_port,
                                   everyone, proc=self._proc)
        matches = sorted(iid for iid, pids in groups.items() if pids & owners)
        if len(matches) > 1:
            log.warning("connection from %s:%s is held by processes of several "
                        "instances (%s): answering none", peer_host, peer_port,
                        ", ".join(matches))
            return None
        return matches[0] if matches else None


def resolver_by_groups(groups: GroupPids, server_host: str,
                       server_port: int) -> SocketOwnerResolver:
    """The resolver the node hands to `MetadataServer`: the caller is the instance whose
    cgroup pids hold the client socket. Pass the server's configured host and port (port
    0 is fine: the app supplies each connection's real server end)."""
    return SocketOwnerResolver(groups, server_host, server_port)


def _holds_any(proc: Path, pid: int, wanted: set[str]) -> bool:
    fd_dir = proc / str(pid) / "fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:  # gone, a kernel thread, or not ours to read
        return False
    for fd in fds:
        try:
            if os.readlink(fd_dir / fd) in wanted:
                return True
        except OSError:  # closed meanwhile
            continue
    return False


def _endpoint(field: str) -> tuple[Address, int]:
    hex_addr, hex_port = field.split(":")
    words = [int(hex_addr[i:i + 8], 16) for i in range(0, len(hex_addr), 8)]
    packed = struct.pack(f"={len(words)}I", *words)
    if len(packed) == 4:
        addr: Address = ipaddress.IPv4Address(packed)
    elif len(packed) == 16:
        addr = _unmapped(ipaddress.IPv6Address(packed))
    else:
        raise ValueError(f"not an address: {hex_addr}")
    return addr, int(hex_port, 16)


def _address(host: str) -> Address | None:
    """An address to compare with the tables', None when there is none. A host name is
    looked up (a server configured as 'localhost' should not quietly match nothing)."""
    try:
        addr = ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        try:
            addr = ipaddress.ip_address(socket.gethostbyname(host))
        except (OSError, ValueError):
            return None
    return _unmapped(addr)


def _unmapped(addr: Address) -> Address:
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr
