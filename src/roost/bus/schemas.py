"""Message schemas, encoded as JSON with msgspec.

Every message carries ``v`` (schema version). A receiver accepts the versions it knows
and answers others with a ``bad_request`` error instead of guessing. New optional fields
keep ``v``; a change of meaning bumps it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal, TypeVar

import msgspec

from roost.domain.images import Image
from roost.domain.volumes import DEFAULT_ROOT_DEVICE, LaunchVolume

SCHEMA_VERSION = 1

LaunchError = Literal["no_capacity", "draining", "unknown_type", "bad_request", "internal",
                      "unsupported", "image_unavailable"]
"""``unsupported``: this node's driver cannot run the launch (no QEMU, a kernel image
under the process driver) and will not until its operator acts; ``image_unavailable``:
the image's files are not on this node. The gateway places the launch elsewhere and does
not ask this node again for it."""
CommandOp = Literal["stop", "start", "terminate", "describe", "reboot", "console", "modify"]
ShutdownBehavior = Literal["stop", "terminate"]


class Msg(msgspec.Struct, kw_only=True, omit_defaults=True):
    v: int = SCHEMA_VERSION


class LaunchRequest(Msg):
    """Launch one instance. ``launch_id`` is the idempotency key: a node that has seen it
    answers with the instance it launched then, and launches nothing new."""

    launch_id: str
    instance_type: str
    image_id: str
    reservation_id: str
    image: Image | None = None
    """A registered image (RegisterImage) as the gateway knows it; None for a built-in,
    which every node knows by id."""
    user_data: str = ""  # decoded text
    tags: dict[str, str] = {}
    availability_zone: str = ""
    client_token: str = ""
    owner_id: str = ""
    ami_launch_index: int = 0
    gpu_devices: list[int] = []
    """GPU devices the gateway's placement chose on the target node: a hint the node
    follows if they still hold the type, else it picks its own."""
    options: InstanceOptions | None = None
    """Protection, shutdown behaviour and metadata options; None means EC2's defaults."""
    private_ip: str = ""
    """The address the gateway allocated (`roost_addresses`); the node copies it."""
    public_ip: str = ""
    """The public IPv4 address the gateway allocated from its pool, if any (recorded,
    not routed); the node copies it."""
    sent_ms: int = 0
    """The gateway's wall clock, in milliseconds, when it sent this attempt: a node that
    a lookup with ``fence_ms`` found without the launch refuses an attempt sent before
    it (`LaunchLookup.fence_ms`). 0: unknown (a gateway older than the field)."""
    network: InstanceNetwork | None = None
    """Subnet, VPC, groups, key and root volume the gateway chose; the node copies it
    into the record and enforces none of it."""


class InstanceOptions(Msg):
    """What RunInstances and ModifyInstanceAttribute/ModifyInstanceMetadataOptions set on
    an instance besides its type and user data. The node enforces every one of them."""

    disable_api_termination: bool = False
    disable_api_stop: bool = False
    shutdown_behavior: ShutdownBehavior = "stop"
    http_tokens: Literal["optional", "required"] = "optional"
    http_endpoint: Literal["enabled", "disabled"] = "enabled"
    http_put_response_hop_limit: int = 1
    instance_metadata_tags: Literal["enabled", "disabled"] = "disabled"
    http_protocol_ipv6: Literal["enabled", "disabled"] = "disabled"
    """Recorded only: a node's IMDS answers on IPv4 (docs/gateway.md)."""


class InstanceNetwork(Msg):
    """What EC2 shows of an instance's network identity and root volume. Recorded,
    not enforced: see docs/gateway.md."""

    subnet_id: str = ""
    vpc_id: str = ""
    security_group_ids: list[str] = []
    key_name: str = ""
    public_key: str = ""
    """The key pair's public half (OpenSSH), which the node serves at IMDS
    ``public-keys/0/openssh-key``: a key pair deleted later still works, as on EC2."""
    root_device_name: str = DEFAULT_ROOT_DEVICE  # the image's
    root_volume_size: int = 8  # GiB
    root_volume_type: str = "gp2"
    root_volume_iops: int | None = None
    root_volume_throughput: int | None = None
    root_volume_encrypted: bool = False
    root_delete_on_termination: bool = True
    volumes: list[LaunchVolume] = []
    """The launch's mappings beyond the root device (`roost.domain.volumes`)."""
    volume_tags: dict[str, str] = {}
    """TagSpecification ResourceType=volume: the tags of every volume of the launch."""
    tenancy: str = "default"
    monitoring: bool = False
    ebs_optimized: bool = False
    source_dest_check: bool = True
    hibernation: bool = False
    """HibernationOptions.Configured: recorded; roost instances stop, never hibernate."""
    ipv6_addresses: list[str] = []
    """Of the subnet's /64 (Ipv6AddressCount; `roost.domain.network.ipv6_addresses`)."""
    associate_public_ip: bool = False
    """Whether the instance has a public IPv4 address (the launch's
    AssociatePublicIpAddress, else its subnet's MapPublicIpOnLaunch)."""


