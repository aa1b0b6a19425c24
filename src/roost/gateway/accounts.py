"""Accounts, access keys and quota usage in the ``roost_accounts`` bucket.

Keys of the bucket:
  ``account.<id>``  an `Account` (name, quotas)
  ``key.<AKID>``    a `StoredKey`: the secret sealed with the operator key
  ``usage.<id>``    a `Usage`: the holds of the account's launches in flight, and what
                    they settled that a mirror may not show yet (`roost.gateway.quotas`)

Only gateways and the operator's ``roost accounts``/``roost keys`` read or write it; nodes
are denied it by NATS permissions (docs/security.md). Secrets are sealed with AES-GCM
under the operator key (``ROOST_OPERATOR_KEY`` or ``ROOST_OPERATOR_KEY_FILE``), bound to
their access key id, so a sealed secret copied onto another key id does not open.

`AccountStore` is the bucket's reads and writes (shared by the CLI and the gateway);
`KeyBook` is a gateway's mirror of it: the verifier and the caller lookup read memory,
so revoking or rotating a key reaches every gateway through the watch, without a restart
and without a KV read per request.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import msgspec
import nats.errors
import nats.js.errors
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from roost.bus.connect import follow_bucket
from roost.bus.contents import live_entries
from roost.bus.failures import BUS_DOWN
from roost.domain.accounts import (
    DEFAULT_ACCOUNT,
    Account,
    Quotas,
    StoredKey,
    Usage,
)
from roost.domain.errors import ServiceUnavailable
from roost.gateway.tenancy import Caller

log = logging.getLogger(__name__)

OPERATOR_KEY_ENV = "ROOST_OPERATOR_KEY"
OPERATOR_KEY_FILE_ENV = "ROOST_OPERATOR_KEY_FILE"
_RETRIES = 64
"""CAS attempts for a usage change; each lost race is another gateway's launch landing."""
READ_TIMEOUT = 30.0
"""Seconds a listing of the bucket waits for its contents (`AccountStore._all`)."""
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"


class AccountError(Exception):
    """A ``roost accounts``/``roost keys`` request that cannot be done (shown as is)."""


# -- the operator key -------------------------------------------------------------------


def new_operator_key() -> str:
    return base64.urlsafe_b64encode(AESGCM.generate_key(bit_length=256)).decode()


def load_operator_key(env: Mapping[str, str] | None = None) -> bytes | None:
    """The operator key from ``ROOST_OPERATOR_KEY`` (base64 of 32 bytes) or from the file
    ``ROOST_OPERATOR_KEY_FILE`` names; None when neither is set."""
    env = os.environ if env is None else env
    raw = env.get(OPERATOR_KEY_ENV, "").strip()
    path = env.get(OPERATOR_KEY_FILE_ENV, "").strip()
    if not raw and path:
        raw = Path(path).read_text().strip()
    if not raw:
        return None
    try:
        key = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("the operator key is not base64") from None
    if len(key) != 32:
        raise ValueError("the operator key must be 32 bytes (base64 of them)")
    return key


def seal(operator_key: bytes, access_key_id: str, secret: str) -> str:
    nonce = os.urandom(12)
    sealed = AESGCM(operator_key).encrypt(nonce, secret.encode(), access_key_id.encode())
    return base64.b64encode(nonce + sealed).decode()


def unseal(operator_key: bytes, access_key_id: str, sealed: str) -> str:
    raw = base64.b64decode(sealed)
    return AESGCM(operator_key).decrypt(raw[:12], raw[12:], access_key_id.encode()).decode()


def new_key_id() -> str:
    """An access key id shaped like AWS's (tools check the shape)."""
    return "AKIA" + "".join(secrets.choice(_ALPHABET) for _ in range(16))


def new_secret() -> str:
    return secrets.token_urlsafe(30)[:40]


def new_account_id() -> str:
    return f"{secrets.randbelow(10**12 - 10**11) + 10**11:012d}"


def _unavailable(exc: BaseException) -> ServiceUnavailable:
    return ServiceUnavailable(f"The account store is unreachable: {exc!r}")


