"""The ``--nats-creds`` option every command that talks to NATS takes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from roost.bus.auth import ENV, NatsAuth


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
