"""`roost node forget NODE`: an operator declares a silent node's host gone for good.

What it writes, and why it may (docs/architecture.md, "Lost nodes"): for every record of
the node that is not terminated yet, a terminate order (so the node, should it come back
after all, terminates what survived), then the record itself as ``terminated``; last the
``<node>.forgotten`` marker, on which gateways drop the node from their view. Forget is
the one writer of a node's records besides the node, and only while the node is silent.
Run twice, it does the same thing twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.kv import KeyValue

from roost.bus import schemas as s
from roost.bus import subjects
from roost.bus.connect import key_value

REASON = "Server.InternalError"


class NodeAlive(Exception):
    """The node still heartbeats: drain it, do not forget it."""


@dataclass(frozen=True, slots=True)
class Forgotten:
    node_id: str
    terminated: tuple[str, ...]


async def forget_node(nc: Client, node_id: str, *, listen: float) -> Forgotten:
    """Forget ``node_id`` unless a capacity snapshot from it arrives within ``listen``
    seconds (a few of its heartbeats)."""
    subjects.check_node_id(node_id)
    await _refuse_if_alive(nc, node_id, listen)
    records = await key_value(nc, subjects.INSTANCES_BUCKET)
    orders = await key_value(nc, subjects.NODE_ORDERS_BUCKET, direct=True)
    at = s.now_iso()
    note = (f"The host of node {node_id} was declared lost by an operator (roost node "
            f"forget) at {at}")
    order = s.encode(s.NodeOrder(op="terminate", reason=REASON, note=note, at=at))
    done = []
    for rec in await _records_of(records, node_id):
        if rec.state == "terminated":
            continue
        await orders.put(subjects.node_order(node_id, rec.instance_id), order)
        await records.put(rec.instance_id, s.encode(msgspec.structs.replace(
            rec, state="terminated", state_reason=REASON, state_transition_reason=note,
            updated_at=s.now_iso())))
        done.append(rec.instance_id)
    await orders.put(subjects.node_order(node_id, subjects.FORGOTTEN), order)
    return Forgotten(node_id, tuple(sorted(done)))


async def _refuse_if_alive(nc: Client, node_id: str, listen: float) -> None:
    heard: asyncio.Future[s.CapacitySnapshot] = asyncio.get_running_loop().create_future()

    async def on_snapshot(msg: Msg) -> None:
        if not heard.done():
            try:
                heard.set_result(s.decode(msg.data, s.CapacitySnapshot))
            except (msgspec.DecodeError, msgspec.ValidationError):
                pass

    sub = await nc.subscribe(subjects.capacity(node_id), cb=on_snapshot)
    try:
        snap = await asyncio.wait_for(heard, listen)
    except TimeoutError:
        return
    finally:
        await sub.unsubscribe()
    raise NodeAlive(f"node {node_id} is alive (heartbeat every {snap.heartbeat_seconds:g} s, "
                    f"{snap.instances} instances): drain it with `roost node --node-id "
                    f"{node_id} drain` instead")


READ_TIMEOUT = 30.0
"""Seconds a read of the whole records bucket may take."""


async def _records_of(records: KeyValue, node_id: str) -> list[s.InstanceRecord]:
    """Every record in the bucket that names ``node_id``, read through one watch.

    The read goes on until the entry at the bucket's last sequence when it began has
    come, not only until the watcher's end-of-contents marker: nats-py sets that marker
    from a consumer-info read that can race the first messages, and put it before any
    entry (seen as "0 instances marked terminated" for a node that held 30). A watch
    delivers the last entry of each key in sequence order, so the entry at the last
    sequence comes last. Should it never come (it expired meanwhile), the read ends
    at the marker after ``READ_TIMEOUT`` seconds."""
    # nats-py keeps the bucket's stream and JetStream context private
    last = (await records._js.stream_info(records._stream)).state.last_seq
    out = []

    def take(entry: KeyValue.Entry) -> None:
        if entry.operation is not None or not entry.value:
            return  # a delete or purge marker
        try:
            rec = s.decode(entry.value, s.InstanceRecord)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return
        if rec.node_id == node_id:
            out.append(rec)

    watcher = await records.watchall()
    try:
        ended = await read_through(_until(watcher, READ_TIMEOUT), last, take)
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]
    if not ended:
        raise TimeoutError(f"the records bucket was not read within {READ_TIMEOUT:g} s")
    return out


async def read_through(entries: AsyncIterator[KeyValue.Entry | None], last: int,
                       take: Callable[[KeyValue.Entry], None]) -> bool:
    """Hand a watch's entries to ``take`` up to the one at sequence ``last`` (or later),
    whatever the end-of-contents marker (None) says; whether the marker came at all
    (the contents were delivered, as far as the watcher knows)."""
    newest, ended = 0, False
    async for entry in entries:
        if entry is None:
            ended = True
        else:
            take(entry)
            newest = max(newest, entry.revision or 0)
        if ended and newest >= last:
            break
    return ended


async def _until(watcher: AsyncIterator[KeyValue.Entry | None], seconds: float
                 ) -> AsyncIterator[KeyValue.Entry | None]:
    """The watcher's entries until ``seconds`` have passed (then it just stops)."""
    deadline = asyncio.get_running_loop().time() + seconds
    it = watcher.__aiter__()
    while True:
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            return
        try:
            entry = await asyncio.wait_for(it.__anext__(), left)
        except (StopAsyncIteration, TimeoutError):
            return
        yield entry
