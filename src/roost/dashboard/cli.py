"""``roost dashboard``: the web dashboard on its own, against a running cluster."""

from __future__ import annotations

import asyncio
import logging
import signal

import click

from roost.bus.auth import NatsAuth
from roost.bus.options import nats_creds_option
from roost.dashboard.access import BindRefused
from roost.dashboard.server import DEFAULT_PORT, Dashboard, DashboardConfig
from roost.gateway.cli import parse_credentials


@click.command("dashboard")
@click.option("--nats", "nats_urls", envvar="ROOST_DASHBOARD_NATS", multiple=True,
              default=["nats://127.0.0.1:4222"], show_default=True,
              help="NATS server URL; repeat for a cluster. Env: ROOST_DASHBOARD_NATS.")
@click.option("--controller", "controller_url", envvar="ROOST_DASHBOARD_CONTROLLER",
              default="", help="The capacity controller's HTTP URL (its /status feeds the "
                               "Pools page). Env: ROOST_DASHBOARD_CONTROLLER.")
@click.option("--gateway-metrics", default="", metavar="URL",
              help="A gateway's /metrics URL, for launch rates and latency.")
@click.option("--ec2-endpoint", default="$AWS_ENDPOINT_URL_EC2", show_default=True,
              help="The EC2 endpoint the AWS CLI commands on the pages name.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Bind address. Off loopback, --credentials is required.")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT,
              show_default=True)
@click.option("--credentials", "credentials", envvar="ROOST_DASHBOARD_CREDENTIALS",
              multiple=True, metavar="KEY:SECRET",
              help="Keys that may drain nodes (HTTP Basic: key id and secret); the "
                   "gateway's keys. Without any the dashboard is read-only. "
                   "Env: ROOST_DASHBOARD_CREDENTIALS.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Seconds between samples and live updates.")
@click.option("--log-level", default="WARNING", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@nats_creds_option
def dashboard(nats_urls: tuple[str, ...], nats_auth: NatsAuth | None, controller_url: str,
              gateway_metrics: str, ec2_endpoint: str, host: str, port: int,
              credentials: tuple[str, ...], interval: float, log_level: str) -> None:
    """Serve the web dashboard for a cluster: capacity, GPUs, instances, pools, events.

    Read-only unless --credentials is given; then the Nodes page can drain a node.
    """
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = DashboardConfig(nats_urls=list(nats_urls), controller_url=controller_url,
                             host=host, port=port, credentials=parse_credentials(credentials),
                             ec2_endpoint=ec2_endpoint, gateway_metrics_url=gateway_metrics,
                             interval=interval, nats_auth=nats_auth)
    try:
        board = Dashboard(config)
    except BindRefused as exc:
        raise click.UsageError(str(exc)) from None

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await board.start()
        mode = "read-only" if not config.credentials else "drain needs credentials"
        click.echo(f"roost dashboard on {board.url} ({mode}). Ctrl-C stops it.")
        try:
            await stop.wait()
        finally:
            await board.stop()

    try:
        asyncio.run(run())
    except OSError as exc:
        raise click.ClickException(f"roost dashboard failed: {exc}") from None
