"""The Query wire format and typed requests: parsing what botocore sends, refusing the
rest with EC2's codes, and XML that botocore's own parser reads back."""

from __future__ import annotations

from typing import Any

import botocore.session
import pytest
from botocore.parsers import create_parser
from botocore.serialize import create_serializer

from roost.bus.schemas import InstanceRecord
from roost.domain.catalog import BUILTIN, InstanceType
from roost.domain.errors import (
    InvalidID,
    InvalidInstanceIDMalformed,
    InvalidParameterCombination,
    InvalidParameterValue,
    MissingParameter,
    RoostError,
)
from roost.gateway import render, xml
from roost.gateway import requests as rq
from roost.gateway.model import Paged, Reservation, StateChange
from roost.gateway.netrequests import parse_launch_network
from roost.gateway.query import Params, parse_form

MODEL = botocore.session.get_session().get_service_model("ec2")
IID = "i-0123456789abcdef0"


def botocore_params(operation: str, args: dict[str, Any]) -> Params:
    """The Query parameters exactly as boto3 would send ``args``."""
    body = create_serializer("ec2").serialize_to_request(args, MODEL.operation_model(operation))
    return Params({k: str(v) for k, v in body["body"].items()})


def parse_reply(operation: str, text: str, status: int = 200) -> dict[str, Any]:
    shape = MODEL.operation_model(operation).output_shape
    return dict(create_parser("ec2").parse(
        {"body": text.encode(), "headers": {}, "status_code": status}, shape))


def test_run_instances_from_botocore() -> None:
    p = botocore_params("RunInstances", {
        "ImageId": "ami-00000000000000001", "InstanceType": "t3.micro", "MinCount": 1,
        "MaxCount": 3, "ClientToken": "tok", "UserData": "aGk=",
        "TagSpecifications": [{"ResourceType": "instance",
                               "Tags": [{"Key": "a", "Value": "b"}]},
                              {"ResourceType": "volume", "Tags": [{"Key": "v", "Value": "x"}]}],
        "Placement": {"AvailabilityZone": "roost-1a"},
    })
    req = rq.parse_run_instances(p)
    assert (req.min_count, req.max_count, req.client_token) == (1, 3, "tok")
    assert req.tags == (("a", "b"),) and req.user_data == "hi"
    assert req.availability_zone == "roost-1a" and not req.dry_run


@pytest.mark.parametrize(("form", "error"), [
    ({"InstanceType": "t3.micro", "MinCount": "1", "MaxCount": "1"}, MissingParameter),
    ({"ImageId": "a", "InstanceType": "t", "MaxCount": "1"}, MissingParameter),
    ({"ImageId": "a", "InstanceType": "t", "MinCount": "x", "MaxCount": "1"},
     InvalidParameterValue),
    ({"ImageId": "a", "InstanceType": "t", "MinCount": "2", "MaxCount": "1"},
     InvalidParameterValue),
    ({"ImageId": "a", "InstanceType": "t", "MinCount": "0", "MaxCount": "1"},
     InvalidParameterValue),
    ({"ImageId": "a", "InstanceType": "t", "MinCount": "1", "MaxCount": "1",
      "UserData": "!!"}, InvalidParameterValue),
    ({"ImageId": "a", "InstanceType": "t", "MinCount": "1", "MaxCount": "1",
      "TagSpecification.1.ResourceType": "instance", "TagSpecification.1.Tag.1.Key": "aws:x"},
     InvalidParameterValue),
    ({"ImageId": "a", "InstanceType": "t", "MinCount": "1", "MaxCount": "1",
      "DryRun": "maybe"}, InvalidParameterValue),
])
def test_run_instances_refusals(form: dict[str, str], error: type[RoostError]) -> None:
    with pytest.raises(error):
        rq.parse_run_instances(Params(form))


def test_lists_and_members_are_ordered_by_index_with_gaps() -> None:
    p = Params({"InstanceId.10": "c", "InstanceId.2": "b", "InstanceId.1": "a",
                "Filter.2.Name": "y", "Filter.1.Name": "x", "Filter.1.Value.1": "v"})
    assert p.values("InstanceId") == ["a", "b", "c"]
    assert [f.get("Name") for f in p.members("Filter")] == ["x", "y"]
    assert p.members("Filter")[0].values("Value") == ["v"]


