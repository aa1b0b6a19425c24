"""A native pool's worker gets its DSN by exchanging the enrollment token from its user
data with the controller (`roost.controller.enrollment`), never from the user data."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

import httpx

ENV_TOKEN = "ROOST_WORKER_ENROLL_TOKEN"
ENV_URL = "ROOST_WORKER_ENROLL_URL"
ENV_INSTANCE = "ROOST_INSTANCE_ID"


class EnrollmentFailed(Exception):
    pass


def enrollment_requested(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return bool(env.get(ENV_TOKEN) and env.get(ENV_URL))


def fetch_dsn(environ: Mapping[str, str] | None = None, *, attempts: int = 5,
              timeout: float = 10.0) -> str:
    """The DSN the controller hands this instance. Retries a controller that is down or
    answers 503 (it checks the instance with the gateway); a 403 is final."""
    env = os.environ if environ is None else environ
    token, url, instance = env.get(ENV_TOKEN, ""), env.get(ENV_URL, ""), env.get(ENV_INSTANCE, "")
    if not (token and url and instance):
        raise EnrollmentFailed(f"enrolling needs {ENV_TOKEN}, {ENV_URL} and {ENV_INSTANCE}")
    last = ""
    for attempt in range(attempts):
        try:
            r = httpx.post(url.rstrip("/") + "/api/v1/worker-credentials",
                           json={"token": token, "instanceId": instance}, timeout=timeout)
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if r.status_code == 200:
                return str(r.json()["dsn"])
            last = f"HTTP {r.status_code}: {r.text[:200]}"
            if r.status_code < 500:
                break
        time.sleep(min(0.5 * 2 ** attempt, 5.0))
    raise EnrollmentFailed(f"the controller at {url} did not enroll instance {instance}: "
                           f"{last}")
