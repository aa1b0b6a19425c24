"""boto3 against a live gateway with three nodes: the EC2 calls an operator makes."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.e2e.conftest import IMAGE, ThreadedCluster
from tests.polling import wait_until


def run(ec2: Any, n: int = 1, *, itype: str = "t3.micro", **kw: Any) -> list[dict[str, Any]]:
    out = ec2.run_instances(ImageId=IMAGE, InstanceType=itype, MinCount=kw.pop("MinCount", n),
                            MaxCount=n, **kw)
    return list(out["Instances"])


def wait_state(ec2: Any, iid: str, state: str, timeout: float = 10.0) -> dict[str, Any]:
    """The instance as described once it is in ``state``."""
    seen: list[str] = []

    def there() -> dict[str, Any] | None:
        inst = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
        seen.append(inst["State"]["Name"])
        return dict(inst) if seen[-1] == state else None

    return wait_until(f"{iid} {state}", there, timeout, detail=lambda: f"it is {seen[-1]}")


def code(exc: pytest.ExceptionInfo[ClientError]) -> str:
    return str(exc.value.response["Error"]["Code"])


def status(exc: pytest.ExceptionInfo[ClientError]) -> int:
    return int(exc.value.response["ResponseMetadata"]["HTTPStatusCode"])


def test_run_describe_tag_stop_start_terminate(ec2: Any) -> None:
    tags = [{"ResourceType": "instance", "Tags": [{"Key": "Name", "Value": "web"}]}]
    (inst,) = run(ec2, TagSpecifications=tags, UserData="echo hi",  # boto3 base64s it
                  Placement={"AvailabilityZone": "roost-1a"})
    iid = inst["InstanceId"]
    assert inst["InstanceType"] == "t3.micro" and inst["ImageId"] == IMAGE
    assert inst["Placement"]["AvailabilityZone"] == "roost-1a"
    assert inst["State"]["Name"] in ("pending", "running")
    assert {"Key": "Name", "Value": "web"} in inst["Tags"]

    running = wait_state(ec2, iid, "running")
    assert running["State"]["Code"] == 16 and running["LaunchTime"].tzinfo is not None
    status_items = ec2.describe_instance_status(InstanceIds=[iid])["InstanceStatuses"]
    assert status_items[0]["InstanceStatus"]["Status"] == "ok"

    ec2.create_tags(Resources=[iid], Tags=[{"Key": "env", "Value": "dev"}])
    found = ec2.describe_instances(Filters=[{"Name": "tag:env", "Values": ["d*"]}])
    assert [i["InstanceId"] for r in found["Reservations"] for i in r["Instances"]] == [iid]
    tags_now = ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [iid]}])["Tags"]
    assert {(t["Key"], t["Value"]) for t in tags_now} == {("Name", "web"), ("env", "dev")}
    ec2.delete_tags(Resources=[iid], Tags=[{"Key": "Name"}])
    assert ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [iid]}])["Tags"] == [
        {"Key": "env", "ResourceId": iid, "ResourceType": "instance", "Value": "dev"}]

    attr = ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")
    assert base64.b64decode(attr["UserData"]["Value"]) == b"echo hi"

    stopping = ec2.stop_instances(InstanceIds=[iid])["StoppingInstances"][0]
    assert stopping["PreviousState"]["Name"] == "running"
    wait_state(ec2, iid, "stopped")
    assert ec2.describe_instance_status(InstanceIds=[iid])["InstanceStatuses"] == []
    everything = ec2.describe_instance_status(InstanceIds=[iid], IncludeAllInstances=True)
    assert everything["InstanceStatuses"][0]["InstanceState"]["Name"] == "stopped"
    started = ec2.start_instances(InstanceIds=[iid])["StartingInstances"][0]
    assert started["PreviousState"]["Name"] == "stopped"
    wait_state(ec2, iid, "running")

    gone = ec2.terminate_instances(InstanceIds=[iid])["TerminatingInstances"][0]
    assert gone["CurrentState"]["Name"] in ("shutting-down", "terminated")
    wait_state(ec2, iid, "terminated")
    again = ec2.terminate_instances(InstanceIds=[iid])["TerminatingInstances"][0]
    assert again["CurrentState"]["Name"] == "terminated"  # idempotent, as on EC2
    with pytest.raises(ClientError) as exc:
        ec2.start_instances(InstanceIds=[iid])
    assert code(exc) == "IncorrectInstanceState"


def test_describe_through_the_paginator(ec2: Any) -> None:
    # Six reservations, the first of three instances: pages count reservations, in
    # launch order, and never split one.
    mine = [[i["InstanceId"] for i in run(ec2, n, itype="t3.nano")] for n in (3, 1, 1, 1, 1, 1)]
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}],
        PaginationConfig={"PageSize": 5},
    )
    seen: list[list[str]] = []
    sizes = []
    for page in pages:
        sizes.append(len(page["Reservations"]))
        seen += [[i["InstanceId"] for i in r["Instances"]] for r in page["Reservations"]]
    assert len(sizes) >= 2 and max(sizes) <= 5 and sizes[0] == 5, sizes
    assert [r for r in seen if r in mine] == mine  # whole, once each, as launched
    ec2.terminate_instances(InstanceIds=[i for r in mine for i in r])


def test_describe_instance_types_lists_full_types_too(ec2: Any) -> None:
    big = ec2.describe_instance_types(InstanceTypes=["m7i.24xlarge", "t3.micro"])
    by_name = {t["InstanceType"]: t for t in big["InstanceTypes"]}
    assert by_name["m7i.24xlarge"]["VCpuInfo"]["DefaultVCpus"] == 96  # fits no node
    assert by_name["t3.micro"]["MemoryInfo"]["SizeInMiB"] == 1024
    two = ec2.describe_instance_types(
        Filters=[{"Name": "vcpu-info.default-vcpus", "Values": ["2"]},
                 {"Name": "instance-type", "Values": ["t3.*"]}])
    assert {t["InstanceType"] for t in two["InstanceTypes"]} >= {"t3.nano", "t3.large"}
    pages = list(ec2.get_paginator("describe_instance_types").paginate(
        PaginationConfig={"PageSize": 20}))
    assert len(pages) > 1
    gpu = ec2.describe_instance_types(InstanceTypes=["g5.12xlarge"])["InstanceTypes"][0]
    assert gpu["GpuInfo"]["Gpus"][0]["Count"] == 4


def test_zones_regions_images(ec2: Any) -> None:
    zones = ec2.describe_availability_zones()["AvailabilityZones"]
    assert [z["ZoneName"] for z in zones] == ["roost-1a"]
    by_id = ec2.describe_availability_zones(ZoneIds=[zones[0]["ZoneId"]])
    assert [z["ZoneName"] for z in by_id["AvailabilityZones"]] == ["roost-1a"]
    with pytest.raises(ClientError) as exc:
        ec2.describe_availability_zones(ZoneIds=["roost1-az9"])
    assert code(exc) == "InvalidParameterValue"
    assert "roost1-az9" in exc.value.response["Error"]["Message"]
    assert ec2.describe_regions()["Regions"][0]["RegionName"] == "roost-1"
    assert ec2.describe_images(ImageIds=[IMAGE])["Images"][0]["State"] == "available"


def test_client_token_is_idempotent(ec2: Any) -> None:
    first = ec2.run_instances(ImageId=IMAGE, InstanceType="t3.nano", MinCount=1, MaxCount=1,
                              ClientToken="tok-1")
    second = ec2.run_instances(ImageId=IMAGE, InstanceType="t3.nano", MinCount=1, MaxCount=1,
                               ClientToken="tok-1")
    assert second["ReservationId"] == first["ReservationId"]
    assert second["Instances"][0]["InstanceId"] == first["Instances"][0]["InstanceId"]
    with pytest.raises(ClientError) as exc:
        ec2.run_instances(ImageId=IMAGE, InstanceType="t3.micro", MinCount=1, MaxCount=1,
                          ClientToken="tok-1")
    assert code(exc) == "IdempotentParameterMismatch" and status(exc) == 400
    ec2.terminate_instances(InstanceIds=[first["Instances"][0]["InstanceId"]])


ERROR_ROWS = [
    # (what, call kwargs, code, HTTP status)
    ("unknown type", dict(InstanceType="nope.large"), "InvalidParameterValue", 400),
    ("cluster full", dict(InstanceType="m7i.24xlarge"), "InsufficientInstanceCapacity", 500),
    ("MinCount > MaxCount", dict(MinCount=3, MaxCount=2), "InvalidParameterValue", 400),
    ("zero count", dict(MinCount=0, MaxCount=1), "InvalidParameterValue", 400),
    ("unknown image", dict(ImageId="ami-0000000000000dead"), "InvalidAMIID.NotFound", 400),
    ("unknown zone", dict(Placement={"AvailabilityZone": "mars-1a"}),
     "InvalidParameterValue", 400),
    ("dry run", dict(DryRun=True), "DryRunOperation", 412),
]


@pytest.mark.parametrize(("what", "kwargs", "want", "http"), ERROR_ROWS,
                         ids=[r[0] for r in ERROR_ROWS])
def test_run_instances_errors(ec2: Any, what: str, kwargs: dict[str, Any], want: str,
                              http: int) -> None:
    call = {"ImageId": IMAGE, "InstanceType": "t3.micro", "MinCount": 1, "MaxCount": 1,
            **kwargs}
    with pytest.raises(ClientError) as exc:
        ec2.run_instances(**call)
    assert (code(exc), status(exc)) == (want, http)


def test_instance_id_errors(ec2: Any) -> None:
    with pytest.raises(ClientError) as exc:
        ec2.describe_instances(InstanceIds=["i-0123456789abcdef0"])
    assert (code(exc), status(exc)) == ("InvalidInstanceID.NotFound", 400)
    with pytest.raises(ClientError) as exc:
        ec2.terminate_instances(InstanceIds=["i-0123456789abcdef0"])
    assert code(exc) == "InvalidInstanceID.NotFound"
    with pytest.raises(ClientError) as exc:
        ec2.stop_instances(InstanceIds=["not-an-id"])
    assert (code(exc), status(exc)) == ("InvalidInstanceID.Malformed", 400)
    with pytest.raises(ClientError) as exc:
        ec2.create_tags(Resources=["vol-1"], Tags=[{"Key": "a", "Value": "b"}])
    assert code(exc) == "InvalidID"


def test_parameter_errors(ec2: Any) -> None:
    with pytest.raises(ClientError) as exc:
        ec2.describe_instances(Filters=[{"Name": "no-such-filter", "Values": ["x"]}])
    assert (code(exc), status(exc)) == ("InvalidParameterValue", 400)
    with pytest.raises(ClientError) as exc:
        ec2.describe_instances(MaxResults=1)
    assert code(exc) == "InvalidParameterValue"
    with pytest.raises(ClientError) as exc:
        ec2.describe_instances(NextToken="%%%garbage")
    assert code(exc) == "InvalidPaginationToken"
    with pytest.raises(ClientError) as exc:
        ec2.describe_instance_types(InstanceTypes=["nope.large"])
    assert code(exc) == "InvalidInstanceType"


def test_missing_parameter_and_unknown_action(cluster: ThreadedCluster) -> None:
    # boto3 checks required members itself; a client without that reaches the gateway.
    # No InstanceType: EC2's default, m1.small.
    plain = _without_validation(cluster)
    (inst,) = plain.run_instances(ImageId=IMAGE, MinCount=1, MaxCount=1)["Instances"]
    assert inst["InstanceType"] == "m1.small"
    plain.terminate_instances(InstanceIds=[inst["InstanceId"]])
    with pytest.raises(ClientError) as exc:
        _without_validation(cluster).run_instances(ImageId=IMAGE, InstanceType="t3.micro",
                                                   MaxCount=1)
    assert code(exc) == "MissingParameter"
    with pytest.raises(ClientError) as exc:
        _signed_call(cluster, "Action=LaunchRockets&Version=2016-11-15")
    assert (code(exc), status(exc)) == ("InvalidAction", 400)
    with pytest.raises(ClientError) as exc:
        _signed_call(cluster, "Version=2016-11-15")
    assert (code(exc), status(exc)) == ("MissingAction", 400)


def _without_validation(cluster: ThreadedCluster) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "ec2", endpoint_url=cluster.endpoint, region_name="roost-1",
        aws_access_key_id=cluster.key, aws_secret_access_key=cluster.secret,
        config=Config(parameter_validation=False, retries={"total_max_attempts": 1}),
    )


def _signed_call(cluster: ThreadedCluster, body: str) -> None:
    """A raw signed POST; raises ClientError from the EC2 error XML like boto3 would."""
    import httpx
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    from botocore.parsers import create_parser

    req = AWSRequest(method="POST", url=cluster.endpoint + "/", data=body.encode(),
                     headers={"Content-Type": "application/x-www-form-urlencoded"})
    SigV4Auth(Credentials(cluster.key, cluster.secret), "ec2", "roost-1").add_auth(req)
    resp = httpx.post(cluster.endpoint + "/", content=body.encode(), headers=dict(req.headers))
    if resp.status_code >= 300:
        parsed = create_parser("ec2").parse(
            {"body": resp.content, "headers": dict(resp.headers), "status_code": resp.status_code},
            None,
        )
        raise ClientError(parsed, "raw")
