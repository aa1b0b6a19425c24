"""What placing one launch costs a gateway's CPU, by cluster size.

Synthetic node views (no bus, no data set): ``--nodes`` nodes of 319 vCPU and 757 GiB
(the 1,000-node step of `roost bench scale`), each with a random share of it free,
and a launch mix of five common EC2 types learnt by the `roost` policy. Each launch
places one instance on the best node and takes its room there, so one node's view
changes per launch, as in a gateway's capacity view. Three ways side by side in one
process, so the machine's load weighs on each alike:

- **fresh**: every node scored for every launch, all sorted (roost before verdicts
  were remembered);
- **remembered**: `Remembering` keeps each node's verdict while its view is the same
  object; still all sorted (`placements`);
- **best**: remembered, and only the best untried node picked (`best_placement`),
  which is what the gateway does.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import click

from roost.decide.placement import (
    NodeView,
    Placement,
    Policy,
    Remembering,
    best_placement,
    make_policy,
    placements,
)
from roost.decide.workload import Workload
from roost.domain.catalog import BUILTIN, InstanceType
from roost.domain.fit import FreeCapacity
from roost.domain.resources import Resources

NODE_CPU, NODE_MEM = 319_000, 757 * 1024
TYPES = ("t3.micro", "t3.large", "m7i.xlarge", "c7i.2xlarge", "r7i.large")


def _view(i: int, cpu: int, mem: int) -> NodeView:
    return NodeView(f"n{i:05d}", Resources(NODE_CPU, NODE_MEM),
                    FreeCapacity(Resources(cpu, mem), (), ()))


def _run(nodes: int, launches: int, seed: int,
         pick: Callable[[list[NodeView], InstanceType, Policy], Placement | None]
         ) -> float:
    """Milliseconds of CPU per launch placed with ``pick``."""
    rng = random.Random(seed)
    types = [t for name in TYPES if (t := BUILTIN.get(name)) is not None]
    policy = make_policy("roost", Workload.from_requests(
        [rng.choice(types) for _ in range(2000)]))
    views = [_view(i, rng.randrange(10_000, NODE_CPU, 1000),
                   rng.randrange(20_000, NODE_MEM, 1024)) for i in range(nodes)]
    started = time.process_time()
    for k in range(launches):
        itype = types[k % len(types)]
        best = pick(views, itype, policy)
        if best is None:
            raise click.ClickException("the synthetic cluster filled up; use fewer launches")
        j = int(best.node.node_id[1:])
        free = best.node.free.resources
        views[j] = _view(j, free.cpu_milli - itype.cpu_milli, free.mem_mib - itype.mem_mib)
    return (time.process_time() - started) * 1000 / launches


def _fresh(views: list[NodeView], itype: InstanceType, policy: Policy) -> Placement | None:
    inner = policy.inner if isinstance(policy, Remembering) else policy
    found = placements(views, itype, policy=Remembering(inner))  # a memo per launch: none
    return found[0] if found else None


def _remembered(views: list[NodeView], itype: InstanceType,
                policy: Policy) -> Placement | None:
    found = placements(views, itype, policy=policy)
    return found[0] if found else None


def _best(views: list[NodeView], itype: InstanceType, policy: Policy) -> Placement | None:
    return best_placement(views, itype, policy=policy)


@click.command("placement-cost")
@click.option("--nodes", "sizes", multiple=True, type=click.IntRange(min=1),
              default=[100, 1000], show_default=True, help="Repeat: one row each.")
@click.option("--launches", type=click.IntRange(min=1), default=300, show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
def placement_cost(sizes: tuple[int, ...], launches: int, seed: int) -> None:
    """CPU per launch placed by the roost policy, by cluster size: every node scored
    afresh, verdicts remembered, and the gateway's pick of the best node only."""
    click.echo("| nodes | fresh ms/launch | remembered ms/launch | best ms/launch | "
               "fresh / best |")
    click.echo("|---|---|---|---|---|")
    for n in sizes:
        fresh = _run(n, launches, seed, _fresh)
        kept = _run(n, launches, seed, _remembered)
        best = _run(n, launches, seed, _best)
        click.echo(f"| {n} | {fresh:.2f} | {kept:.2f} | {best:.2f} | {fresh / best:.1f}x |")
