"""Random and malformed Query bodies, properly signed, never make the gateway fail.

Keys are generated as well as values: every parameter name botocore's EC2 model has for
the actions roost serves, with list indices that are valid, zero-padded, non-ASCII
digits (``²``, ``③``), thousands of digits long, or junk. Every answer must be EC2 XML
with a request id. A 5xx is allowed only for the codes
that mean one: InsufficientInstanceCapacity (EC2 sends it as a 500) and
ServiceUnavailable; InternalError, a bare 500 or a traceback fails the test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from urllib.parse import quote
from xml.etree import ElementTree

import botocore.session
import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.model import ListShape, Shape, StructureShape
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roost.gateway.actions import ACTIONS
from tests.e2e.conftest import ThreadedCluster, make_cluster

ALLOWED_5XX = {"InsufficientInstanceCapacity", "ServiceUnavailable"}
IID = "i-0123456789abcdef0"


def _templates(shape: Shape, prefix: str = "", depth: int = 4) -> Iterator[str]:
    """Query key templates for ``shape`` as botocore's EC2 serializer spells them, with
    ``{}`` where a list index goes: ``Filter.{}.Value.{}``, ``Placement.AvailabilityZone``."""
    if depth == 0:
        yield prefix
    elif isinstance(shape, StructureShape):
        for name, member in shape.members.items():
            query = member.serialization.get("queryName")
            loc = member.serialization.get("name")
            part = query or (loc[0].upper() + loc[1:] if loc else name)
            yield from _templates(member, f"{prefix}.{part}" if prefix else part, depth - 1)
    elif isinstance(shape, ListShape):
        yield from _templates(shape.member, prefix + ".{}", depth)
    else:
        yield prefix


MODEL = botocore.session.get_session().get_service_model("ec2")
NAMES = {op: sorted(_templates(MODEL.operation_model(op).input_shape)) for op in ACTIONS}
"""Every parameter each action takes in EC2, whether roost reads it or not."""
ALL_NAMES = sorted({n for names in NAMES.values() for n in names})
ODD = ["InstanceId.{}.{}", "Filter.{}", "{}", "Filter..Name", "Filter.{}..Value.{}",
       "Tag.{}", "TagSpecification.{}.Tag.{}"]
BASE = {
    "RunInstances": {"ImageId": "ami-00000000000000001", "InstanceType": "t3.micro",
                     "MinCount": "1", "MaxCount": "1"},
    "CreateTags": {"ResourceId.1": IID, "Tag.1.Key": "k", "Tag.1.Value": "v"},
    "DeleteTags": {"ResourceId.1": IID},
    "DescribeInstanceAttribute": {"InstanceId": IID, "Attribute": "instanceType"},
    "ModifyInstanceAttribute": {"InstanceId": IID},
    **{op: {"InstanceId.1": IID} for op in ("StartInstances", "StopInstances",
                                            "TerminateInstances")},
}
"""The required parameters, so that a drawn key is read rather than refused after a
missing ``ImageId``."""
INDICES = st.one_of(
    st.integers(1, 3).map(str), st.integers(1, 3).map(str),       # what botocore sends
    st.sampled_from(["0", "01", "007", "10000", "10001", "99999999", "-1", "+1", "1_0",
                     " 1", "", "x", "1e3", "0x1", "1."]),
    st.text(st.characters(categories=["Nd", "No"]), min_size=1, max_size=3),  # ², ③, ٣
    st.integers(5, 5000).map(lambda n: "9" * n),                  # huge, past int's limit
    st.text(max_size=6),                                          # dotted junk and worse
)


@st.composite
def keys(draw: st.DrawFn, action: str) -> str:
    """Mostly one of ``action``'s EC2 parameter names with each list index drawn from
    `INDICES`; sometimes another action's name, an odd shape, or junk."""
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.text(max_size=20))
    if kind == 1:
        parts = st.one_of(st.sampled_from(ALL_NAMES), INDICES)
        return ".".join(draw(st.lists(parts, min_size=1, max_size=4))).replace("{}", "1")
    names = {2: ODD, 3: ALL_NAMES}.get(kind) or NAMES.get(action) or ALL_NAMES
    template = draw(st.sampled_from(names))
    return template.format(*(draw(INDICES) for _ in range(template.count("{}"))))


VALUES = st.one_of(
    st.sampled_from([
        "", "0", "1", "-1", "5", "99999999999999999999", "true", "false", "t3.micro",
        "t3.*", "nope.large", "ami-00000000000000001", "ami-x", "i-0123456789abcdef0",
        "i-", "instance", "instance-state-name", "tag:Name", "roost-1a", "userData",
        "aGVsbG8=", "!!notbase64", "aws:reserved", "%ZZ", "\x00", "é", "*", "?",
        "\u0661\u0660", "1_0", "²", "9" * 5000,
    ]),
    st.text(max_size=40),
)


@st.composite
def structured_body(draw: st.DrawFn) -> bytes:
    action = draw(st.one_of(*[st.sampled_from(sorted(ACTIONS))] * 7, st.text(max_size=12)))
    base = list(BASE.get(action, {}).items()) if draw(st.booleans()) else []
    rest = draw(st.lists(st.tuples(keys(action), VALUES), max_size=8))
    pairs = [("Action", action), *base, *rest]
    return "&".join(f"{quote(k)}={quote(v)}" for k, v in pairs).encode()


BODIES = st.one_of(structured_body(), structured_body(), structured_body(),
                   st.binary(max_size=200),
                   st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")))


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedCluster]:
    c = make_cluster(tmp_path_factory.mktemp("fuzz"), nodes=1, capacity="4vcpu,8GiB")
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as client:
        yield client


EXAMPLES = int(os.environ.get("ROOST_FUZZ_EXAMPLES", "150"))
"""Small in CI; ``ROOST_FUZZ_EXAMPLES=10000`` for a long run."""


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=BODIES)
def test_any_signed_body_gets_an_ec2_answer(small: ThreadedCluster, http: httpx.Client,
                                             body: bytes) -> None:
    url = small.endpoint + "/"
    req = AWSRequest(method="POST", url=url, data=body,
                     headers={"Content-Type": "application/x-www-form-urlencoded"})
    SigV4Auth(Credentials(small.key, small.secret), "ec2", "roost-1").add_auth(req)
    resp = http.post(url, content=body, headers=dict(req.headers.items()))
    root = ElementTree.fromstring(resp.content)  # always well-formed XML
    if resp.status_code == 200:
        assert root.tag.endswith("Response") and root.find("{*}requestId") is not None
        return
    code = root.findtext("Errors/Error/Code")
    assert code and root.findtext("RequestID"), resp.text
    assert code != "InternalError", resp.text
    if resp.status_code >= 500:
        assert code in ALLOWED_5XX, resp.text


def test_oversized_body_is_a_400(small: ThreadedCluster, http: httpx.Client) -> None:
    body = b"Action=DescribeRegions&Pad=" + b"x" * (2 * 1024 * 1024)
    resp = http.post(small.endpoint + "/", content=body)
    assert resp.status_code in (400, 401)
