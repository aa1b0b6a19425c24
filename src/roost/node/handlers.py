"""The node's side of the bus contract (`roost.bus.subjects`): decode each message, hand
it to the agent, send back the answer. Nothing here decides anything; the agent does.

Every request gets an answer in the contract's own shape, a malformed one included, so
a gateway never waits out a timeout for a message the node could not read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from roost.bus import schemas as s
from roost.bus import subjects
from roost.node.subscriptions import TypeSubscriptions

if TYPE_CHECKING:
    from roost.node.agent import NodeAgent

log = logging.getLogger(__name__)
Handler = Callable[[Msg], Awaitable[None]]
_BAD = (msgspec.DecodeError, msgspec.ValidationError, ValueError)


class BusHandlers:
    def __init__(self, agent: NodeAgent) -> None:
        self.agent = agent
        self.slots = asyncio.Semaphore(agent.config.max_inflight)

    async def subscribe(self, nc: Client) -> TypeSubscriptions:
        """Subscribe to the node's own subjects and the fan-outs; the per-type launch
        subjects are returned for the agent to keep in step with what fits."""
        node_id = self.agent.node_id
        await nc.subscribe(subjects.node_launch(node_id), cb=self._spawn(self.on_launch))
        await nc.subscribe(subjects.node_command(node_id), cb=self._spawn(self.on_command))
        await nc.subscribe(subjects.node_drain(node_id), cb=self._spawn(self.on_drain))
        await nc.subscribe(subjects.DESCRIBE_INSTANCE_TYPES, cb=self.on_describe_types)
        await nc.subscribe(subjects.LAUNCH_LOOKUP, cb=self.on_lookup)
        await nc.subscribe(subjects.node_lookup(node_id), cb=self.on_lookup)
        return TypeSubscriptions(nc, self._spawn(self.on_launch))

    def _spawn(self, handler: Callable[[Msg], Coroutine[Any, Any, None]]) -> Handler:
        """A callback that handles each message in its own task, so one slow launch
        never holds up the subscription, and a subscription drain never waits on the
        handler that triggered it. At most ``max_inflight`` run at once: past that the
        subscription waits (NATS buffers, then reports a slow consumer) instead of the
        node spawning without bound."""

        async def cb(msg: Msg) -> None:
            await self.slots.acquire()
            task = self.agent.track(handler(msg))
            task.add_done_callback(lambda _: self.slots.release())

        return cb

    @staticmethod
    async def _reply(msg: Msg, body: s.Msg) -> None:
        if msg.reply:
            await msg.respond(s.encode(body))

    async def on_launch(self, msg: Msg) -> None:
        try:
            req = s.decode(msg.data, s.LaunchRequest)
        except _BAD as exc:
            await self._reply(msg, s.LaunchReply(launch_id="", ok=False,
                                                 node_id=self.agent.node_id,
                                                 error="bad_request", message=str(exc)))
            return
        await self._reply(msg, await self.agent.launch(req))

    async def on_command(self, msg: Msg) -> None:
        agent = self.agent
        try:
            cmd = s.decode(msg.data, s.InstanceCommand)
        except _BAD as exc:
            await self._reply(msg, s.CommandReply(ok=False, error="InvalidParameterValue",
                                                  message=str(exc)))
            return
        if not agent.holds(cmd.instance_id):
            reply = s.CommandReply(ok=False, error="InvalidInstanceID.NotFound",
                                   message=f"instance {cmd.instance_id} is not on "
                                           f"{agent.node_id}")
        else:
            try:
                reply = await agent.command(cmd)
            except Exception as exc:  # answer, so the gateway never waits out a timeout
                log.exception("node %s: %s of %s failed", agent.node_id, cmd.op,
                              cmd.instance_id)
                reply = s.CommandReply(ok=False, error="InternalError",
                                       message=f"node {agent.node_id}: {cmd.op} failed: {exc}")
        await self._reply(msg, reply)

    async def on_drain(self, msg: Msg) -> None:
        try:
            req = s.decode(msg.data, s.DrainRequest) if msg.data else s.DrainRequest()
        except _BAD:
            req = s.DrainRequest()
        agent = self.agent
        await agent.drain()
        await self._reply(msg, s.DrainReply(node_id=agent.node_id, draining=True,
                                            instances=agent.ledger.count))
        if req.shutdown:
            agent.track(agent.stop())

    async def on_describe_types(self, msg: Msg) -> None:
        await self._reply(msg, self.agent.describe_types())

    async def on_lookup(self, msg: Msg) -> None:
        try:
            req = s.decode(msg.data, s.LaunchLookup)
        except _BAD:
            return  # a lookup is a fan-out: the node that holds the launch answers
        if req.launch_ids:
            held = (self.agent.lookup(lid, fence_ms=req.fence_ms) for lid in req.launch_ids)
            await self._reply(msg, s.LaunchesFound(
                node_id=self.agent.node_id,
                instances=[r.instance for r in held if r is not None and r.instance]))
            return
        found = self.agent.lookup(req.launch_id, fence_ms=req.fence_ms)
        if found is not None:
            await self._reply(msg, found)
