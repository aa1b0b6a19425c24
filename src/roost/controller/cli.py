"""``roost controller``, ``roost pools``, ``roost api-tokens`` and ``roost db``.

Every controller setting is a flag, a ``ROOST_CONTROLLER_*`` environment variable and a
key of the ``--config`` TOML file (flags beat the environment, which beats the file).
The flags are generated from `ControllerConfig`, so a new setting cannot miss one of
the three.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import types
import typing
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote

import asyncpg
import click
import msgspec
from rich.console import Console
from rich.table import Table

from roost.controller import config as cfg
from roost.decide.snapshot import PlanSettings, PoolSpec
from roost.store import apitokens, roles
from roost.store import pools as pools_q
from roost.store.errors import StoreError
from roost.store.migrations import migrate_dsn

T = TypeVar("T")
ENV = "ROOST_CONTROLLER_"
DSN_ENVS = ["ROOST_CONTROLLER_DSN", "ROOST_DSN"]

_HELP = {
    "dsn": "Postgres DSN (the controller's database; pools, workers and tasks live there).",
    "interval": "Seconds between reconcile ticks.",
    "scale_up_window": "Seconds demand must stay above current before scaling up.",
    "scale_down_window": "Stabilization: seconds demand must stay below current (and the "
                         "queue be empty) before scaling down.",
    "small_pool_replicas": "Below this many replicas the scale-down window grows to "
                           "window x this / replicas (1: off).",
    "drain_timeout": "Seconds a draining worker may take before it is re-activated.",
    "rate_window": "Seconds over which arrivals per second and the service time are read.",
    "peak_grain": "Seconds: the headroom reads the busiest this-long span of arrivals since "
                  "the previous read (at most rate_window).",
    "drain_horizon": "Seconds within which new replicas should drain the backlog the "
                     "pool cannot clear by itself (at least one service time): the "
                     "queue wait aimed at.",
    "startup_default": "Replica start-up time assumed until a pool has shown its own.",
    "flap_window": "A pool that grows again this soon after a scale-down, short of "
                   "capacity and no larger than it was then, waits this long before "
                   "its next one.",
    "headroom_window": "Seconds of arrival-rate reads that size the headroom kept for "
                       "recurring bursts.",
    "headroom_sigmas": "Headroom: room for the arrival rate this many standard deviations "
                       "(beyond Poisson noise) above its mean, and the noise band within "
                       "which running tasks and arrivals x service agree (0: off).",
    "growth_period": "Period of each pool's growth bound (growth_replicas/percent).",
    "disruption_period": "Period of each pool's disruption budget "
                         "(disruption_replicas/percent).",
    "memory_target_percent": "Stop growing when the pool's nodes reach this memory use.",
    "memory_hard_percent": "Never place a worker that takes a node past this memory use.",
    "cpu_target_percent": "Stop growing when the pool's nodes reach this CPU use.",
    "max_input_age": "Inputs older than this many seconds freeze the plan "
                     "(default: 3 intervals, at least 30).",
    "heartbeat_timeout": "A worker silent for this long is not drained or counted for "
                         "revision checks.",
    "db_total_connections": "Connection budget total (default: max_connections - reserved).",
    "db_non_worker_connections": "Connections kept for everything that is not a worker.",
    "db_connections_per_sync_peer": "Connections each synchronous replication peer holds.",
    "db_expected_sync_peers": "Synchronous peers that must be attached (fewer freezes).",
    "follower_retry": "Seconds between a follower's attempts to take the lead, and between "
                      "a leader's renewals of its lease.",
    "lease_duration": "Seconds a silent (frozen, cut off) leader keeps the lead before "
                      "Postgres ends its session and a follower takes over; no controller "
                      "transaction outlives half of it.",
    "keepalive_timeout": "Timeout of the leader's keep-alive query.",
    "io_timeout": "Timeout of each database read and orchestrator call.",
    "http_host": "Address of the HTTP API.",
    "http_port": "Port of the HTTP API.",
    "shadow": "Plan and publish, log what would be done, never act.",
    "holder": "Name of this controller in the leader lease (default host:pid).",
    "static_config": "TOML file of the static orchestrator's pools.",
    "kubernetes_config": "TOML file of Kubernetes settings (kubeconfig, context, namespace, "
                         "...); serves the kubernetes orchestrator.",
    "native_config": "TOML file of the native adapter (gateway endpoint and keys); serves "
                     "pools that run on roost's own nodes.",
    "fake": "Serve the in-memory fake orchestrator (demos and tests only).",
    "migrate": "Apply schema migrations on start.",
    "task_retention": "Seconds a finished task is kept after it finished, then deleted "
                      "by the leader, never in shadow mode (0: keep every task; else at "
                      "least 3600, or what a new leader reads back if longer).",
}


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def _config_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    hints = typing.get_type_hints(cfg.ControllerConfig)
    for f in reversed(msgspec.structs.fields(cfg.ControllerConfig)):
        hint = hints[f.name]
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) else ()
        base = next((a for a in args if a is not type(None)), hint)
        flag = f.name.replace("_", "-")
        if base is bool:
            decl = f"--{flag}/--no-{flag}"
            fn = click.option(decl, f.name, default=None, envvar=ENV + f.name.upper(),
                              show_envvar=True, help=_HELP.get(f.name, ""))(fn)
        else:
            fn = click.option(f"--{flag}", f.name, type=base, default=None,
                              envvar=ENV + f.name.upper(), show_envvar=True,
                              help=f"{_HELP.get(f.name, '')} [default: {f.default}]")(fn)
    return fn


@click.command("controller")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False,
              path_type=Path), envvar=ENV + "CONFIG", show_envvar=True,
              help="TOML file of settings.")
@click.option("--print-config", is_flag=True, help="Print the effective settings and exit.")
@click.option("--log-level", default="info", envvar=ENV + "LOG_LEVEL", show_envvar=True,
              show_default=True, type=click.Choice(["debug", "info", "warning", "error"]))
@_config_options
def controller(config_file: Path | None, print_config: bool, log_level: str,
               **settings: Any) -> None:
    """Run the capacity controller: elect a leader on Postgres, size worker pools from
    queue demand, and serve /healthz, /readyz, /status, /metrics and the task API."""
    try:
        from_file = cfg.load_file(config_file) if config_file else {}
        config = cfg.build(from_file, settings)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if print_config:
        click.echo(msgspec.json.format(msgspec.json.encode(config)).decode())
        return
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from roost.controller.service import serve  # uvicorn and friends only when serving

    try:
        _run(serve(config))
    except cfg.SettingError as exc:
        raise click.BadParameter(str(exc)) from None


# ---- roost pools ---------------------------------------------------------------------


_BAD_DSN = (ValueError, OverflowError)
"""What asyncpg raises for a DSN it cannot use: its ClientConfigurationError and the
URL parser's errors are ValueErrors, a port past 65535 an OverflowError."""


