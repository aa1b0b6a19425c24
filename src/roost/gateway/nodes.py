"""The gateway's side of the node contract (`roost.bus.subjects`), over NATS.

Three outcomes stay apart here because the caller treats each differently:
  a reply (the node's answer, ok or not)     -> returned as data
  no responders (nobody listens)             -> `NoResponders`: a capacity answer for
                                                anycast, "node gone" for a targeted call
  no reply in time                           -> `NodeTimeout`: the node may have acted;
                                                reconcile by launch id before moving on
NATS itself being unreachable is none of these: it raises ServiceUnavailable at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import msgspec
import nats.errors
from nats.aio.client import Client as NATS

from roost.bus import subjects
from roost.bus.failures import UNREACHABLE
from roost.bus.schemas import (
    CommandReply,
    DescribeTypesReply,
    InstanceCommand,
    InstanceRecord,
    LaunchesFound,
    LaunchLookup,
    LaunchReply,
    LaunchRequest,
    M,
    Msg,
    decode,
    encode,
)
from roost.domain import errors

log = logging.getLogger(__name__)



def now_ms() -> int:
    """Wall clock milliseconds: what an attempt's ``sent_ms`` and a lookup's ``fence_ms``
    compare. Wall, not monotonic, because the asker may be another gateway process (one
    taking over a dead one's launches) or host; the gap they order is a launch timeout,
    seconds, which clock skew between a cluster's hosts stays well within."""
    return time.time_ns() // 1_000_000


def _sent(req: LaunchRequest) -> LaunchRequest:
    """``req`` stamped with the moment it is sent (`LaunchLookup.fence_ms`)."""
    return msgspec.structs.replace(req, sent_ms=now_ms())


class NoResponders(Exception):
    """Nobody subscribes to the subject."""


class NodeTimeout(Exception):
    """A request went out and no reply came back in time."""


class BadReply(Exception):
    """A reply that does not decode as the contract says."""


def error_for_code(code: str, message: str) -> errors.RoostError:
    """The gateway error for an EC2 code a node sent back; unknown codes are internal."""
    return errors.from_code(code, message)


class NodeClient:
    def __init__(self, nc: NATS, *, timeout: float = 5.0) -> None:
        self._nc = nc
        self.timeout = timeout

    @property
    def connected(self) -> bool:
        return bool(self._nc.is_connected)

    def _check(self) -> None:
        if not self._nc.is_connected:
            raise errors.ServiceUnavailable("The message bus (NATS) is unreachable; try again.")

    async def _request(
        self, subject: str, msg: Msg, kind: type[M], timeout: float | None = None
    ) -> M:
        self._check()
        try:
            reply = await self._nc.request(subject, encode(msg), timeout=timeout or self.timeout)
        except nats.errors.NoRespondersError:
            raise NoResponders(subject) from None
        except nats.errors.TimeoutError:
            self._check()  # a timeout while disconnected is the bus's fault, not the node's
            raise NodeTimeout(subject) from None
        except UNREACHABLE:
            raise errors.ServiceUnavailable("The message bus (NATS) is unreachable.") from None
        try:
            return decode(reply.data, kind)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            raise BadReply(f"{subject}: {exc}") from None

    async def launch(self, node_id: str, req: LaunchRequest, *, timeout: float | None = None
                     ) -> LaunchReply:
        return await self._request(subjects.node_launch(node_id), _sent(req), LaunchReply,
                                   timeout)

    async def anycast(self, req: LaunchRequest, *, timeout: float | None = None) -> LaunchReply:
        """Let NATS pick among the nodes that fit one more (the per-type queue group)."""
        subject = subjects.run_instances(req.instance_type)
        return await self._request(subject, _sent(req), LaunchReply, timeout)

    async def command(self, node_id: str, cmd: InstanceCommand) -> CommandReply:
        return await self._request(subjects.node_command(node_id), cmd, CommandReply)

    async def lookup(self, launch_id: str, *, timeout: float | None = None) -> LaunchReply | None:
        """The launch a node holds under ``launch_id``, or None if no node has it."""
        try:
            reply = await self._request(
                subjects.LAUNCH_LOOKUP, LaunchLookup(launch_id=launch_id, fence_ms=now_ms()),
                LaunchReply, timeout)
        except (NoResponders, NodeTimeout):
            return None
        return reply if reply.ok and reply.instance is not None else None

    async def lookup_on(self, node_id: str, launch_id: str, *, timeout: float | None = None
                        ) -> InstanceRecord | None:
        """The launch ``node_id`` holds under ``launch_id``, asked of that node alone
        (`subjects.node_lookup`), or None if it holds none or does not answer. When the
        own subject gets no answer the fan-out is asked instead: a node older than the
        subject has no responders on it, and a gateway whose NATS grant is older than
        the subject sees its request dropped by the server and times out, though the
        node may hold the launch. A node that is truly silent costs a second timeout."""
        try:
            found = await self._request(
                subjects.node_lookup(node_id),
                LaunchLookup(launch_ids=[launch_id], fence_ms=now_ms()), LaunchesFound, timeout)
        except (NoResponders, NodeTimeout):
            reply = await self.lookup(launch_id, timeout=timeout)
            return reply.instance if reply is not None else None
        return next((r for r in found.instances if r.launch_id == launch_id), None)

    async def describe_types(self, *, timeout: float, expect: int = 0) -> list[DescribeTypesReply]:
        """Every node's reply to the fan-out, gathered until ``expect`` replies or timeout."""
        return await self._gather(subjects.DESCRIBE_INSTANCE_TYPES, b"{}", DescribeTypesReply,
                                  timeout=timeout, expect=expect)

    async def lookup_many(self, launch_ids: Sequence[str], *, timeout: float, expect: int
                          ) -> tuple[dict[str, InstanceRecord], bool]:
        """The instances any node holds under ``launch_ids``, and whether ``expect``
        nodes (the live ones) all answered, so that what was not found was not made."""
        replies = await self._gather(
            subjects.LAUNCH_LOOKUP,
            encode(LaunchLookup(launch_ids=list(launch_ids), fence_ms=now_ms())),
            LaunchesFound, timeout=timeout, expect=expect)
        found = {rec.launch_id: rec for r in replies for rec in r.instances}
        return found, len({r.node_id for r in replies}) >= expect

    async def _gather(self, subject: str, payload: bytes, kind: type[M], *, timeout: float,
                      expect: int) -> list[M]:
        """Replies to a fan-out on ``subject``, until ``expect`` of them or the timeout."""
        self._check()
        inbox = self._nc.new_inbox()
        sub = await self._nc.subscribe(inbox)
        replies: list[M] = []
        try:
            await self._nc.publish(subject, payload, reply=inbox)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while not expect or len(replies) < expect:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    msg = await sub.next_msg(timeout=left)
                except nats.errors.TimeoutError:
                    break
                try:
                    replies.append(decode(msg.data, kind))
                except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
                    log.warning("undecodable reply to %s on %s", subject, inbox)
        except UNREACHABLE:
            raise errors.ServiceUnavailable("The message bus (NATS) is unreachable.") from None
        finally:
            try:
                await sub.unsubscribe()
            except UNREACHABLE:
                pass
        return replies
