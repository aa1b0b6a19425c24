"""``roost up``: NATS, Postgres, the gateway, N nodes and the capacity controller on this
machine, with one command."""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import signal
from collections.abc import Callable
from pathlib import Path

import click

from roost.decide.placement import DEFAULT_POLICY, POLICIES
from roost.domain.images import DEFAULT_IMAGE_ID
from roost.domain.resources import parse_quantity
from roost.embedded.proc import free_port, port_open, write_private
from roost.gateway.accounts import OPERATOR_KEY_FILE_ENV, load_operator_key, new_operator_key
from roost.gateway.workers import default_workers
from roost.node.isolation import LEVELS, Level
from roost.up.cluster import (
    ClusterSpec,
    ControllerComponent,
    DashboardComponent,
    LocalCluster,
    NatsComponent,
    build_components,
    new_credentials,
)
from roost.up.supervise import Supervisor

DEFAULT_PORT = 8773
DEFAULT_NATS_PORT = 4222
DEFAULT_CONTROLLER_PORT = 9180
DEFAULT_POSTGRES_PORT = 5432
DEFAULT_DASHBOARD_PORT = 8780


def load_or_make_credentials(data_dir: Path) -> tuple[str, str]:
    """The key pair kept in ``data_dir``, made on first use, so that clients configured
    against one `roost up` keep working after a restart."""
    path = data_dir / "credentials.json"
    if path.exists():
        saved = json.loads(path.read_text())
        return str(saved["access_key_id"]), str(saved["secret_access_key"])
    key, secret = new_credentials()
    data_dir.mkdir(parents=True, exist_ok=True)
    write_private(path, json.dumps({"access_key_id": key, "secret_access_key": secret}))
    return key, secret


def load_or_make_operator_key(data_dir: Path) -> bytes:
    """The operator key kept in ``data_dir/operator.key`` (0600), made on first use: it
    seals the access key secrets in the accounts bucket. `roost keys create` finds it
    with ROOST_OPERATOR_KEY_FILE pointing there."""
    path = data_dir / "operator.key"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        write_private(path, new_operator_key())
    key = load_operator_key({OPERATOR_KEY_FILE_ENV: str(path)})
    assert key is not None
    return key
def redact_dsn(dsn: str) -> str:
    """``dsn`` with its password, if any, replaced by ``***``."""
    scheme, sep, rest = dsn.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return dsn
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}"


def _port(wanted: int | None, default: int) -> int:
    """The port asked for; for an unasked default that is taken, a free one."""
    if wanted is not None:
        return wanted
    return default if not port_open(default) else free_port()


def banner(spec: ClusterSpec, *, endpoint: str, nats_url: str, key: str, secret: str,
           controller_url: str = "", dsn: str = "", dashboard_url: str = "",
           isolation: str = "", env_file: Path | None = None) -> str:
    """What `roost up` prints once ready. Passwords and tokens other than the access key
    stay in the 0600 env file: the banner shows where, not what."""
    env = f"source {env_file}" if env_file else "the env file"
    creds = (f"AWS_ACCESS_KEY_ID={key} AWS_SECRET_ACCESS_KEY={secret} "
             if spec.auth else "AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=x ")
    lines = [
        f"roost is up: {spec.nodes} nodes ({spec.driver} driver, {spec.node_capacity} each"
        + (f", isolation {isolation}" if isolation else "") + f"), policy {spec.policy}",
        "",
        f"  EC2 endpoint   {endpoint}",
        f"  NATS           {nats_url}" + (
            "   (users and permissions; admin credentials: $ROOST_NATS_CREDS)"
            if spec.nats_auth else "   (OPEN: --no-nats-auth)"),
        f"  region         {spec.region}",
    ]
    if dashboard_url:
        lines += [f"  dashboard      {dashboard_url}"]
    if controller_url:
        lines += [f"  controller     {controller_url}   (curl {controller_url}/status; the "
                  "task API wants $ROOST_API_TOKEN)",
                  f"  Postgres       {redact_dsn(dsn)}   (password: $ROOST_DSN)"]
    if spec.auth:
        lines += [f"  access key     {key}", f"  secret key     {secret}"]
    else:
        lines += ["  auth           OFF (--no-auth): any key is accepted"]
    lines += [
        "",
        "Paste into a shell:",
        "",
        f"  export {creds}AWS_DEFAULT_REGION={spec.region}",
        f"  aws ec2 run-instances --endpoint-url {endpoint} "
        f"--image-id {DEFAULT_IMAGE_ID} --instance-type t3.micro --count 1",
        f"  aws ec2 describe-instances --endpoint-url {endpoint}",
    ]
    if controller_url:
        lines += [
            "",
            "A worker pool on these nodes (each replica: one t3.small running "
            "`roost worker`):",
            "",
            f"  {env}",
            "  roost pools create demo --orchestrator native \\",
            "    --ref 'type=t3.small; target=mymodule:handle; app_dir=/path/to/app' \\",
            "    --min 0 --max 4 --target 10 --cpu-milli 2000 --memory-mib 2048 "
            "--db-pool-size 2",
        ]
    lines += [
        "",
        f"`roost status --endpoint {endpoint}` shows the nodes. Ctrl-C stops everything.",
    ]
    return "\n".join(lines)


