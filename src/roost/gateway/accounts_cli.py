"""``roost accounts`` and ``roost keys``: the operator's commands for tenants.

They talk to NATS directly, not through a gateway: creating a key seals its secret with
the operator key, which only the operator (and the gateways) hold, and the first key of
a cluster cannot be made through an API that needs a key to call. Every gateway follows
the bucket, so what these commands change takes effect there within moments.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
import msgspec
from nats.aio.client import Client

from roost.bus import subjects
from roost.bus.auth import ENV, NatsAuth
from roost.bus.connect import connect, key_value
from roost.bus.contents import WatchEnded
from roost.domain.accounts import CLASS_NAMES, QUOTA_CLASSES, Quotas, is_account_id
from roost.domain.catalog import BUILTIN
from roost.gateway.accounts import (
    OPERATOR_KEY_ENV,
    OPERATOR_KEY_FILE_ENV,
    AccountError,
    AccountStore,
    load_operator_key,
)
from roost.gateway.quotas import counted_now

T = TypeVar("T")

_nats = click.option("--nats", "nats_urls", envvar="ROOST_NATS", multiple=True,
                     default=["nats://127.0.0.1:4222"], show_default=True,
                     help="NATS server URL. Env: ROOST_NATS.")
_json = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def _run(nats_urls: tuple[str, ...], work: Callable[[AccountStore], Awaitable[T]]) -> T:
    return _run_with(nats_urls, lambda store, _nc: work(store))


def _run_with(nats_urls: tuple[str, ...],
              work: Callable[[AccountStore, Client], Awaitable[T]]) -> T:
    try:
        auth = NatsAuth.from_env()
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"{ENV}: {exc}") from None

    async def main() -> T:
        urls = [u for raw in nats_urls for u in raw.replace(",", " ").split()]
        # The NATS user comes from ROOST_NATS_CREDS (the env file `roost up` writes
        # names its admin user's file), like every other command's --nats-creds.
        nc = await asyncio.wait_for(connect(urls, name="roost-accounts", auth=auth), 10)
        try:
            return await work(AccountStore(await key_value(nc, subjects.ACCOUNTS_BUCKET)), nc)
        finally:
            await nc.close()

    try:
        return asyncio.run(main())
    except AccountError as exc:
        raise click.ClickException(str(exc)) from None
    except (TimeoutError, OSError, WatchEnded) as exc:
        raise click.ClickException(f"cannot reach NATS at {', '.join(nats_urls)}: "
                                   f"{exc!r}") from None


def _operator_key() -> bytes:
    try:
        key = load_operator_key()
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"operator key: {exc}") from None
    if key is None:
        raise click.ClickException(
            f"no operator key: set {OPERATOR_KEY_ENV} or {OPERATOR_KEY_FILE_ENV} (the key "
            "the gateways open secrets with)")
    return key


def _account_id(value: str) -> str:
    if not is_account_id(value):
        raise click.BadParameter(f"an account id is 12 digits, got {value!r}")
    return value


def _echo(data: Any, as_json: bool, lines: list[str]) -> None:
    click.echo(json.dumps(data, indent=2) if as_json else "\n".join(lines))


@click.group("accounts")
def accounts() -> None:
    """Tenants: 12-digit accounts whose keys see only their own resources."""


@accounts.command("create")
@click.argument("name")
@click.option("--id", "account_id", default="", help="12 digits; random when not given.")
@_nats
@_json
def accounts_create(name: str, account_id: str, nats_urls: tuple[str, ...],
                    as_json: bool) -> None:
    """Create an account (no quotas: unlimited until `set-quota`)."""
    if account_id:
        _account_id(account_id)
    acct = _run(nats_urls, lambda s: s.create_account(name, account_id=account_id))
    _echo(msgspec.to_builtins(acct), as_json, [acct.account_id])


@accounts.command("list")
@_nats
@_json
def accounts_list(nats_urls: tuple[str, ...], as_json: bool) -> None:
    """Every account, with how many keys it has."""
    async def work(s: AccountStore) -> list[tuple[Any, int]]:
        keys = await s.keys()
        return [(a, sum(k.account_id == a.account_id for k in keys))
                for a in await s.accounts()]

    rows = _run(nats_urls, work)
    _echo([{**msgspec.to_builtins(a), "keys": n} for a, n in rows], as_json,
          [f"{a.account_id}  {a.name}  keys={n}" for a, n in rows] or ["(no accounts)"])


@accounts.command("show")
@click.argument("account_id", callback=lambda _c, _p, v: _account_id(v))
@_nats
@_json
def accounts_show(account_id: str, nats_urls: tuple[str, ...], as_json: bool) -> None:
    """An account's quotas, what it uses now, and its keys. What it uses is counted as
    the gateways count it: its running instances (read from the instances bucket) and
    the launches in flight."""
    async def work(s: AccountStore, nc: Client) -> tuple[Any, Any, Any, Any]:
        acct = await s.account(account_id)
        if acct is None:
            raise AccountError(f"no account {account_id}")
        usage = await s.usage(account_id)
        counted = await counted_now(await key_value(nc, subjects.INSTANCES_BUCKET),
                                    account_id, usage, BUILTIN.get)
        return acct, usage, counted, await s.keys(account_id)

    acct, usage, (totals, unknown), keys = _run_with(nats_urls, work)
    by_class = totals.vcpus
    q = acct.quotas
    data = {**msgspec.to_builtins(acct),
            "usage": {"vcpus": by_class, "gpus": totals.gpus_milli / 1000,
                      "instances": totals.instances,
                      "launches_in_flight": len(usage.live_holds(time.time())),
                      "instances_of_unknown_types": unknown},
            "keys": [{"access_key_id": k.access_key_id, "admin": k.admin,
                      "created": k.created, "expires": k.expires} for k in keys]}

    def limit(v: float | None) -> str:
        return "unlimited" if v is None else f"{v:g}"

    lines = [f"account {acct.account_id} ({acct.name})", "  vCPUs by class (used / limit):"]
    lines += [f"    {CLASS_NAMES[c]:<40} {by_class.get(c, 0)} / {limit(q.vcpus.get(c))}"
              for c in QUOTA_CLASSES if c in by_class or c in q.vcpus]
    gpu_limit = None if q.gpus_milli is None else q.gpus_milli / 1000
    lines += [f"  GPUs          {totals.gpus_milli / 1000:g} / {limit(gpu_limit)}",
              f"  instances     {totals.instances} / {limit(q.instances)}"]
    if unknown:
        lines.append(f"  ({unknown} running instance(s) of types outside the built-in "
                     "catalog are not in these sums; the gateways count them)")
    lines += ["  keys:"]
    lines += [f"    {k.access_key_id}{'  admin' if k.admin else ''}" for k in keys]
    _echo(data, as_json, lines)


@accounts.command("delete")
@click.argument("account_id", callback=lambda _c, _p, v: _account_id(v))
@_nats
def accounts_delete(account_id: str, nats_urls: tuple[str, ...]) -> None:
    """Delete an account and revoke its keys (its instances keep running: terminate them
    first with one of its keys, or an admin key)."""
    _run(nats_urls, lambda s: s.delete_account(account_id))
    click.echo(f"deleted {account_id}")


@accounts.command("set-quota")
@click.argument("account_id", callback=lambda _c, _p, v: _account_id(v))
@click.option("--vcpus", "vcpus", multiple=True, metavar="CLASS=N",
              help="Running vCPUs of a class: " + ", ".join(QUOTA_CLASSES)
                   + " (standard: A C D H I M R T Z families; g: G and VT). "
                     "N of -1 removes the limit. Repeat for several classes.")
@click.option("--gpus", type=float, default=None, help="GPUs (fractions count); -1: none.")
@click.option("--instances", type=int, default=None, help="Running instances; -1: none.")
@_nats
def accounts_set_quota(account_id: str, vcpus: tuple[str, ...], gpus: float | None,
                       instances: int | None, nats_urls: tuple[str, ...]) -> None:
    """Set an account's quotas. Launches past them answer VcpuLimitExceeded or
    InstanceLimitExceeded; instances already running are not touched."""
    classes: dict[str, int] = {}
    for item in vcpus:
        cls, sep, n = item.partition("=")
        if not sep or cls not in QUOTA_CLASSES or not n.lstrip("-").isdigit():
            raise click.BadParameter(f"expected CLASS=N with CLASS one of "
                                     f"{', '.join(QUOTA_CLASSES)}, got {item!r}",
                                     param_hint="--vcpus")
        classes[cls] = int(n)

    def edit(q: Quotas) -> Quotas:
        limits = {**q.vcpus, **classes}
        return Quotas(
            vcpus={c: n for c, n in limits.items() if n >= 0},
            gpus_milli=q.gpus_milli if gpus is None else (
                None if gpus < 0 else round(gpus * 1000)),
            instances=q.instances if instances is None else (
                None if instances < 0 else instances),
        )

    acct = _run(nats_urls, lambda s: s.set_quotas(account_id, edit))
    click.echo(json.dumps(msgspec.to_builtins(acct.quotas)))


@click.group("keys")
def keys() -> None:
    """Access keys: each acts for one account; an admin key sees every account."""


def _print_secret(key_id: str, secret: str, account_id: str, as_json: bool) -> None:
    data = {"access_key_id": key_id, "secret_access_key": secret, "account_id": account_id}
    _echo(data, as_json, [f"AWS_ACCESS_KEY_ID={key_id}", f"AWS_SECRET_ACCESS_KEY={secret}",
                          "(the secret is shown once: it cannot be read back)"])


@keys.command("create")
@click.argument("account_id", callback=lambda _c, _p, v: _account_id(v))
@click.option("--admin", is_flag=True, help="The key sees and changes every account's "
                                            "resources (for operators).")
@_nats
@_json
def keys_create(account_id: str, admin: bool, nats_urls: tuple[str, ...],
                as_json: bool) -> None:
    """Create a key for an account and print its secret, once."""
    op = _operator_key()
    stored, secret = _run(nats_urls, lambda s: s.create_key(account_id, op, admin=admin))
    _print_secret(stored.access_key_id, secret, account_id, as_json)


@keys.command("list")
@click.option("--account", "account_id", default=None, help="Only this account's keys.")
@_nats
@_json
def keys_list(account_id: str | None, nats_urls: tuple[str, ...], as_json: bool) -> None:
    """Keys and their accounts (never their secrets)."""
    found = _run(nats_urls, lambda s: s.keys(account_id))
    rows = [{"access_key_id": k.access_key_id, "account_id": k.account_id, "admin": k.admin,
             "created": k.created, "expires": k.expires} for k in found]
    _echo(rows, as_json, [f"{r['access_key_id']}  {r['account_id']}"
                          f"{'  admin' if r['admin'] else ''}" for r in rows] or ["(no keys)"])


@keys.command("revoke")
@click.argument("access_key_id")
@_nats
def keys_revoke(access_key_id: str, nats_urls: tuple[str, ...]) -> None:
    """Revoke a key: every gateway refuses it (AuthFailure) within moments."""
    _run(nats_urls, lambda s: s.revoke_key(access_key_id))
    click.echo(f"revoked {access_key_id}")


@keys.command("rotate")
@click.argument("access_key_id")
@click.option("--grace", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Seconds the old key keeps working, for clients to move over.")
@_nats
@_json
def keys_rotate(access_key_id: str, grace: float, nats_urls: tuple[str, ...],
                as_json: bool) -> None:
    """Replace a key with a new one of the same account and role; print the new secret."""
    op = _operator_key()
    stored, secret = _run(nats_urls, lambda s: s.rotate_key(access_key_id, op, grace=grace))
    _print_secret(stored.access_key_id, secret, stored.account_id, as_json)