# -- the bucket -------------------------------------------------------------------------


class AccountStore:
    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        self._waiting: dict[str, list[tuple[Callable[[Usage], Usage],
                                            asyncio.Future[Usage]]]] = {}
        """Account -> usage edits waiting for the next write (`change_usage`)."""
        self._writers: dict[str, asyncio.Task[None]] = {}
        self._usage_at: dict[str, tuple[int, Usage]] = {}
        """Account -> the usage revision this store last read or wrote, and its value."""

    async def _get(self, key: str) -> tuple[int, bytes] | None:
        try:
            entry = await self.kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        return entry.revision or 0, entry.value or b""

    async def account(self, account_id: str) -> Account | None:
        found = await self._get(f"account.{account_id}")
        return None if found is None else msgspec.json.decode(found[1], type=Account)

    async def _all(self, prefix: str) -> list[bytes]:
        """The values under ``prefix``, by key. Read through `live_entries`, not
        nats-py's ``keys()``: that stops at its end-of-contents mark, which on a loaded
        host can come before every entry (`roost.bus.contents`), and `roost accounts
        show` then listed an account with no keys."""
        found = await live_entries(self.kv, f"{prefix}>", timeout=READ_TIMEOUT)
        return [found[k] for k in sorted(found)]

    async def accounts(self) -> list[Account]:
        return [msgspec.json.decode(v, type=Account) for v in await self._all("account.")]

    async def keys(self, account_id: str | None = None) -> list[StoredKey]:
        found = [msgspec.json.decode(v, type=StoredKey) for v in await self._all("key.")]
        return [k for k in found if account_id is None or k.account_id == account_id]

    async def create_account(self, name: str, *, account_id: str = "",
                             quotas: Quotas | None = None) -> Account:
        acct = Account(account_id or new_account_id(), name, time.time(), quotas or Quotas())
        try:
            await self.kv.create(f"account.{acct.account_id}", msgspec.json.encode(acct))
        except nats.js.errors.KeyWrongLastSequenceError:
            raise AccountError(f"account {acct.account_id} exists") from None
        return acct

    async def delete_account(self, account_id: str) -> None:
        if await self.account(account_id) is None:
            raise AccountError(f"no account {account_id}")
        for key in await self.keys(account_id):
            await self.kv.delete(f"key.{key.access_key_id}")
        await self.kv.delete(f"account.{account_id}")
        await self.kv.delete(f"usage.{account_id}")

    async def set_quotas(self, account_id: str, edit: Callable[[Quotas], Quotas]) -> Account:
        for _ in range(_RETRIES):
            found = await self._get(f"account.{account_id}")
            if found is None:
                raise AccountError(f"no account {account_id}")
            rev, raw = found
            acct = msgspec.json.decode(raw, type=Account)
            acct = msgspec.structs.replace(acct, quotas=edit(acct.quotas))
            try:
                await self.kv.update(f"account.{account_id}", msgspec.json.encode(acct),
                                     last=rev)
            except nats.js.errors.KeyWrongLastSequenceError:
                continue
            return acct
        raise AccountError(f"account {account_id} is changing too fast; retry")

    async def create_key(self, account_id: str, operator_key: bytes, *, admin: bool = False,
                         key_id: str = "", secret: str = "") -> tuple[StoredKey, str]:
        """A new key and its secret: the only time the secret leaves the bucket sealed."""
        if await self.account(account_id) is None:
            raise AccountError(f"no account {account_id}")
        key_id, secret = key_id or new_key_id(), secret or new_secret()
        stored = StoredKey(key_id, account_id, seal(operator_key, key_id, secret),
                           time.time(), admin=admin)
        try:
            await self.kv.create(f"key.{key_id}", msgspec.json.encode(stored))
        except nats.js.errors.KeyWrongLastSequenceError:
            raise AccountError(f"access key {key_id} exists") from None
        return stored, secret

    async def key(self, key_id: str) -> StoredKey | None:
        found = await self._get(f"key.{key_id}")
        return None if found is None else msgspec.json.decode(found[1], type=StoredKey)

    async def revoke_key(self, key_id: str) -> None:
        if await self.key(key_id) is None:
            raise AccountError(f"no access key {key_id}")
        await self.kv.delete(f"key.{key_id}")

    async def rotate_key(self, key_id: str, operator_key: bytes, *, grace: float = 0.0
                         ) -> tuple[StoredKey, str]:
        """A new key for the same account and role; the old one stops working now, or
        after ``grace`` seconds so that clients can move over."""
        found = await self._get(f"key.{key_id}")
        if found is None:
            raise AccountError(f"no access key {key_id}")
        old = msgspec.json.decode(found[1], type=StoredKey)
        made = await self.create_key(old.account_id, operator_key, admin=old.admin)
        if grace > 0:
            ending = msgspec.structs.replace(old, expires=time.time() + grace)
            await self.kv.update(f"key.{key_id}", msgspec.json.encode(ending), last=found[0])
        else:
            await self.kv.delete(f"key.{key_id}")
        return made

    async def usage(self, account_id: str) -> Usage:
        found = await self._get(f"usage.{account_id}")
        return Usage() if found is None else msgspec.json.decode(found[1], type=Usage)

    async def change_usage(self, account_id: str, edit: Callable[[Usage], Usage]) -> Usage:
        """Apply ``edit`` with compare-and-set on the revision: two gateways reserving at
        once cannot both pass a check the other's reservation would have failed.

        Changes of one account made at once through this store are written together, as
        one compare-and-set (a group commit): each launch and each release is a change of
        the same key, so one write per change would make them race each other, each
        lost race another read and write. Edits run in the order they came, each on what
        the one before it left; one that raises fails only its own caller. The revision
        this store last wrote is the first guess at the current one, so a gateway alone
        on an account reads the key only after another writer moved it; a batch that
        would write nothing on that guess (a refusal, a release already made) is judged
        again on a fresh read, as only a write checks the guess."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Usage] = loop.create_future()
        waiting = self._waiting.setdefault(account_id, [])
        waiting.append((edit, done))
        if account_id not in self._writers:
            writer = loop.create_task(self._write_usage(account_id),
                                      name=f"usage-{account_id}")
            self._writers[account_id] = writer
        return await done

    async def _write_usage(self, account_id: str) -> None:
        """Write the edits waiting for ``account_id`` in batches until none wait."""
        batch: list[tuple[Callable[[Usage], Usage], asyncio.Future[Usage]]] = []
        try:
            while batch := self._waiting.pop(account_id, []):
                try:
                    outcomes = await self._commit_usage(account_id, batch)
                except Exception as exc:  # unreachable, or an unreadable record: all fail
                    outcomes = [exc] * len(batch)
                for (_, done), outcome in zip(batch, outcomes, strict=True):
                    if done.done():
                        continue  # its caller gave up (what it asked may still be written)
                    if isinstance(outcome, BaseException):
                        done.set_exception(outcome)
                    else:
                        done.set_result(outcome)
        finally:
            self._writers.pop(account_id, None)
            # Cancelled (the gateway stopping): no caller is left waiting for good.
            for _, done in [*batch, *self._waiting.pop(account_id, [])]:
                if not done.done():
                    done.cancel()

    async def _commit_usage(self, account_id: str,
                            batch: list[tuple[Callable[[Usage], Usage], asyncio.Future[Usage]]]
                            ) -> list[Usage | Exception]:
        """One compare-and-set of every edit of ``batch``; each edit's outcome, in order."""
        key = f"usage.{account_id}"
        for _ in range(_RETRIES):
            try:
                known = self._usage_at.pop(account_id, None)
                fresh = known is None
                if known is None:
                    found = await self._get(key)
                    known = (0, Usage()) if found is None else (
                        found[0], msgspec.json.decode(found[1], type=Usage))
                rev, current = known
                outcomes: list[Usage | Exception] = []
                updated = current
                for edit, done in batch:
                    if done.done():
                        outcomes.append(current)  # its caller gave up: not applied
                        continue
                    try:
                        updated = edit(updated)
                    except Exception as exc:  # the caller's own (a limit it passes)
                        outcomes.append(exc)
                    else:
                        outcomes.append(updated)
                if updated == current and rev:
                    if not fresh:
                        continue  # judged on what this store wrote last: read what is
                    self._usage_at[account_id] = known
                    return outcomes  # nothing to change (another gateway released it)
                data = msgspec.json.encode(updated)
                if rev:
                    written = await self.kv.update(key, data, last=rev)
                else:
                    written = await self.kv.create(key, data)
            except nats.js.errors.KeyWrongLastSequenceError:
                continue  # another gateway wrote first: read what it wrote
            except BUS_DOWN as exc:
                raise _unavailable(exc) from None
            self._usage_at[account_id] = (written, updated)
            return outcomes
        raise ServiceUnavailable(f"Quota usage of {account_id} is changing too fast; retry.")


