"""Random and malformed Query bodies, properly signed, never make the gateway fail.

Every answer must be EC2 XML with a request id. A 5xx is allowed only for the codes
that mean one: InsufficientInstanceCapacity (EC2 sends it as a 500) and
ServiceUnavailable; InternalError, a bare 500 or a traceback fails the test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from urllib.parse import quote
from xml.etree import ElementTree

import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roost.gateway.actions import ACTIONS
from tests.e2e.conftest import ThreadedCluster, make_cluster

ALLOWED_5XX = {"InsufficientInstanceCapacity", "ServiceUnavailable"}

KEYS = [
    "ImageId", "InstanceType", "MinCount", "MaxCount", "ClientToken", "UserData", "DryRun",
    "InstanceId.1", "InstanceId.2", "InstanceId.0", "InstanceId.x", "InstanceId",
    "Filter.1.Name", "Filter.1.Value.1", "Filter.2.Value.9", "Filter..Name",
    "TagSpecification.1.ResourceType", "TagSpecification.1.Tag.1.Key",
    "TagSpecification.1.Tag.1.Value", "Tag.1.Key", "Tag.1.Value", "ResourceId.1",
    "MaxResults", "NextToken", "Placement.AvailabilityZone", "Attribute",
    "IncludeAllInstances", "ZoneName.1", "RegionName.1", "ImageId.1",
    "DisableApiTermination.Value", "Force", "Version",
]
VALUES = st.one_of(
    st.sampled_from([
        "", "0", "1", "-1", "5", "99999999999999999999", "true", "false", "t3.micro",
        "t3.*", "nope.large", "ami-00000000000000001", "ami-x", "i-0123456789abcdef0",
        "i-", "instance", "instance-state-name", "tag:Name", "roost-1a", "userData",
        "aGVsbG8=", "!!notbase64", "aws:reserved", "%ZZ", "\x00", "é", "*", "?",
    ]),
    st.text(max_size=40),
)


@st.composite
def structured_body(draw: st.DrawFn) -> bytes:
    action = draw(st.one_of(st.sampled_from(sorted(ACTIONS)), st.text(max_size=12)))
    rest = draw(st.lists(st.tuples(st.sampled_from(KEYS), VALUES), max_size=8))
    pairs = [("Action", action), *rest]
    return "&".join(f"{quote(k)}={quote(v)}" for k, v in pairs).encode()


BODIES = st.one_of(structured_body(), st.binary(max_size=200),
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