def _passwords(dsn: str) -> list[str]:
    """Every reading of the DSN's password, longest first: a DSN bad enough to be refused
    may be split at another '@' than the one meant."""
    found = set(re.findall(r"password=([^&\s]+)", dsn))
    _, sep, rest = dsn.partition("://")
    for userinfo, at, _ in (rest.partition("@"), rest.rpartition("@")):
        if sep and at and ":" in userinfo:
            found.add(userinfo.split(":", 1)[1])
    found |= {unquote(p) for p in found}
    return sorted((p for p in found if p), key=len, reverse=True)


def _connect_error(exc: BaseException, dsn: str) -> click.ClickException:
    """Why Postgres could not be reached, never showing the password: an error about a
    malformed DSN may quote a piece of it."""
    text = str(exc) or type(exc).__name__
    for password in _passwords(dsn):
        text = text.replace(password, "***")
    if isinstance(exc, _BAD_DSN):
        return click.ClickException(f"--dsn is not a usable Postgres DSN: {text}")
    return click.ClickException(f"cannot connect to Postgres: {text}")


async def _with_conn(dsn: str, fn: Callable[[Any], Coroutine[Any, Any, T]]) -> T:
    try:
        conn = await asyncpg.connect(dsn, timeout=10)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, *_BAD_DSN) as exc:
        raise _connect_error(exc, dsn) from None
    try:
        return await fn(conn)
    except asyncpg.UndefinedTableError:
        raise click.ClickException("no roost schema here: run `roost db migrate`") from None
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        await conn.close()


_dsn = click.option("--dsn", envvar=DSN_ENVS, required=True, show_envvar=True,
                    help="Postgres DSN.")


_BOUNDS = PoolSpec("defaults", 0, 0, 1, 1, 1, 0)
"""A pool with the default growth bound and disruption budget."""
_PERIODS = PlanSettings()
"""The controller's default growth and disruption periods (its settings, not a pool's)."""

CONTROLLER_WINDOW = "default"
"""What ``--scale-down-window`` takes for the controller's own window (unset)."""


class _Window(click.ParamType[int | str]):
    """Whole seconds, or ``default`` for the controller's window (the store checks the
    range, with a message that says why)."""

    name = "SECONDS|default"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int | str:
        if isinstance(value, int):
            return value
        if value == CONTROLLER_WINDOW:
            return CONTROLLER_WINDOW
        try:
            return int(value)
        except ValueError:
            self.fail(f"{value!r} is not whole seconds or {CONTROLLER_WINDOW!r}", param, ctx)


