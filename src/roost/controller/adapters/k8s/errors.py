"""Errors of the kubernetes orchestrator, and the one place client errors become the
Protocol's error tree (`roost.controller.orchestrator`): 404 is an unknown pool or
instance, 409 a conflict for the next tick, 401/403 a configuration problem (RBAC),
400/422 a refusal, 429/5xx and transport failures an unavailable orchestrator."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NoReturn

import httpx2
import msgspec
from lightkube import ApiError

from roost.controller.orchestrator import (
    OrchestratorError,
    OrchestratorUnavailable,
    ScaleRejected,
)


class ScaleConflict(OrchestratorError):
    """The Deployment changed between our read and our write (HTTP 409)."""

    kind = "transient"


class UnsafeScaleDown(ScaleRejected):
    """Removing a replica now could remove another pod than the drained one."""

    kind = "transient"


def fail(exc: Exception, what: str, missing: type[OrchestratorError]) -> NoReturn:
    if isinstance(exc, httpx2.TransportError):
        raise OrchestratorUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc
    if isinstance(exc, msgspec.DecodeError | msgspec.ValidationError):
        raise OrchestratorError(f"{what}: unreadable answer: {exc}") from exc
    if isinstance(exc, ApiError):
        code, msg = exc.status.code or exc.response.status_code, exc.status.message or ""
    elif isinstance(exc, httpx2.HTTPStatusError):
        code, msg = exc.response.status_code, exc.response.text[:200]
    else:
        raise exc
    text = f"{what}: HTTP {code}: {msg}"
    if code == 404:
        raise missing(text) from exc
    if code == 409:
        raise ScaleConflict(f"{text} (retried next tick)") from exc
    if code in (401, 403):
        raise OrchestratorError(f"{text} (check the controller's RBAC)") from exc
    if code in (400, 422):
        raise ScaleRejected(text) from exc
    if code == 429 or code >= 500:
        raise OrchestratorUnavailable(text) from exc
    raise OrchestratorError(text) from exc


@contextlib.contextmanager
def api_errors(what: str, missing: type[OrchestratorError] = OrchestratorError) -> Iterator[None]:
    """Client errors become the Protocol's error tree; nothing else leaks out."""
    try:
        yield
    except (httpx2.HTTPError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        fail(exc, what, missing)
