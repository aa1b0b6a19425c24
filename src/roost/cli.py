"""The ``roost`` command. Each service contributes its own subcommands."""

from __future__ import annotations

import click

from roost import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="roost")
def main() -> None:
    """roost: a self-hosted compute control plane.

    Placement: an EC2-compatible gateway sends each launch only to a node with room.
    Autoscaling: a leader-elected controller sizes worker pools from queue demand.
    """


def _register() -> None:
    from roost.node.cli import node

    main.add_command(node)


_register()
