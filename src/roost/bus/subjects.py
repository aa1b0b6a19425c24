"""Every NATS subject roost uses. See docs/architecture.md for who publishes what."""

from __future__ import annotations

import re

NODE_QUEUE = "roost-nodes"
"""Queue group for the per-type launch subjects: NATS gives each request to one node."""

DESCRIBE_INSTANCE_TYPES = "ec2.DescribeInstanceTypes"
"""Fan-out (no queue group): every node replies with its types and free counts."""

LAUNCH_LOOKUP = "roost.launch.lookup"
"""Fan-out: the node that holds a launch id replies with it; others stay silent."""

CAPACITY_ALL = "roost.capacity.*"
INSTANCES_BUCKET = "roost_instances"
"""JetStream KV bucket: instance id -> InstanceRecord, written by the owning node."""
TAGS_BUCKET = "roost_instance_tags"
"""JetStream KV bucket: instance id -> its full tag set (JSON object) once CreateTags or
DeleteTags changed it; written by gateways with compare-and-set, never by nodes."""
USER_DATA_BUCKET = "roost_user_data"
"""JetStream KV bucket: instance id -> the base64 user data it was launched with (only
for launches that had some); written by the launching gateway."""
CLIENT_TOKENS_BUCKET = "roost_client_tokens"
"""JetStream KV bucket with a TTL: hash(owner, ClientToken) -> the RunInstances result,
written by gateways."""

NODE_ORDERS_BUCKET = "roost_node_orders"
"""JetStream KV bucket: ``<node>.<instance>`` -> a `NodeOrder` for a node that was lost
when it was given (a deferred terminate), and ``<node>.forgotten`` once an operator ran
`roost node forget`. Written by gateways and the forget command; carried out and
deleted by the node."""

NETWORK_BUCKET = "roost_network"
"""JetStream KV bucket: VPC, subnet and security group id -> record, and
``sgname.<vpc>.<name>`` -> group id; written by gateways, create or compare-and-set."""
ADDRESSES_BUCKET = "roost_addresses"
"""JetStream KV bucket: ``<subnet>.<a_b_c_d>`` -> the launch that holds the private
address; created by the allocating gateway, deleted (by revision) on release."""
KEY_PAIRS_BUCKET = "roost_key_pairs"
"""JetStream KV bucket: base32 key name -> key pair (public half only); gateways."""
VOLUMES_BUCKET = "roost_volumes"
"""JetStream KV bucket: ``vol-…`` -> a volume that lives on its own (created, detached,
or kept after its instance; deleted ones as tombstones); gateways, create or CAS."""
LAUNCH_TEMPLATES_BUCKET = "roost_launch_templates"
ACCOUNTS_BUCKET = "roost_accounts"
"""Accounts, access keys (secrets sealed with the operator key) and quota usage. Read
and written by gateways and the operator's CLI only; nodes are denied it."""
"""JetStream KV bucket: ``lt-…`` -> the template with all its versions (compare-and-set),
``ltname.<base32 name>`` -> its id (create); written by gateways."""
IMAGES_BUCKET = "roost_images"
"""JetStream KV bucket: ``ami-…`` -> a registered image (`roost.domain.images.Image`),
``aminame.<base32 owner/name>`` -> its id (create); written by gateways."""

_NODE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_node_id(node_id: str) -> str:
    if not _NODE_ID.fullmatch(node_id):
        raise ValueError(
            f"node id {node_id!r} must be 1-64 letters, digits, '-' or '_' (it is a subject token)"
        )
    return node_id


def run_instances(instance_type: str) -> str:
    """``ec2.RunInstances.<type>``; a node subscribes only while it fits one more."""
    return f"ec2.RunInstances.{instance_type}"


def node_launch(node_id: str) -> str:
    """Node-targeted launch, always subscribed: the gateway's placement uses it."""
    return f"roost.node.{node_id}.launch"


def node_command(node_id: str) -> str:
    """Stop, start, terminate and describe for the instances a node owns."""
    return f"roost.node.{node_id}.command"


def node_lookup(node_id: str) -> str:
    """One node's own launch lookup: it always answers (`LaunchesFound`), so asking the
    node a launch went to costs one message, where `LAUNCH_LOOKUP` reaches every node."""
    return f"roost.node.{node_id}.lookup"


def node_drain(node_id: str) -> str:
    return f"roost.node.{node_id}.drain"


def capacity(node_id: str) -> str:
    """Capacity snapshots: on every change and as a heartbeat."""
    return f"roost.capacity.{node_id}"


FORGOTTEN = "forgotten"


def node_order(node_id: str, instance_id: str) -> str:
    """The key of an order for ``node_id`` about ``instance_id`` (or `FORGOTTEN`)."""
    return f"{node_id}.{instance_id}"


def node_orders(node_id: str) -> str:
    """The keys a node follows for its orders."""
    return f"{node_id}.>"
