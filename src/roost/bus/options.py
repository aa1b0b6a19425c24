"""The ``--nats-creds`` option every command that talks to NATS takes, and ``roost
nats-auth``, which writes users and credentials for a cluster run by hand."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from roost.bus.auth import ENV, ClusterAuth, NatsAuth


def nats_creds_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Adds ``nats_auth: NatsAuth | None`` (from ``--nats-creds FILE`` or
    ``ROOST_NATS_CREDS``) to a click command."""

    def load(ctx: click.Context, param: click.Parameter, value: Path | None) -> NatsAuth | None:
        if value is None:
            return None
        try:
            return NatsAuth.load(value)
        except (OSError, ValueError) as exc:
            raise click.BadParameter(str(exc)) from None

    return click.option(
        "--nats-creds", "nats_auth", envvar=ENV, show_envvar=True, default=None,
        type=click.Path(exists=True, dir_okay=False, path_type=Path), callback=load,
        help="NATS credentials: JSON {user, password[, tls_ca, tls_cert, tls_key]} as "
             "`roost up` writes them, or a NATS .creds file. Without it: anonymous.",
    )(fn)


@click.command("nats-auth")
@click.argument("node_ids", nargs=-1, required=True)
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path),
              required=True, help="Directory to write (made 0700).")
def nats_auth_command(node_ids: tuple[str, ...], out: Path) -> None:
    """Write NATS users for a cluster: the ``authorization`` block for nats-server
    (``OUT/nats.conf``, include it from your server config) and one 0600 credentials
    file per user (admin, gateway, and each NODE_ID) for ``--nats-creds``. Fresh
    passwords each time: restart nats-server and the components with the new files."""
    try:
        auth = ClusterAuth.generate(node_ids)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="NODE_IDS") from None
    conf = auth.write(out)
    click.echo(f"wrote {conf} and {len(auth.users)} credentials files in {out}")