async def run_until_signalled(cluster: LocalCluster, on_ready: Callable[[], str]) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await run_until(cluster, on_ready, stop=stop)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def run_until(cluster: LocalCluster, on_ready: Callable[[], str], *,
                    stop: asyncio.Event) -> None:
    """Start ``cluster``, run until ``stop`` is set, then stop it. A stop while it is
    still starting skips the components not yet started, and roost is never announced
    as ready."""
    starting = asyncio.ensure_future(cluster.start())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            click.echo("\nstopping roost before it finished starting ...", err=True)
            cluster.abandon_start()
        if await starting and not stop.is_set():
            click.echo(on_ready())
            # Components that die (Postgres, NATS, the controller) come back, and the
            # terminal is told; a restart under way finishes before the stop begins.
            supervisor = Supervisor(cluster.started, say=lambda m: click.echo(m, err=True))
            await supervisor.run(stop)
            click.echo("\nstopping roost ...", err=True)
    finally:
        stopping.cancel()
        # Cancelled from outside while starting: let the start end first, or what it
        # started after this stop would be left running.
        cluster.abandon_start()
        await asyncio.gather(starting, return_exceptions=True)
        await cluster.stop()
    click.echo("roost stopped.", err=True)


@click.command("up")
@click.option("--nodes", type=click.IntRange(min=1, max=64), default=3, show_default=True,
              help="How many local node agents to run.")
@click.option("--driver", type=click.Choice(["process", "vm", "sim"]), default="process",
              show_default=True,
              help="process: user data runs as a child process; vm: a QEMU micro-VM "
                   "per instance (see `roost images build`); sim: nothing runs.")
@click.option("--isolation", type=click.Choice(list(LEVELS)), default="cgroup",
              show_default=True,
              help="process driver: how instances are held to their type (see `roost node "
                   "--help`); a host that can't runs at the level it can and says so.")
@click.option("--node-capacity", default="8vcpu,32GiB", show_default=True, metavar="CPU,MEM",
              help="What each node offers to instances, e.g. '8vcpu,32GiB'.")
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help=f"Gateway port [default: {DEFAULT_PORT}, or a free one if taken].")
@click.option("--nats-port", type=click.IntRange(0, 65535), default=None,
              help=f"NATS port [default: {DEFAULT_NATS_PORT}, or a free one if taken].")
@click.option("--host", default="127.0.0.1", show_default=True, help="Gateway bind address.")
@click.option("--region", default="roost-1", show_default=True)
@click.option("--policy", type=click.Choice(POLICIES), default=DEFAULT_POLICY,
              show_default=True, help="Placement policy.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path(".roost"), show_default=True,
              help="NATS store, node state and the generated credentials.")
@click.option("--no-controller", is_flag=True,
              help="Run neither Postgres nor the capacity controller.")
@click.option("--controller-port", type=click.IntRange(0, 65535), default=None,
              help=f"Controller HTTP port [default: {DEFAULT_CONTROLLER_PORT}, or a free one "
                   "if taken].")
@click.option("--postgres-port", type=click.IntRange(0, 65535), default=None,
              help=f"Postgres port [default: {DEFAULT_POSTGRES_PORT}, or a free one if taken].")
@click.option("--dashboard-port", type=click.IntRange(0, 65535), default=None,
              help=f"Web dashboard port [default: {DEFAULT_DASHBOARD_PORT}, or a free one if "
                   "taken]; it binds to --host.")
