"""QEMU's guestfwd helper for the metadata service: one per guest connection, started by
QEMU (so in the instance's cgroup), joining its stdin/stdout to a TCP address.

Unlike ``nc``, it keeps reading the answer after the guest has finished sending (an HTTP
client half-closes once its request is out), and exits only when the server closes.
Standard library only, run with ``python -S -I``: it starts in tens of milliseconds.
"""

import os
import socket
import sys
import threading


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    sock = socket.create_connection((host, port), timeout=30)

    def upstream() -> None:
        while data := os.read(0, 65536):
            sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)

    threading.Thread(target=upstream, daemon=True).start()
    while data := sock.recv(65536):
        os.write(1, data)


if __name__ == "__main__":
    try:
        main()
    except OSError:
        sys.exit(1)