# -- a gateway's mirror -----------------------------------------------------------------


class KeyBook:
    """Access key id -> secret and caller, followed from the bucket and seeded with the
    static ``--credentials`` keys. Those are the operator's, given on the command line:
    they act for the default account and see every account (admin), as every key did
    before accounts. The verifier's ``get`` is a dict lookup."""

    def __init__(self, static: Mapping[str, str], *, operator_key: bytes | None,
                 default_account: str = DEFAULT_ACCOUNT) -> None:
        self._static = dict(static)
        self._operator_key = operator_key
        self._default = default_account
        self._secrets: dict[str, str] = dict(static)
        self._callers: dict[str, Caller] = {k: Caller(default_account, admin=True)
                                            for k in static}
        self._expires: dict[str, float] = {}
        self.accounts: dict[str, Account] = {}
        self.synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def get(self, key_id: str) -> str | None:
        ends = self._expires.get(key_id)
        if ends is not None and time.time() >= ends:
            return None
        return self._secrets.get(key_id)

    def caller(self, key_id: str) -> Caller:
        return self._callers.get(key_id) or Caller(self._default)

    def quotas(self, account_id: str) -> Quotas | None:
        """The account's quotas; None for an account with no record (the default one of
        static keys), whose launches are not counted."""
        acct = self.accounts.get(account_id)
        return None if acct is None else acct.quotas

    def start(self, kv: KeyValue) -> None:
        self._task = asyncio.create_task(
            follow_bucket(kv, "accounts", on_entry=self._on_entry, synced=self.synced),
            name="watch-accounts")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _forget(self, key_id: str) -> None:
        if key_id in self._static:
            return
        self._secrets.pop(key_id, None)
        self._callers.pop(key_id, None)
        self._expires.pop(key_id, None)

    def _on_entry(self, entry: KeyValue.Entry) -> None:
        removed = entry.operation in (KV_DEL, KV_PURGE)
        kind, _, name = entry.key.partition(".")
        try:
            if kind == "account":
                if removed:
                    self.accounts.pop(name, None)
                else:
                    self.accounts[name] = msgspec.json.decode(entry.value or b"", type=Account)
            elif kind == "key":
                self._forget(name)
                if not removed:
                    self._learn(msgspec.json.decode(entry.value or b"", type=StoredKey))
        except (msgspec.DecodeError, msgspec.ValidationError):
            log.warning("undecodable accounts entry %s", entry.key)

    def _learn(self, key: StoredKey) -> None:
        if self._operator_key is None:
            log.warning("access key %s is in the accounts bucket but this gateway has no "
                        "operator key (%s or %s) to open it", key.access_key_id,
                        OPERATOR_KEY_ENV, OPERATOR_KEY_FILE_ENV)
            return
        try:
            secret = unseal(self._operator_key, key.access_key_id, key.sealed_secret)
        except (InvalidTag, ValueError, binascii.Error):
            log.warning("access key %s does not open with this gateway's operator key",
                        key.access_key_id)
            return
        self._secrets[key.access_key_id] = secret
        self._callers[key.access_key_id] = Caller(key.account_id, key.admin)
        if key.expires is not None:
            self._expires[key.access_key_id] = key.expires
