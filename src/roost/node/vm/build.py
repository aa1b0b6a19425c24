"""``roost images build``: a bootable micro-VM image made on the host from Debian
packages fetched by name with apt.

- the kernel and its virtio modules: ``linux-image-amd64`` (the package it depends on,
  fetched with ``apt-get download``, unpacked with ``dpkg-deb``; no root needed);
- userland: a static busybox (``busybox-static``), as the host has it or fetched the same
  way;
- the init (`roost.node.vm.guest`), packed with the above into a gzipped ``newc`` cpio
  archive by ``cpio``.

The result is ``<images dir>/roost-microvm/{vmlinuz,initrd.img,image.json}``, which the
built-in image ``ami-00000000000000003`` names.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from roost.domain.images import MICROVM
from roost.node.vm import guest

IMAGES_DIR_ENV = "ROOST_IMAGES_DIR"
KERNEL_PACKAGE = "linux-image-amd64"


class BuildError(Exception):
    """The image cannot be built here; the message says what to install or fix."""


def default_images_dir() -> Path:
    """Where nodes look for image files: $ROOST_IMAGES_DIR, else
    $XDG_DATA_HOME/roost/images (~/.local/share/roost/images)."""
    env = os.environ.get(IMAGES_DIR_ENV)
    if env:
        return Path(env)
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "roost" / "images"


def _run(argv: list[str], *, cwd: Path | None = None) -> str:
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False,
                              timeout=600)
    except FileNotFoundError:
        raise BuildError(f"{argv[0]} is not installed") from None
    if done.returncode != 0:
        raise BuildError(f"{' '.join(argv)} failed: {done.stderr.strip()[-500:]}")
    return done.stdout


def _kernel_package() -> str:
    """The versioned package behind the ``linux-image-amd64`` meta-package."""
    out = _run(["apt-cache", "depends", KERNEL_PACKAGE])
    found = re.search(r"Depends: (linux-image-[0-9][^\s]*)", out)
    if found is None:
        raise BuildError(f"apt-cache found no kernel behind {KERNEL_PACKAGE} "
                         "(run apt-get update?)")
    return found.group(1)


def _fetch(package: str, into: Path) -> Path:
    """The package's .deb, from ``into`` when an earlier build fetched it."""
    debs = sorted(into.glob(f"{package}_*.deb"))
    if not debs:
        _run(["apt-get", "download", "-q", package], cwd=into)
        debs = sorted(into.glob(f"{package}_*.deb"))
    if not debs:
        raise BuildError(f"apt-get download {package} left no .deb in {into}")
    return debs[-1]


def _static_busybox(work: Path) -> Path:
    host = shutil.which("busybox")
    if host is not None and _is_static(Path(host)):
        return Path(host)
    deb = _fetch("busybox-static", work)
    _run(["dpkg-deb", "-x", str(deb), str(work / "busybox-static")])
    for candidate in ("bin/busybox", "usr/bin/busybox"):
        path = work / "busybox-static" / candidate
        if path.exists():
            return path
    raise BuildError("busybox-static has no bin/busybox")


def _is_static(path: Path) -> bool:
    """An ELF with no program interpreter (PT_INTERP names the dynamic loader)."""
    head = path.read_bytes()[:8192]
    return head.startswith(b"\x7fELF") and b"/ld-linux" not in head


def _with_dependencies(mods: Path, wanted: tuple[str, ...]) -> list[tuple[str, Path]]:
    """``wanted`` and the modules they depend on (from each .ko's ``depends=`` modinfo
    field), in an order that loads dependencies first. A module the kernel lacks is
    taken to be built in."""
    files = {p.name.removesuffix(".ko"): p for p in mods.rglob("*.ko")}
    order: list[tuple[str, Path]] = []

    def visit(name: str) -> None:
        if name in (n for n, _ in order) or name not in files:
            return
        found = re.search(rb"depends=([^\0]*)\0", files[name].read_bytes())
        for dep in (found.group(1).decode().split(",") if found else []):
            if dep:
                visit(dep.replace("-", "_"))
        order.append((name, files[name]))

    for name in wanted:
        visit(name)
    if any(files.get(n) is None for n in wanted) and not files:
        raise BuildError(f"no kernel modules under {mods}")
    return order


