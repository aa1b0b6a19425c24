"""What every action handler gets: one request as the actions see it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from roost.gateway.query import Params
from roost.gateway.reads import Ec2Reads
from roost.gateway.service import Ec2Service


@dataclass(frozen=True, slots=True)
class Call:
    """One request as the actions see it."""

    params: Params
    request_id: str
    service: Ec2Service
    reads: Ec2Reads


Action = Callable[[Call], Awaitable[str]]
