"""``roost gateway`` (serve the EC2 API) and ``roost status`` (a table of the nodes)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import httpx
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from rich.console import Console
from rich.table import Table

from roost.bus.auth import NatsAuth
from roost.bus.options import nats_creds_option
from roost.decide.placement import DEFAULT_POLICY, POLICIES, WORKLOAD_POLICIES
from roost.decide.workload import parse_workload_toml
from roost.domain.catalog import BUILTIN, parse_types_toml
from roost.gateway.accounts import OPERATOR_KEY_ENV, OPERATOR_KEY_FILE_ENV, load_operator_key
from roost.gateway.admin import API_PREFIX
from roost.gateway.capacity import FULL_AFTER
from roost.gateway.server import Gateway, GatewayConfig
from roost.gateway.workers import GatewayPool


def parse_credentials(values: tuple[str, ...]) -> dict[str, str]:
    """``KEY:SECRET`` pairs, each option value possibly holding several (comma/space)."""
    out = {}
    for raw in values:
        for item in raw.replace(",", " ").split():
            key, sep, secret = item.partition(":")
            if not sep or not key or not secret:
                raise click.BadParameter(f"expected KEY:SECRET, got {item!r}",
                                         param_hint="--credentials")
            out[key] = secret
    return out


@click.command("gateway")
@click.option("--nats", "nats_urls", envvar="ROOST_GATEWAY_NATS", multiple=True,
              default=["nats://127.0.0.1:4222"], show_default=True,
              help="NATS server URL; repeat for a cluster. Env: ROOST_GATEWAY_NATS.")
@click.option("--host", envvar="ROOST_GATEWAY_HOST", default="127.0.0.1", show_default=True,
              help="Bind address. Env: ROOST_GATEWAY_HOST.")
@click.option("--port", envvar="ROOST_GATEWAY_PORT", type=click.IntRange(0, 65535),
              default=8773, show_default=True, help="Env: ROOST_GATEWAY_PORT.")
@click.option("--region", envvar="ROOST_GATEWAY_REGION", default="roost-1", show_default=True,
              help="The one region this gateway reports. Env: ROOST_GATEWAY_REGION.")
@click.option("--credentials", "credentials", envvar="ROOST_GATEWAY_CREDENTIALS",
              multiple=True, metavar="KEY:SECRET",
              help="Accepted access keys; repeat or comma-separate. "
                   "Env: ROOST_GATEWAY_CREDENTIALS.")
@click.option("--operator-key-file", envvar=OPERATOR_KEY_FILE_ENV, default=None,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The key that opens the secrets of `roost keys create` keys (or give "
                   f"the key itself in {OPERATOR_KEY_ENV}). Env: {OPERATOR_KEY_FILE_ENV}.")
@click.option("--no-auth", is_flag=True, envvar="ROOST_GATEWAY_NO_AUTH",
              help="Accept unsigned requests. For development only; logged loudly. "
                   "Env: ROOST_GATEWAY_NO_AUTH.")
@click.option("--policy", envvar="ROOST_GATEWAY_POLICY", type=click.Choice(POLICIES),
              default=DEFAULT_POLICY, show_default=True,
              help="Placement policy: roost weighs GPU fragmentation and the room left "
                   "for recent launch shapes; pack is best fit; anycast is the plain "
                   "queue group. Env: ROOST_GATEWAY_POLICY.")
@click.option("--workload", "workload_file", envvar="ROOST_GATEWAY_WORKLOAD",
              type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="TOML of the expected launch mix ([workload] type = weight) for the "
                   "roost and fgd policies; without it they learn the mix from recent "
                   "launches. Env: ROOST_GATEWAY_WORKLOAD.")
@click.option("--types-config", envvar="ROOST_GATEWAY_TYPES_CONFIG",
              type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="TOML of operator-defined instance types (the nodes' file). "
                   "Env: ROOST_GATEWAY_TYPES_CONFIG.")
@click.option("--launch-timeout", envvar="ROOST_GATEWAY_LAUNCH_TIMEOUT",
              type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Seconds to wait for a node's launch reply before reconciling. "
                   "Env: ROOST_GATEWAY_LAUNCH_TIMEOUT.")
@click.option("--max-attempts", envvar="ROOST_GATEWAY_MAX_ATTEMPTS",
              type=click.IntRange(min=1), default=3, show_default=True,
              help="Node-targeted attempts per instance before falling back to anycast. "
                   "Env: ROOST_GATEWAY_MAX_ATTEMPTS.")
@click.option("--full-after", envvar="ROOST_GATEWAY_FULL_AFTER",
              type=click.FloatRange(min=0), default=FULL_AFTER, show_default=True,
              help="Seconds after start before a full cluster is answered from the capacity "
                   "view alone (until then the bus is asked). Raise it if nodes heartbeat "
                   "slower than every 2 s. Env: ROOST_GATEWAY_FULL_AFTER.")
@click.option("--client-token-ttl", envvar="ROOST_GATEWAY_CLIENT_TOKEN_TTL",
              type=click.FloatRange(min=60), default=24 * 3600.0, show_default=True,
              help="Seconds a RunInstances ClientToken is remembered. "
                   "Env: ROOST_GATEWAY_CLIENT_TOKEN_TTL.")
@click.option("--terminated-retention-seconds", "terminated_retention",
              envvar="ROOST_GATEWAY_TERMINATED_RETENTION_SECONDS",
              type=click.FloatRange(min=1), default=3600.0, show_default=True,
              help="How long a terminated instance of a node forgotten with `roost node "
                   "forget` stays describable; then the gateways delete its record (a "
                   "live node expires its own). "
                   "Env: ROOST_GATEWAY_TERMINATED_RETENTION_SECONDS.")
@click.option("--workers", envvar="ROOST_GATEWAY_WORKERS", type=click.IntRange(min=1),
              default=1, show_default=True,
              help="Gateway processes sharing the port (SO_REUSEPORT), each with its own "
                   "view of the cluster; a worker that exits is restarted. "
                   "Env: ROOST_GATEWAY_WORKERS.")
@click.option("--log-level", envvar="ROOST_GATEWAY_LOG_LEVEL", default="INFO",
              show_default=True, help="Env: ROOST_GATEWAY_LOG_LEVEL.",
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@nats_creds_option
def gateway(nats_urls: tuple[str, ...], nats_auth: NatsAuth | None, host: str, port: int,
            region: str, credentials: tuple[str, ...], operator_key_file: Path | None,
            no_auth: bool, policy: str,
            workload_file: Path | None, types_config: Path | None, launch_timeout: float,
            max_attempts: int, full_after: float, client_token_ttl: float,
            terminated_retention: float, workers: int, log_level: str) -> None:
    """Serve the EC2 Query API, placing launches on nodes with room.

    Any number of gateways may run against one NATS: they share nothing but the bus
    and its KV buckets. With --workers N this process supervises N of them on one port,
    and /metrics on any answers the sum over all; SIGINT or SIGTERM to this process's
    pid stops them all.
    """
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    catalog = BUILTIN
    if types_config is not None:
        try:
            catalog = BUILTIN.with_types(parse_types_toml(types_config.read_text()))
        except (OSError, ValueError) as exc:
            raise click.BadParameter(str(exc), param_hint="--types-config") from None
    workload = None
    if workload_file is not None:
        try:
            workload = parse_workload_toml(workload_file.read_text(), catalog)
        except (OSError, ValueError) as exc:
            raise click.BadParameter(str(exc), param_hint="--workload") from None
        if policy not in WORKLOAD_POLICIES:
            click.echo(f"warning: --workload is not used by the {policy} policy, only by "
                       f"{' and '.join(WORKLOAD_POLICIES)}", err=True)
    env = dict(os.environ)
    if operator_key_file is not None:
        env[OPERATOR_KEY_FILE_ENV] = str(operator_key_file)
    try:
        operator_key = load_operator_key(env)
    except (OSError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--operator-key-file") from None
    try:
        config = GatewayConfig(
            nats_urls=[u for raw in nats_urls for u in raw.replace(",", " ").split()],
            host=host, port=port, region=region, credentials=parse_credentials(credentials),
            operator_key=operator_key,
            auth=not no_auth, policy=policy, workload=workload, catalog=catalog,
            launch_timeout=launch_timeout, max_attempts=max_attempts,
            client_token_ttl=client_token_ttl, full_after=full_after, nats_auth=nats_auth,
            terminated_retention=terminated_retention,
        )
        config.check()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if workers == 1:
        run_gateway(Gateway(config))
        return
    try:
        asyncio.run(_serve_pool(GatewayPool(config, workers)))
    except Exception as exc:
        raise click.ClickException(f"gateway failed: {type(exc).__name__}: {exc}") from None


def run_gateway(gw: Gateway, *, on_ready: Callable[[], None] | None = None,
                quiet: bool = False) -> None:
    """Serve ``gw`` until SIGINT or SIGTERM (the process's main program). (uvloop was
    measured here: no less CPU per launch than asyncio's loop, side by side.)"""
    try:
        asyncio.run(_serve(gw, on_ready=on_ready, quiet=quiet))
    except Exception as exc:
        raise click.ClickException(f"gateway failed: {type(exc).__name__}: {exc}") from None


def _stop_on_signals() -> asyncio.Event:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _serve_pool(pool: GatewayPool) -> None:
    stop = _stop_on_signals()
    click.echo(f"starting {pool.workers} gateway workers", err=True)
    try:
        await pool.start()
        click.echo(f"gateway ready on {pool.endpoint} (workers: pids "
                   f"{', '.join(map(str, pool.pids))}; stop with kill {os.getpid()})",
                   err=True)
        await pool.supervise(stop)
    finally:
        await pool.stop()


async def cancel_until_done(task: asyncio.Task[Any], *, every: float = 0.5) -> None:
    """Cancel ``task`` and wait until it has ended, cancelling again every ``every``
    seconds. Once is not enough for nats-py's connect loop: a cancellation landing as
    an inner wait completes can be swallowed (asyncio.wait_for on Python 3.11,
    CPython gh-86296, and nats-py's own close path), after which the loop retries an
    unreachable server forever. Seen as a gateway ignoring SIGTERM about 1 in 60 times."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=every)
    await asyncio.gather(task, return_exceptions=True)


async def _serve(gw: Gateway, *, on_ready: Callable[[], None] | None = None,
                 quiet: bool = False) -> None:
    stop = _stop_on_signals()
    if not quiet:
        click.echo(f"connecting to NATS at {', '.join(gw.config.nats_urls)} "
                   "(retrying until it answers)", err=True)
    starting = asyncio.create_task(gw.start())
    stopping = asyncio.create_task(stop.wait())
    try:
        # A signal while NATS is still unreachable must stop the start, not wait for it.
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            await cancel_until_done(starting)
            return
        starting.result()
        if not quiet:
            click.echo(f"gateway ready on {gw.endpoint}", err=True)
        if on_ready is not None:
            on_ready()
        await stopping
    finally:
        stopping.cancel()
        await gw.stop()


def fetch_signed(endpoint: str, path: str, *, key: str | None, secret: str | None,
                 region: str, timeout: float = 5.0) -> Any:
    """GET ``path`` from the gateway's admin API, SigV4-signed when keys are given."""
    url = endpoint.rstrip("/") + path
    headers: dict[str, str] = {}
    if key and secret:
        req = AWSRequest(method="GET", url=url, data=b"")
        SigV4Auth(Credentials(key, secret), "ec2", region).add_auth(req)
        headers = dict(req.headers.items())
    resp = httpx.get(url, headers=headers, timeout=timeout)
    if resp.status_code != 200:
        raise click.ClickException(f"{url}: HTTP {resp.status_code}: {resp.text[:200]}")
    return resp.json()


def _gib(mib: int) -> str:
    return f"{mib / 1024:.1f}"


def nodes_table(nodes: list[dict[str, Any]]) -> Table:
    table = Table(title="roost nodes")
    for col in ("node", "zone", "state", "vCPU free/alloc", "GiB free/alloc", "GPUs free",
                "instances", "isolation", "fits (most)"):
        table.add_column(col, justify="right" if "/" in col or col == "instances" else "left")
    for n in nodes:
        state = "draining" if n["draining"] else ("live" if n["live"] else "silent")
        free, alloc = n["free"], n["allocatable"]
        fits = sorted(n["fit"].items(), key=lambda kv: (-kv[1], kv[0]))[:3]
        gpus = ", ".join(f"{g['model']}:{g['free_milli']}" for g in n["gpus"]) or "-"
        table.add_row(
            n["node_id"], n["availability_zone"], state,
            f"{free['cpu_milli'] / 1000:g}/{alloc['cpu_milli'] / 1000:g}",
            f"{_gib(free['mem_mib'])}/{_gib(alloc['mem_mib'])}",
            gpus, str(n["instances"]),
            n.get("isolation", "unknown") + (" (!)" if n.get("isolation_note") else ""),
            ", ".join(f"{t}={c}" for t, c in fits) or "-",
        )
    notes = [f"{n['node_id']}: {n['isolation_note']}" for n in nodes if n.get("isolation_note")]
    if notes:
        table.caption = "(!) " + "; ".join(notes)
    return table


@click.command("status")
@click.option("--endpoint", envvar=["ROOST_ENDPOINT", "AWS_ENDPOINT_URL_EC2"],
              default="http://127.0.0.1:8773", show_default=True,
              help="The gateway. Env: ROOST_ENDPOINT or AWS_ENDPOINT_URL_EC2.")
@click.option("--region", envvar="AWS_DEFAULT_REGION", default="roost-1", show_default=True,
              help="Region to sign for. Env: AWS_DEFAULT_REGION.")
@click.option("--json", "as_json", is_flag=True, help="Print the admin API's JSON.")
def status(endpoint: str, region: str, as_json: bool) -> None:
    """A table of the nodes the gateway sees: free and allocatable capacity, what fits.

    Signs with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY from the environment.
    """
    try:
        data = fetch_signed(endpoint, f"{API_PREFIX}/nodes",
                            key=os.environ.get("AWS_ACCESS_KEY_ID"),
                            secret=os.environ.get("AWS_SECRET_ACCESS_KEY"), region=region)
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach {endpoint}: {exc}") from None
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    console = Console()
    console.print(nodes_table(data["nodes"]))