class InstanceRecord(Msg):
    """An instance as any gateway describes it; the value in the instances KV bucket."""

    instance_id: str
    node_id: str
    instance_type: str
    image_id: str
    state: str
    launch_id: str
    reservation_id: str
    launch_time: str  # ISO 8601, UTC
    availability_zone: str
    tags: dict[str, str] = {}
    state_reason: str = ""
    state_transition_reason: str = ""
    private_ip: str = ""
    public_ip: str = ""
    """From the public IPv4 pool; cleared by the node when the instance stops (the
    gateways then free the claim), a new one given at the next start."""
    client_token: str = ""
    owner_id: str = ""
    ami_launch_index: int = 0
    exit_code: int | None = None
    gpus: list[tuple[int, int]] = []
    updated_at: str = ""
    options: InstanceOptions | None = None  # None: EC2's defaults (`InstanceOptions()`)
    network: InstanceNetwork | None = None  # from the LaunchRequest; None before VPCs

    @property
    def net(self) -> InstanceNetwork:
        return self.network or DEFAULT_NETWORK

    @property
    def shown_public_ip(self) -> str:
        """The public IPv4 address EC2 shows: none once the instance is stopped or
        terminated (its claim may outlive that by a sweep's period)."""
        return self.public_ip if self.state in ("pending", "running", "shutting-down") else ""

    @property
    def opts(self) -> InstanceOptions:
        return self.options or DEFAULT_OPTIONS


class LaunchReply(Msg):
    launch_id: str
    ok: bool
    node_id: str
    instance: InstanceRecord | None = None
    error: LaunchError | None = None
    message: str = ""


class InstanceCommand(Msg):
    op: CommandOp
    instance_id: str
    force: bool = False
    changes: InstanceChanges | None = None  # op "modify" only
    public_ip: str = ""
    """Op "start" only: the public IPv4 address the gateway claimed for the instance
    (EC2 gives a stopped instance's address back and assigns a new one on start)."""


class InstanceChanges(Msg):
    """One ModifyInstanceAttribute or ModifyInstanceMetadataOptions call: the fields that
    are set are changed, the rest stay."""

    options: InstanceOptions | None = None
    instance_type: str | None = None
    user_data: str | None = None  # decoded text; "" clears it
    network: InstanceNetwork | None = None
    """The recorded network attributes, whole (ModifyInstanceAttribute SourceDestCheck,
    EbsOptimized): the node stores them and enforces none."""


class CommandReply(Msg):
    ok: bool
    instance: InstanceRecord | None = None
    previous_state: str = ""
    error: str = ""  # an EC2 error code when not ok
    message: str = ""
    console: str = ""  # op "console": the tail of the console, base64
    console_at: str = ""  # op "console": when it was read, ISO 8601 UTC


class CapacitySnapshot(Msg):
    """A node's free capacity. ``seq`` grows with every snapshot of one agent run;
    ``boot_id`` changes when the agent restarts, so receivers can tell a restart from
    a reordering."""

    node_id: str
    boot_id: str
    seq: int
    availability_zone: str
    draining: bool
    alloc_cpu_milli: int
    alloc_mem_mib: int
    free_cpu_milli: int
    free_mem_mib: int
    gpu_free: list[int] = []
    gpu_models: list[str] = []
    fit: dict[str, int] = {}
    instances: int = 0
    heartbeat_seconds: float = 2.0
    sent_at: float = 0.0  # the node's wall clock, seconds since the epoch
    isolation: str = ""  # "none" | "cgroup" | "sandbox"; "" from a node before isolation
    isolation_note: str = ""  # why isolation is lower than the node was asked for
    cannot_launch: str = ""
    """Why the node's driver can launch nothing now (no QEMU): gateways place nothing
    there, and answer Unsupported, with this, when only such nodes fit."""


class TypeInfo(Msg):
    name: str
    cpu_milli: int
    mem_mib: int
    gpu_count: int = 0
    gpu_milli: int = 0
    gpu_model: str = ""  # the first of gpu_models, for gateways that read only this
    gpu_models: list[str] = []  # any of these models; empty for any
    free: int = 0


class DescribeTypesReply(Msg):
    node_id: str
    types: list[TypeInfo]


class LaunchLookup(Msg):
    """One launch id: only the node that holds it answers (a `LaunchReply`). Several
    (``launch_ids``): every node answers, with a `LaunchesFound`, so the asker stops
    waiting once each live node has spoken rather than at a timeout."""

    launch_id: str = ""
    launch_ids: list[str] = msgspec.field(default_factory=list)
    fence_ms: int = 0
    """The asker's wall clock, in milliseconds. A node that does not hold a launch asked
    for makes none from an attempt sent before this (`LaunchRequest.sent_ms`), so that
    "not found" stays true: an attempt still queued on a stalled node, answered for
    before it ran, is refused when it runs, not made beside the instance the gateway
    places elsewhere. 0: no fence (an asker older than the field)."""


class LaunchesFound(Msg):
    node_id: str
    instances: list[InstanceRecord] = msgspec.field(default_factory=list)


class DrainRequest(Msg):
    shutdown: bool = True


class DrainReply(Msg):
    node_id: str
    draining: bool
    instances: int


DEFAULT_OPTIONS = InstanceOptions()
DEFAULT_NETWORK = InstanceNetwork()

M = TypeVar("M", bound=Msg)


class NodeOrder(Msg):
    """What a lost node must do when it is back (see `subjects.NODE_ORDERS_BUCKET`)."""

    op: Literal["terminate"] = "terminate"
    reason: str = "Client.UserInitiatedShutdown"
    note: str = "User initiated"
    at: str = ""


def now_iso() -> str:
    """Now, as records stamp it: ISO 8601 UTC with milliseconds."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def stamp_seconds(iso: str) -> float:
    """A record's stamp (`now_iso`) as POSIX seconds; an unreadable one counts as old."""
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def encode(msg: Msg) -> bytes:
    return msgspec.json.encode(msg)


def decode(data: bytes, kind: type[M]) -> M:
    """Decode ``data`` as ``kind``; raises `msgspec.ValidationError`/`DecodeError` on bad
    input and ValueError on an unknown schema version."""
    msg = msgspec.json.decode(data, type=kind)
    if msg.v != SCHEMA_VERSION:
        raise ValueError(f"unsupported schema version {msg.v} for {kind.__name__}")
    return msg