@pytest.mark.parametrize("index", [
    "x", "0", "99999999", "10001", "01", "007", "\u00b2", "\u2462", "\u0663", "\uff11",
    "+1", "-1", " 1", "1_0", "", "9" * 4000, "9" * 5000,
])
def test_bad_list_index_is_invalid_parameter_naming_the_key(index: str) -> None:
    for form, read in [
        ({f"InstanceId.{index}": IID}, lambda p: p.values("InstanceId")),
        ({f"Filter.{index}.Name": "x"}, lambda p: p.members("Filter")),
        ({"Filter.1.Name": "x", f"Filter.1.Value.{index}": "v"},
         lambda p: p.members("Filter")[0].values("Value")),
    ]:
        with pytest.raises(InvalidParameterValue) as err:
            read(Params(form))
        key = next(iter(form)) if len(form) == 1 else f"Filter.1.Value.{index}"
        assert key[:60] in err.value.message and len(err.value.message) < 300


@pytest.mark.parametrize(("form", "read"), [
    ({"InstanceId.1": IID, "InstanceId.2.": "x"}, lambda p: p.values("InstanceId")),
    ({"Filter.1.": "x"}, lambda p: p.members("Filter")),
])
def test_a_key_ending_in_a_dot_is_invalid_parameter(form: dict[str, str], read: Any) -> None:
    with pytest.raises(InvalidParameterValue, match="Invalid parameter name"):
        read(Params(form))


def test_the_largest_index_is_accepted() -> None:
    assert Params({"InstanceId.10000": IID}).values("InstanceId") == [IID]


@pytest.mark.parametrize("raw", ["\u0661\u0660", "1_0", " 5", "\u00b2", "9" * 5000, "1.5"])
def test_integer_values_are_ascii_decimal(raw: str) -> None:
    with pytest.raises(InvalidParameterValue):
        Params({"MaxResults": raw}).integer("MaxResults")
    assert Params({"MaxResults": "-7"}).integer("MaxResults") == -7


def test_form_decoding() -> None:
    assert parse_form(b"Action=A&X=%2B1", "Y=2") == {"Y": "2", "Action": "A", "X": "+1"}
    with pytest.raises(InvalidParameterValue):
        parse_form(b"\xff\xfe")
    with pytest.raises(InvalidParameterValue):
        parse_form(b"A=%ff")


def test_instance_id_shapes() -> None:
    assert rq.instance_ids([IID, "i-01234567", IID]) == (IID, "i-01234567")
    for bad in ["i-", "i-0123", "vol-0123456789abcdef0", "I-0123456789ABCDEF0"]:
        with pytest.raises(InvalidInstanceIDMalformed):
            rq.instance_ids([bad])


def test_describe_instances_rules() -> None:
    p = botocore_params("DescribeInstances", {
        "Filters": [{"Name": "tag:Name", "Values": ["a", "b*"]}], "MaxResults": 5})
    req = rq.parse_describe_instances(p)
    assert req.filters[0].values == ("a", "b*") and req.page.max_results == 5
    for parse in (rq.parse_describe_instances, rq.parse_describe_instance_status):
        with pytest.raises(InvalidParameterCombination):
            parse(Params({"InstanceId.1": IID, "MaxResults": "5"}))
        with pytest.raises(InvalidParameterValue):
            parse(Params({"MaxResults": "4"}))
        assert parse(Params({"InstanceId.1": IID})).ids == (IID,)


def test_tags_requests() -> None:
    req = rq.parse_tags(botocore_params("DeleteTags", {"Resources": [IID],
                                                       "Tags": [{"Key": "k"}]}), deleting=True)
    assert req.tags == (("k", None),)
    with pytest.raises(InvalidID):
        rq.parse_tags(Params({"ResourceId.1": "vol-1", "Tag.1.Key": "k"}), deleting=False)
    with pytest.raises(MissingParameter):
        rq.parse_tags(Params({"ResourceId.1": IID}), deleting=False)


def record(**kw: Any) -> InstanceRecord:
    base: dict[str, Any] = dict(
        instance_id=IID, node_id="n1", instance_type="t3.micro",
        image_id="ami-00000000000000001", state="running", launch_id="r-1-0",
        reservation_id="r-1", launch_time="2026-01-02T03:04:05.678Z",
        availability_zone="roost-1a", tags={"Name": "<web & co>"}, private_ip="10.0.0.5",
    )
    return InstanceRecord(**{**base, **kw})


