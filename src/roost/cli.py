"""The ``roost`` command. Each service contributes its own subcommands."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import click

from roost import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="roost")
def main() -> None:
    """roost: a self-hosted compute control plane.

    Placement: an EC2-compatible gateway sends each launch only to a node with room.
    Autoscaling: a leader-elected controller sizes worker pools from queue demand.
    """


@dataclass(frozen=True, slots=True)
class BenchEntry:
    """Where a benchmark's click command lives, and the help line ``roost bench --help``
    shows for it without importing it (a unit test keeps the line equal to the real one)."""

    module: str
    attr: str
    summary: str


BENCHMARKS = {
    "autoscale": BenchEntry("roost.bench.autoscale", "autoscale",
                            "Replay a per-minute demand curve against roost's plan, HPA and KEDA."),
    "churn": BenchEntry("roost.bench.churn", "churn_command",
                        "Launch/terminate pairs by the thousand against `roost up`: "
                        "throughput, memory and bucket sizes per chunk, and capacity "
                        "restored exactly at the end."),
    "controller-tick": BenchEntry("roost.bench.controller_tick", "controller_tick",
                                  "Plan and tick cost of the capacity controller at scale."),
    "dashboard": BenchEntry("roost.bench.dashboard", "dashboard_bench",
                            "Server time to render each dashboard page at scale (1,000 nodes, "
                            "100,000 instances)."),
    "isolation": BenchEntry("roost.bench.isolation", "isolation",
                            "Launch and terminate latency per isolation level (none, cgroup, "
                            "sandbox), side by side in one run on this host."),
    "launch": BenchEntry("roost.bench.launch", "launch",
                         "RunInstances + TerminateInstances latency (p50/p99) and throughput, "
                         "beside moto's server and a raw NATS floor, plus "
                         "InsufficientInstanceCapacity latency."),
    "placement": BenchEntry("roost.bench.placement", "placement_command",
                            "GPU placement quality: the FGD protocol on the Alibaba openb trace."),
    "placement-cost": BenchEntry("roost.bench.placement_cost", "placement_cost",
                                 "CPU per launch placed by the roost policy, by cluster size: "
                                 "every node scored afresh, verdicts remembered, and the "
                                 "gateway's pick of the best node only."),
    "scale": BenchEntry("roost.bench.scale", "scale",
                        "Hundreds of sim nodes and ~100,000 live instances from the Azure VM "
                        "trace: launch rate and latency, retries, false capacity errors, "
                        "gateway memory, mirror lag and DescribeInstances, with 1 and 4 "
                        "gateway processes, on a 3-server NATS cluster."),
    "vm-boot": BenchEntry("roost.bench.vm_boot", "vm_boot",
                          "Boot time to user data and QEMU's memory overhead per micro-VM."),
    "wake": BenchEntry("roost.bench.wake", "wake",
                       "Scale-from-zero latency: first task submitted to started and to done, "
                       "through the real controller, gateway, node and worker process."),
    "vm-trace": BenchEntry("roost.bench.vm_trace", "vm_trace_command",
                           "VM placement with departures: fewest hosts for zero rejections on "
                           "Azure V1."),
}
BENCH_EXTRA = frozenset({"numpy", "matplotlib"})
"""What ``pip install 'roost[bench]'`` adds; no other command imports them."""


class BenchGroup(click.Group):
    """``roost bench``: a benchmark's module is imported only when that benchmark runs.

    numpy and matplotlib come with the ``bench`` extra, not with roost, so ``roost up``
    and ``roost --help`` must not load them; and a benchmark that needs them, run
    without them, says which extra to install instead of printing a traceback.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(BENCHMARKS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = BENCHMARKS.get(cmd_name)
        if entry is None:
            return None
        try:
            module = importlib.import_module(entry.module)
        except ModuleNotFoundError as exc:
            if (exc.name or "").partition(".")[0] not in BENCH_EXTRA:
                raise
            raise click.ClickException(
                f"roost bench {cmd_name} needs the bench extra ({exc.name} is not "
                "installed): pip install 'roost[bench]'"
            ) from None
        command: click.Command = getattr(module, entry.attr)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command table from `BENCHMARKS`, so that help imports no benchmark."""
        width = formatter.width - 6 - max(len(name) for name in BENCHMARKS)
        rows = [(name, click.Command(name, help=BENCHMARKS[name].summary)
                 .get_short_help_str(limit=width)) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=BenchGroup)
def bench() -> None:
    """Benchmarks that print figures (and write JSON, Markdown and plots).

    placement, vm-trace and autoscale need the bench extra: pip install 'roost[bench]'.
    """


def _register() -> None:
    # Imported here so that `roost --help` names every command while each service's
    # modules stay importable on their own. Benchmarks load lazily (`BenchGroup`).
    from roost.bus.options import nats_auth_command
    from roost.controller.cli import api_tokens, controller, db, pools
    from roost.dashboard.cli import dashboard
    from roost.demo import demo
    from roost.gateway.accounts_cli import accounts, keys
    from roost.gateway.cli import gateway, status
    from roost.node.cli import node
    from roost.node.vm.cli import images
    from roost.up.cli import up
    from roost.worker.cli import worker

    for cmd in (up, demo, dashboard, node, images, gateway, status, accounts, keys,
                controller, pools, api_tokens, db, nats_auth_command, worker, bench):
        main.add_command(cmd)


_register()