def guest_digest() -> str:
    """Identifies the guest side (init, helpers, modules) this roost would build."""
    text = "\0".join((guest.init_script(), guest.IMDS, guest.DHCP, *guest.MODULES))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def is_current(images_dir: Path) -> bool:
    """Whether ``images_dir`` holds roost-microvm as this roost builds it."""
    try:
        manifest = json.loads((images_dir / MICROVM / "image.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(manifest.get("guest") == guest_digest()
                and (images_dir / MICROVM / "initrd.img").is_file())


def build(images_dir: Path, *, progress: Callable[[str], None] = print) -> Path:
    """Build ``roost-microvm`` into ``images_dir``; returns its directory. Replaces a
    previous build only once the new one is complete."""
    for tool in ("apt-get", "dpkg-deb", "cpio"):
        if shutil.which(tool) is None:
            raise BuildError(f"{tool} is not installed (Debian: apt-get install "
                             f"{'cpio' if tool == 'cpio' else 'apt dpkg'})")
    images_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="roost-image-", dir=images_dir) as tmp:
        work = Path(tmp)
        package = _kernel_package()
        cache = images_dir / ".debs"
        cache.mkdir(exist_ok=True)
        progress(f"fetching {package} with apt-get download")
        deb = _fetch(package, cache)
        progress(f"unpacking {deb.name}")
        kroot = work / "kernel"
        _run(["dpkg-deb", "-x", str(deb), str(kroot)])
        vmlinuz = next(iter(sorted((kroot / "boot").glob("vmlinuz-*"))), None)
        if vmlinuz is None:
            raise BuildError(f"{deb.name} holds no /boot/vmlinuz-*")
        version = vmlinuz.name.removeprefix("vmlinuz-")
        mods = kroot / "lib" / "modules" / version / "kernel"
        root = work / "initramfs"
        for d in ("bin", "dev", "proc", "sys", "tmp", "run", "lib/modules"):
            (root / d).mkdir(parents=True, exist_ok=True)
        order = _with_dependencies(mods, guest.MODULES)
        for name, path in order:
            shutil.copy(path, root / "lib" / "modules" / f"{name}.ko")
        (root / "lib" / "modules" / "order").write_text(
            "".join(f"{name}\n" for name, _ in order))
        busybox = _static_busybox(work)
        progress(f"busybox: {busybox}")
        shutil.copy(busybox, root / "bin" / "busybox")
        for name, text in (("init", guest.init_script()), ("bin/imds", guest.IMDS),
                           ("bin/roost-dhcp", guest.DHCP)):
            (root / name).write_text(text)
            (root / name).chmod(0o755)
        progress("packing the initramfs with cpio")
        names = "\n".join(str(p.relative_to(root)) for p in sorted(root.rglob("*")))
        archive = subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], cwd=root,
                                 input=names.encode(), capture_output=True, check=False)
        if archive.returncode != 0:
            raise BuildError(f"cpio failed: {archive.stderr.decode().strip()}")
        out = work / "out"
        out.mkdir()
        (out / "initrd.img").write_bytes(gzip.compress(archive.stdout, compresslevel=6))
        shutil.copy(vmlinuz, out / "vmlinuz")
        (out / "image.json").write_text(json.dumps(
            {"name": MICROVM, "kernel_package": package, "kernel": version,
             "guest": guest_digest(),
             "busybox": str(busybox), "modules": list(guest.MODULES)}, indent=2) + "\n")
        final = images_dir / MICROVM
        old = images_dir / f".{MICROVM}.old"
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            final.rename(old)
        out.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    progress(f"built {final} (kernel {version})")
    return final