def test_run_instances_xml_reads_back_through_botocore() -> None:
    res = Reservation("r-1", "000000000000", (record(state="pending"),))
    out = parse_reply("RunInstances", render.run_instances(res, BUILTIN, "req-1"))
    inst = out["Instances"][0]
    assert out["ReservationId"] == "r-1" and inst["InstanceId"] == IID
    assert inst["State"] == {"Code": 0, "Name": "pending"}
    assert inst["Tags"] == [{"Key": "Name", "Value": "<web & co>"}]
    assert inst["LaunchTime"].isoformat() == "2026-01-02T03:04:05.678000+00:00"
    assert inst["CpuOptions"]["CoreCount"] == 2
    assert out["ResponseMetadata"]["RequestId"] == "req-1"


def test_describe_and_state_change_xml() -> None:
    page = Paged((Reservation("r-1", "0", (record(),)),), "tok")
    out = parse_reply("DescribeInstances", render.describe_instances(page, BUILTIN, "r"))
    assert out["NextToken"] == "tok"
    assert out["Reservations"][0]["Instances"][0]["PrivateIpAddress"] == "10.0.0.5"
    changes = [StateChange(IID, "shutting-down", "running")]
    term = parse_reply("TerminateInstances", render.state_changes("TerminateInstances",
                                                                  changes, "r"))
    assert term["TerminatingInstances"][0]["CurrentState"] == {"Code": 32,
                                                               "Name": "shutting-down"}


def test_instance_types_xml() -> None:
    page = Paged((BUILTIN["g5.12xlarge"], BUILTIN["gs1.half"]))
    out = parse_reply("DescribeInstanceTypes", render.instance_types(page, "r"))
    g5, gs = out["InstanceTypes"]
    assert g5["VCpuInfo"]["DefaultVCpus"] == 48 and g5["GpuInfo"]["Gpus"][0]["Count"] == 4
    assert gs["MemoryInfo"]["SizeInMiB"] == 16 * 1024


def test_a_type_with_a_gpu_model_set_lists_each_model() -> None:
    v100 = InstanceType("x1.v100", 8000, 65_536, gpu_count=2, gpu_models=("V100M32", "V100M16"))
    out = parse_reply("DescribeInstanceTypes", render.instance_types(Paged((v100,)), "r"))
    gpus = out["InstanceTypes"][0]["GpuInfo"]["Gpus"]
    assert [(g["Name"], g["Count"]) for g in gpus] == [("V100M16", 2), ("V100M32", 2)]


def test_error_envelope_escapes_and_strips_what_xml_cannot_carry() -> None:
    body = xml.error(InvalidParameterValue('bad <"x"> \x00 & more'), "rid")
    out = parse_reply("DescribeInstances", body, status=400)
    assert out["Error"]["Code"] == "InvalidParameterValue"
    assert out["Error"]["Message"] == 'bad <"x"> \ufffd & more'
    assert out["ResponseMetadata"]["RequestId"] == "rid"


def test_interface_primary_private_address() -> None:
    def nic(**spec: Any) -> Params:
        return botocore_params("RunInstances", {
            "ImageId": "ami-00000000000000001", "MinCount": 1, "MaxCount": 1,
            "NetworkInterfaces": [{"DeviceIndex": 0, "SubnetId": "subnet-0123abcd", **spec}]})

    listed = nic(PrivateIpAddresses=[{"Primary": True, "PrivateIpAddress": "10.0.0.9"}])
    assert parse_launch_network(listed, max_count=1).private_ip == "10.0.0.9"
    plain = nic(PrivateIpAddress="10.0.0.8")
    assert parse_launch_network(plain, max_count=1).private_ip == "10.0.0.8"
    for refused, error in [
        (nic(PrivateIpAddresses=[{"Primary": True, "PrivateIpAddress": "10.0.0.9"},
                                 {"Primary": False, "PrivateIpAddress": "10.0.0.10"}]),
         InvalidParameterValue),
        (nic(SecondaryPrivateIpAddressCount=1), InvalidParameterValue),
        (nic(PrivateIpAddresses=[{"Primary": False, "PrivateIpAddress": "10.0.0.9"}]),
         InvalidParameterValue),
        (nic(PrivateIpAddress="10.0.0.8",
             PrivateIpAddresses=[{"Primary": True, "PrivateIpAddress": "10.0.0.9"}]),
         InvalidParameterCombination),
    ]:
        with pytest.raises(error):
            parse_launch_network(refused, max_count=1)
