"""``roost bench vm-boot``: what a micro-VM costs, measured on this host.

Boots ``roost-microvm`` as the vm driver would (the same QEMU command line, from
`roost.node.vm.qemu.command`), against a stand-in metadata service on loopback whose
user data fills the guest's RAM (a doubling string in awk, which the guest's OOM killer
ends). Per run, from QEMU's start: the guest kernel's first line, the DHCP lease, user
data starting, and the RAM filled; QEMU's resident memory at each point and at its
peak. The peak minus the guest's RAM is QEMU's own overhead per VM.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import click

from roost.domain.catalog import BUILTIN
from roost.domain.images import IMAGES, MICROVM_IMAGE_ID
from roost.node.vm import qemu
from roost.node.vm.build import default_images_dir

USER_DATA = (b"echo FILL-START\nawk 'BEGIN { s = \"x\"; while (1) s = s s }'\n"
             b"echo FILL-DONE\n")
POINTS = (("kernel", b"roost-microvm: kernel"), ("network", b"roost-microvm: eth0"),
          ("user data", b"user data starting"), ("RAM filled", b"FILL-DONE"))


class _Metadata(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # the stdlib names it
        body = {"user-data": USER_DATA, "local-ipv4": b"10.0.0.5"}.get(
            self.path.rpartition("/")[2], b"i-bench")
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self) -> None:  # an IMDSv2 token, as the node's service gives
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"token")

    def log_message(self, *args: object) -> None:
        return None


def _rss_mib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


def boot_once(accel: qemu.Accel, itype: str, *, timeout: float) -> dict[str, object]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    image = IMAGES[MICROVM_IMAGE_ID]
    images = default_images_dir()
    binary = qemu.qemu_binary()
    if binary is None:
        raise click.ClickException(qemu.missing_qemu())
    with tempfile.TemporaryDirectory(prefix="roost-vm-boot-") as tmp:
        work = Path(tmp) / "i-bench"
        work.mkdir()
        boot = qemu.instance_disks(qemu.Boot(kernel=images / image.kernel,
                                             initrd=images / image.initrd), work)
        argv = qemu.command(binary, itype=BUILTIN[itype], boot=boot, workdir=work,
                            accel=accel, imds_port=server.server_address[1])
        start = time.monotonic()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        seen, peak = b"", 0
        result: dict[str, object] = {"accel": accel, "type": itype,
                                     "guest_mib": BUILTIN[itype].mem_mib}
        try:
            while time.monotonic() - start < timeout and proc.poll() is None:
                seen += proc.stdout.read() or b""
                rss = _rss_mib(proc.pid)
                peak = max(peak, rss)
                for name, marker in POINTS:
                    if marker in seen and f"{name} s" not in result:
                        result[f"{name} s"] = round(time.monotonic() - start, 2)
                        result[f"{name} rss MiB"] = rss
                if b"FILL-DONE" in seen:
                    time.sleep(1.0)
                    peak = max(peak, _rss_mib(proc.pid))
                    break
                time.sleep(0.02)
        finally:
            proc.kill()
            proc.wait()
            server.shutdown()
        result["peak rss MiB"] = peak
        if "RAM filled s" in result:  # only then is the guest's RAM all resident
            result["overhead MiB"] = peak - BUILTIN[itype].mem_mib
        else:
            result["reached"] = "nothing" if "kernel s" not in result else "not all steps"
        return result


@click.command("vm-boot")
@click.option("--accel", type=click.Choice(["kvm", "tcg"]), default="tcg",
              show_default=True)
@click.option("--type", "itype", default="t3.nano", show_default=True)
@click.option("--runs", type=click.IntRange(1, 20), default=1, show_default=True)
@click.option("--timeout", type=float, default=300.0, show_default=True)
def vm_boot(accel: qemu.Accel, itype: str, runs: int, timeout: float) -> None:
    """Boot time to user data and QEMU's memory overhead per micro-VM."""
    for i in range(runs):
        click.echo(f"run {i + 1}: {boot_once(accel, itype, timeout=timeout)}")