def _pool_options(create: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    req: dict[str, Any] = {"required": True} if create else {"default": None}
    opt: dict[str, Any] = {} if create else {"default": None}
    options = [
        click.option("--min", "min_replicas", type=click.IntRange(0), **(
            {"default": 0} if create else opt)),
        click.option("--max", "max_replicas", type=click.IntRange(0), **req),
        click.option("--target", "target_per_replica", type=click.IntRange(1), **req,
                     help="Outstanding (queued + running) tasks a replica should "
                          "carry; the plan counts the queue its workers' slots "
                          "(their --concurrency) keep."),
        click.option("--cpu-milli", "worker_cpu_milli", type=click.IntRange(1), **req),
        click.option("--memory-mib", "worker_mem_mib", type=click.IntRange(1), **req),
        click.option("--db-pool-size", "worker_db_pool_size", type=click.IntRange(0), **req,
                     help="Connections one worker opens."),
        click.option("--revision", "expected_revision", **(
            {"default": ""} if create else opt), help="Release every worker must run."),
        click.option("--orchestrator", **req, help="Adapter name: static, fake, ..."),
        click.option("--ref", "orchestrator_ref", **({"default": ""} if create else opt),
                     help="The adapter's name for this pool."),
        # plain ints: the store refuses a bad bound with a message that says why
        click.option("--growth-replicas", "growth_replicas", type=int, **(
            {"default": _BOUNDS.growth_replicas} if create else opt),
                     help="Scale-up bound: at most max(this, --growth-percent) more replicas "
                     f"per the controller's growth_period (default {_PERIODS.growth_period:g} "
                     "s), as a rate whatever the tick (>= 1)."),
        click.option("--growth-percent", "growth_percent", type=int, **(
            {"default": _BOUNDS.growth_percent} if create else opt),
                     help="Scale-up bound, in percent of the pool per growth_period (>= 0)."),
        click.option("--disruption-replicas", "disruption_replicas", type=int, **(
            {"default": _BOUNDS.disruption_replicas} if create else opt),
                     help="Scale-down budget: at most max(this, --disruption-percent) workers "
                     "start draining per the controller's disruption_period (default "
                     f"{_PERIODS.disruption_period:g} s) (>= 1)."),
        click.option("--disruption-percent", "disruption_percent", type=int, **(
            {"default": _BOUNDS.disruption_percent} if create else opt),
                     help="Scale-down budget, in percent of the pool per disruption_period "
                     "(0..100)."),
        click.option("--scale-down-window", "scale_down_window", type=_Window(), default=None,
                     help="Seconds demand must stay below the pool's size before it scales "
                     "down (its stabilization, 0..3600, as HPA's scaleDown."
                     "stabilizationWindowSeconds); 'default' (or unset): the controller's "
                     "window (by default 60 s, longer for a pool under 5 replicas)."),
    ]

    def apply(fn: Callable[..., Any]) -> Callable[..., Any]:
        for o in reversed(options):
            fn = o(fn)
        return fn

    return apply


def _show(specs: list[PoolSpec], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(s) for s in specs], indent=2))
        return
    heads = ("pool", "min", "max", "target", "cpu m", "mem MiB", "db pool", "revision",
             "orchestrator", "ref", "growth/period", "disruption/period", "scale-down window")
    # the periods are the controller's settings, not a pool's: the list names them and
    # says their defaults once, below it, rather than print a default as the pool's
    periods = (f"period: the controller's growth_period, disruption_period (default "
               f"{_PERIODS.growth_period:g} s, {_PERIODS.disruption_period:g} s)")
    rows = [(s.pool_id, str(s.min_replicas), str(s.max_replicas), str(s.target_per_replica),
             str(s.worker_cpu_milli), str(s.worker_mem_mib), str(s.worker_db_pool_size),
             s.expected_revision, s.orchestrator, s.orchestrator_ref,
             f"max({s.growth_replicas}, {s.growth_percent}%)",
             f"max({s.disruption_replicas}, {s.disruption_percent}%)",
             "controller's" if s.scale_down_window is None else f"{s.scale_down_window}s")
            for s in specs]
    console = Console()
    table = Table(*heads)
    for row in rows:
        table.add_row(*row)
    # its natural width, measured as if the terminal were unbounded (a measure within
    # the terminal's width is capped at it)
    if console.measure(table, options=console.options.update_width(10**6)).maximum \
            <= console.width:
        console.print(table)
    else:
        # Thirteen columns do not fit a narrow terminal: rich would cut every value to a
        # letter or two. One block per pool, a field a line, shows them whole.
        width = max(len(h) for h in heads)
        for row in rows:
            for head, value in zip(heads, row, strict=True):
                click.echo(f"{head:<{width}}  {value}".rstrip())
            click.echo()
    if rows:
        click.echo(periods)


