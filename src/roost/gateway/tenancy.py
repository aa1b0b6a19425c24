"""Who is calling: the one place the gateway scopes what a request sees to its account.

The EC2 endpoint sets the caller (`acting_as`) once SigV4 has named the key; the
mirrors every action reads through (`InstanceIndex`, `NetworkStore`, `TemplateStore`)
ask `visible` before they return anything, and whatever a request creates is stamped
with `account()`. So another account's resource is simply not there: every action
answers about it exactly as about one that never existed (EC2's ``...NotFound``),
through filters, pagination and ClientToken alike, without a check in any action.

Outside a request (the mirrors' own watches, sweeps, background chores) there is no
caller and everything is visible: those are the gateway's own work, not a tenant's.
An admin key sees every account, as operators need to.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from roost.domain.accounts import DEFAULT_ACCOUNT


@dataclass(frozen=True, slots=True)
class Caller:
    account_id: str
    admin: bool = False


_CALLER: ContextVar[Caller | None] = ContextVar("roost_caller", default=None)


def caller() -> Caller | None:
    return _CALLER.get()


def account(default: str = DEFAULT_ACCOUNT) -> str:
    """The account what this request creates belongs to."""
    who = _CALLER.get()
    return default if who is None else who.account_id


def visible(owner_id: str) -> bool:
    """Whether the caller may see (and so change) a resource of ``owner_id``. A record
    without an owner predates accounts and belongs to the default account."""
    who = _CALLER.get()
    return who is None or who.admin or (owner_id or DEFAULT_ACCOUNT) == who.account_id


@contextmanager
def acting_as(who: Caller | None) -> Iterator[None]:
    token = _CALLER.set(who)
    try:
        yield
    finally:
        _CALLER.reset(token)
