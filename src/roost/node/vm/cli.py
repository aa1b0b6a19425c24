"""``roost images``: VM images on this host."""

from __future__ import annotations

import json
from pathlib import Path

import click

from roost.domain.images import IMAGES
from roost.node.vm.build import BuildError, build, default_images_dir

_DIR = click.option("--images-dir", type=click.Path(file_okay=False, path_type=Path),
                    default=None, help="Where nodes find image files [default: "
                    "$ROOST_IMAGES_DIR or ~/.local/share/roost/images].")


@click.group("images")
def images() -> None:
    """VM images for the vm driver: build them, list them."""


@images.command("build")
@_DIR
def build_command(images_dir: Path | None) -> None:
    """Build roost-microvm (ami-00000000000000003) from Debian packages fetched with apt:
    a kernel from linux-image-amd64 and a busybox initramfs whose init runs user data
    from the metadata service."""
    target = images_dir or default_images_dir()
    try:
        build(target, progress=lambda line: click.echo(line, err=True))
    except BuildError as exc:
        raise click.ClickException(str(exc)) from None


@images.command("list")
@_DIR
def list_command(images_dir: Path | None) -> None:
    """The images roost knows, and whether this host has a VM image's files."""
    target = images_dir or default_images_dir()
    for img in IMAGES.values():
        if not img.bootable:
            where = ("process driver; on a vm node it boots roost-microvm"
                     if img.interpreter == "sh" else "process driver only")
        else:
            manifest = target / img.kernel
            built = manifest.parent / "image.json"
            where = (f"built: {json.loads(built.read_text()).get('kernel', '?')}"
                     if built.exists() else f"not built here ({target})")
        click.echo(f"{img.image_id}  {img.name:<14} {where}")