@click.option("--no-dashboard", is_flag=True, help="Serve no web dashboard.")
@click.option("--no-auth", is_flag=True, help="Accept unsigned requests (development only).")
@click.option("--gateway-workers", type=click.IntRange(min=0), default=default_workers(),
              show_default="cores - 1, between 1 and 2",
              help="Gateway processes sharing the port, restarted if they exit; 0 runs the "
                   "gateway on `roost up`'s own event loop.")
@click.option("--no-nats-auth", is_flag=True,
              help="Run NATS without users: any local process may command nodes and read "
                   "every bucket (development only).")
@click.option("--log-level", default="WARNING", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def up(nodes: int, driver: str, isolation: Level, node_capacity: str, port: int | None,
       nats_port: int | None, host: str, region: str, policy: str, data_dir: Path,
       no_controller: bool, controller_port: int | None, postgres_port: int | None,
       dashboard_port: int | None, no_dashboard: bool, no_auth: bool, gateway_workers: int,
       no_nats_auth: bool,
       log_level: str) -> None:
    """Run NATS, Postgres, the EC2 gateway, local nodes and the capacity controller in one
    process, until Ctrl-C.

    Prints the endpoint, the credentials, a ready-to-paste `aws ec2 run-instances` and the
    controller's URL. The controller serves the ``native`` orchestrator (pools as
    instances on these nodes) and ``fake``.
    """
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        parse_quantity(node_capacity)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--node-capacity") from None
    data_dir = data_dir.absolute()
    key, secret = load_or_make_credentials(data_dir)
    spec = ClusterSpec(
        data_dir=data_dir, nodes=nodes, driver=driver, isolation=isolation,
        node_capacity=node_capacity, nats_port=_port(nats_port, DEFAULT_NATS_PORT), host=host,
        port=_port(port, DEFAULT_PORT), region=region, policy=policy, auth=not no_auth,
        credentials={key: secret}, nats_auth=not no_nats_auth, controller=not no_controller,
        operator_key=load_or_make_operator_key(data_dir),
        postgres_port=None if no_controller else _port(postgres_port, DEFAULT_POSTGRES_PORT),
        controller_port=0 if no_controller else (
            _port(controller_port, DEFAULT_CONTROLLER_PORT) or free_port()),
        dashboard_port=None if no_dashboard else _port(dashboard_port, DEFAULT_DASHBOARD_PORT),
        gateway_workers=gateway_workers,
    )
    cluster = LocalCluster(build_components(spec))

    def ready() -> str:
        endpoint = cluster.endpoint
        controller_url = dsn = token = ""
        if spec.controller:
            ctl = cluster.get(ControllerComponent)
            assert isinstance(ctl, ControllerComponent)
            controller_url, dsn = ctl.url, ctl.postgres.dsn
            token = ctl.token_file.read_text().strip()
        nats = cluster.get(NatsComponent)
        assert isinstance(nats, NatsComponent)
        env_file = data_dir / "env"
        env = {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret,
               "AWS_DEFAULT_REGION": region, "AWS_ENDPOINT_URL_EC2": endpoint,
               "ROOST_DSN": dsn, "ROOST_API_TOKEN": token,
               "ROOST_CONTROLLER_URL": controller_url,
               # `roost accounts` / `roost keys` against this cluster:
               "ROOST_NATS": nats.url,
               OPERATOR_KEY_FILE_ENV: str(data_dir / "operator.key"),
               "ROOST_NATS_CREDS": str(nats.auth_dir / "admin.creds.json")
               if spec.nats_auth else ""}
        write_private(env_file, "".join(f"export {k}={shlex.quote(v)}\n"
                                        for k, v in env.items() if v))
        levels = sorted({f"{a.driver.isolation}" + (f" ({a.driver.isolation_note})"
                                                     if a.driver.isolation_note else "")
                         for a in cluster.nodes}) if spec.driver == "process" else []
        board = next((c for c in cluster.components if isinstance(c, DashboardComponent)),
                     None)
        text = banner(spec, endpoint=endpoint, nats_url=nats.url, key=key, secret=secret,
                      controller_url=controller_url, dsn=dsn,
                      dashboard_url=board.url if board else "", isolation=", ".join(levels),
                      env_file=env_file)
        return f"{text}\n(or: source {env_file})"

    try:
        asyncio.run(run_until_signalled(cluster, ready))
    except Exception as exc:
        raise click.ClickException(f"roost up failed: {type(exc).__name__}: {exc}") from None
