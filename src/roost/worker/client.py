"""A Python client for the task API that every ``roost controller`` replica serves.

    from roost.worker.client import TasksClient

    with TasksClient("http://127.0.0.1:9180", token="rpt_...") as tasks:
        sub = tasks.submit("demo", {"n": 1}, idempotency_key="order-17")
        done = tasks.wait(sub.id, timeout=60)

The token is a bearer token of the pool (or of every pool), made with
``roost tokens create``; without ``token=`` the client reads ``ROOST_API_TOKEN``.
`AsyncTasksClient` is the same with ``await``. A request with an idempotency key can be
repeated safely after a timeout or a dropped connection: the repeat returns the task
the first one created. Errors come back as `TaskApiError` with the problem details.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any

import httpx

FINAL = frozenset({"succeeded", "failed"})
TOKEN_ENV = "ROOST_API_TOKEN"


class TaskApiError(Exception):
    """A problem details answer (RFC 9457) from the task API."""

    def __init__(self, status: int, title: str, detail: str = "") -> None:
        super().__init__(f"{status} {title}" + (f": {detail}" if detail else ""))
        self.status, self.title, self.detail = status, title, detail


@dataclass(frozen=True, slots=True)
class Submitted:
    id: str
    pool: str
    created: bool


@dataclass(frozen=True, slots=True)
class TaskInfo:
    id: str
    pool: str
    status: str
    attempts: int
    max_attempts: int
    result: Any
    error: str | None
    idempotency_key: str | None
    created_at: str
    finished_at: str | None

    @property
    def finished(self) -> bool:
        return self.status in FINAL


@dataclass(frozen=True, slots=True)
class PoolInfo:
    pool: str
    queued: int
    running: int
    succeeded: int
    failed: int
    replicas: int | None
    desired: int | None
    desired_valid_until: str | None
    active_workers: int
    draining_workers: int


def _submit_body(payload: Any, idempotency_key: str | None,
                 max_attempts: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"payload": payload}
    if idempotency_key is not None:
        body["idempotencyKey"] = idempotency_key
    if max_attempts is not None:
        body["maxAttempts"] = max_attempts
    return body


def _headers(token: str | None) -> dict[str, str]:
    token = token if token is not None else os.environ.get(TOKEN_ENV)
    return {"authorization": f"Bearer {token}"} if token else {}


def _checked(r: httpx.Response) -> Any:
    if r.is_success:
        return r.json()
    try:
        doc = r.json()
        title, detail = str(doc.get("title", r.reason_phrase)), str(doc.get("detail", ""))
    except ValueError:
        title, detail = r.reason_phrase, r.text[:200]
    raise TaskApiError(r.status_code, title, detail)


def _submitted(doc: Any) -> Submitted:
    return Submitted(str(doc["id"]), str(doc["pool"]), bool(doc["created"]))


def _task(doc: Any) -> TaskInfo:
    return TaskInfo(
        id=str(doc["id"]), pool=str(doc["pool"]), status=str(doc["status"]),
        attempts=int(doc["attempts"]), max_attempts=int(doc["maxAttempts"]),
        result=doc["result"], error=doc["error"], idempotency_key=doc["idempotencyKey"],
        created_at=str(doc["createdAt"]), finished_at=doc["finishedAt"],
    )


def _pool(doc: Any) -> PoolInfo:
    return PoolInfo(
        pool=str(doc["pool"]), queued=int(doc["queued"]), running=int(doc["running"]),
        succeeded=int(doc["succeeded"]), failed=int(doc["failed"]),
        replicas=doc["replicas"], desired=doc["desired"],
        desired_valid_until=doc["desiredValidUntil"],
        active_workers=int(doc["workers"]["active"]),
        draining_workers=int(doc["workers"]["draining"]),
    )


class TasksClient:
    def __init__(self, base_url: str, *, token: str | None = None, timeout: float = 10.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self._http = httpx.Client(base_url=base_url, timeout=timeout, transport=transport,
                                  headers=_headers(token))

    def __enter__(self) -> TasksClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def submit(self, pool: str, payload: Any, *, idempotency_key: str | None = None,
               max_attempts: int | None = None) -> Submitted:
        r = self._http.post(f"/api/v1/pools/{pool}/tasks",
                            json=_submit_body(payload, idempotency_key, max_attempts))
        return _submitted(_checked(r))

    def get(self, task_id: str) -> TaskInfo:
        return _task(_checked(self._http.get(f"/api/v1/tasks/{task_id}")))

    def pool(self, pool: str) -> PoolInfo:
        return _pool(_checked(self._http.get(f"/api/v1/pools/{pool}")))

    def wait(self, task_id: str, *, timeout: float = 60.0, every: float = 0.2) -> TaskInfo:
        """Poll until the task has succeeded or failed for good."""
        deadline = time.monotonic() + timeout
        while not (task := self.get(task_id)).finished:
            if time.monotonic() > deadline:
                raise TimeoutError(f"task {task_id} is still {task.status}")
            time.sleep(every)
        return task


class AsyncTasksClient:
    def __init__(self, base_url: str, *, token: str | None = None, timeout: float = 10.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._http = httpx.AsyncClient(base_url=base_url, timeout=timeout,
                                       transport=transport, headers=_headers(token))

    async def __aenter__(self) -> AsyncTasksClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def submit(self, pool: str, payload: Any, *, idempotency_key: str | None = None,
                     max_attempts: int | None = None) -> Submitted:
        r = await self._http.post(f"/api/v1/pools/{pool}/tasks",
                                  json=_submit_body(payload, idempotency_key, max_attempts))
        return _submitted(_checked(r))

    async def get(self, task_id: str) -> TaskInfo:
        return _task(_checked(await self._http.get(f"/api/v1/tasks/{task_id}")))

    async def pool(self, pool: str) -> PoolInfo:
        return _pool(_checked(await self._http.get(f"/api/v1/pools/{pool}")))

    async def wait(self, task_id: str, *, timeout: float = 60.0,
                   every: float = 0.2) -> TaskInfo:
        deadline = time.monotonic() + timeout
        while not (task := await self.get(task_id)).finished:
            if time.monotonic() > deadline:
                raise TimeoutError(f"task {task_id} is still {task.status}")
            await asyncio.sleep(every)
        return task


def submit_task(base_url: str, pool: str, payload: Any, *, token: str | None = None,
                idempotency_key: str | None = None) -> str:
    """Submit one task and return its id: the one-call form of `TasksClient.submit`."""
    with TasksClient(base_url, token=token) as client:
        return client.submit(pool, payload, idempotency_key=idempotency_key).id
