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
from dataclasses import dataclass

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.kv import KeyValue

from roost.bus import schemas as s
from roost.bus import subjects
from roost.bus.connect import key_value
from roost.bus.contents import live_entries

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
    """Every record in the bucket that names ``node_id``, read through one watch to the
    end of its contents (`roost.bus.contents`: nats-py's own end-of-contents mark can
    come before every entry); TimeoutError when that takes over ``READ_TIMEOUT``."""
    try:
        values = await live_entries(records, timeout=READ_TIMEOUT)
    except TimeoutError:
        raise TimeoutError(
            f"the records bucket was not read within {READ_TIMEOUT:g} s") from None
    out = []
    for value in values.values():
        try:
            rec = s.decode(value, s.InstanceRecord)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        if rec.node_id == node_id:
            out.append(rec)
    return out
