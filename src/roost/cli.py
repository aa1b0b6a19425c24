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


@click.group()
def bench() -> None:
    """Benchmarks that print figures (and write JSON, Markdown and plots)."""


def _register() -> None:
    # Imported here so that `roost --help` names every command while each service's
    # modules stay importable on their own.
    from roost.bench.autoscale import autoscale
    from roost.bench.controller_tick import controller_tick
    from roost.bench.launch import launch
    from roost.bench.placement import placement_command as placement
    from roost.bench.vm_trace import vm_trace_command as vm_trace
    from roost.controller.cli import controller, db, pools
    from roost.demo import demo
    from roost.gateway.cli import gateway, status
    from roost.node.cli import node
    from roost.up.cli import up
    from roost.worker.cli import worker

    for cmd in (up, demo, node, gateway, status, controller, pools, db, worker, bench):
        main.add_command(cmd)
    for cmd in (placement, vm_trace, launch, autoscale, controller_tick):
        bench.add_command(cmd)


_register()