@click.group("pools")
def pools() -> None:
    """Create, list, update and delete worker pools."""


@pools.command("create")
@click.argument("pool_id")
@_pool_options(create=True)
@_dsn
@click.option("--json", "as_json", is_flag=True)
def pools_create(pool_id: str, dsn: str, as_json: bool, **fields: Any) -> None:
    """Create a worker pool."""
    if fields["scale_down_window"] == CONTROLLER_WINDOW:
        fields["scale_down_window"] = None
    spec = PoolSpec(pool_id=pool_id, **fields)
    _run(_with_conn(dsn, lambda c: pools_q.create_pool(c, spec)))
    _show([spec], as_json)


@pools.command("list")
@_dsn
@click.option("--json", "as_json", is_flag=True)
def pools_list(dsn: str, as_json: bool) -> None:
    """List worker pools."""
    _show(_run(_with_conn(dsn, pools_q.list_pools)), as_json)


@pools.command("update")
@click.argument("pool_id")
@_pool_options(create=False)
@_dsn
@click.option("--json", "as_json", is_flag=True)
def pools_update(pool_id: str, dsn: str, as_json: bool, **fields: Any) -> None:
    """Change some settings of a worker pool."""
    changes = {k: v for k, v in fields.items() if v is not None}
    if changes.get("scale_down_window") == CONTROLLER_WINDOW:
        changes["scale_down_window"] = None
    spec = _run(_with_conn(dsn, lambda c: pools_q.update_pool(c, pool_id, **changes)))
    _show([spec], as_json)


@pools.command("delete")
@click.argument("pool_id")
@_dsn
@click.option("--force", is_flag=True, help="Delete even with live workers or open tasks.")
def pools_delete(pool_id: str, dsn: str, force: bool) -> None:
    """Delete a worker pool (refused while it has live workers or open tasks)."""
    _run(_with_conn(dsn, lambda c: pools_q.delete_pool(c, pool_id, force=force)))
    click.echo(f"deleted {pool_id}")


# ---- roost api-tokens ---------------------------------------------------------------


@click.group("api-tokens")
def api_tokens() -> None:
    """Bearer tokens for the controller's task API (one pool, or every pool)."""


@api_tokens.command("create")
@click.argument("name")
@click.option("--pool", "pool_id", default=None,
              help="The pool the token reaches; without it, every pool (an operator token).")
@_dsn
def api_tokens_create(name: str, pool_id: str | None, dsn: str) -> None:
    """Make a token and print it: the only time it is shown (only its hash is kept)."""
    try:
        token = _run(_with_conn(dsn, lambda c: apitokens.create(c, name, pool_id)))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(token)


@api_tokens.command("list")
@_dsn
@click.option("--json", "as_json", is_flag=True)
def api_tokens_list(dsn: str, as_json: bool) -> None:
    """List tokens by name and pool (never the tokens themselves)."""
    found = _run(_with_conn(dsn, apitokens.list_tokens))
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(t) for t in found], indent=2))
        return
    table = Table("name", "pool")
    for t in found:
        table.add_row(t.name, t.pool_id or "(every pool)")
    Console().print(table)


@api_tokens.command("revoke")
@click.argument("name")
@_dsn
def api_tokens_revoke(name: str, dsn: str) -> None:
    """Revoke a token: every controller replica refuses it from the next request on."""
    _run(_with_conn(dsn, lambda c: apitokens.revoke(c, name)))
    click.echo(f"revoked {name}")


# ---- roost db --------------------------------------------------------------------------


@click.group("db")
def db() -> None:
    """The roost database schema."""


@db.command("migrate")
@_dsn
def db_migrate(dsn: str) -> None:
    """Apply pending schema migrations (the controller also does this on start)."""
    try:
        applied = _run(migrate_dsn(dsn))
    except _BAD_DSN as exc:
        raise _connect_error(exc, dsn) from None
    except (OSError, asyncpg.PostgresError) as exc:
        raise click.ClickException(f"migration failed: {exc}") from None
    for m in applied:
        click.echo(f"applied {m.version:04d} {m.name}")
    if not applied:
        click.echo("schema up to date")


@db.command("worker-role")
@_dsn
def db_worker_role(dsn: str) -> None:
    """Create the least-privilege role workers connect as (or give it a new password),
    and print its DSN: what native pools hand enrolled workers (the native settings'
    ``dsn``) and what a Kubernetes worker's Secret holds. Run as a role that may create
    roles, after `roost db migrate`."""
    try:
        password = roles.new_password()
        worker = roles.dsn_as(dsn, roles.WORKER_ROLE, password)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--dsn") from None
    _run(_with_conn(dsn, lambda c: roles.ensure_worker_role(c, password)))
    click.echo(worker)
