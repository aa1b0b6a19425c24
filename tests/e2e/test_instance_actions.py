"""The EC2 actions that need a node, through boto3 against real process-driver nodes:
GetConsoleOutput, RebootInstances, termination and stop protection, the instance's own
shutdown behaviour, ModifyInstanceAttribute (type and user data while stopped) and
ModifyInstanceMetadataOptions, each with EC2's error codes for its refusals."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.e2e.conftest import IMAGE, ThreadedCluster, make_cluster
from tests.e2e.test_boto3 import code, run, wait_state
from tests.polling import wait_until

AWS = Path(sys.executable).parent / "aws"


@pytest.fixture(scope="module")
def pcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedCluster]:
    """One process-driver node of 4 vCPU / 8 GiB: room for one m7i.xlarge, not two."""
    c = make_cluster(tmp_path_factory.mktemp("pcluster"), nodes=1, capacity="5vcpu,17GiB",
                     driver="process")
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def ec2(pcluster: ThreadedCluster) -> Iterator[Any]:
    client = pcluster.client()
    launched: list[str] = []
    original = client.run_instances

    def tracked(**kw: Any) -> Any:
        out = original(**kw)
        launched.extend(i["InstanceId"] for i in out["Instances"])
        return out

    client.run_instances = tracked
    try:
        yield client
    finally:  # what a test leaves running is terminated, protected or not
        for iid in launched:
            try:
                client.modify_instance_attribute(InstanceId=iid,
                                                 DisableApiTermination={"Value": False})
            except ClientError as exc:  # already terminated
                assert exc.response["Error"]["Code"] == "IncorrectInstanceState"
        if launched:
            client.terminate_instances(InstanceIds=launched)
            for iid in launched:
                wait_state(client, iid, "terminated", timeout=20)


def console(ec2: Any, iid: str, marker: str, timeout: float = 10.0) -> str:
    """The decoded console once it holds ``marker``."""
    last = {"text": ""}

    def holding() -> dict[str, Any] | None:
        out = ec2.get_console_output(InstanceId=iid, Latest=True)
        last["text"] = str(out.get("Output", ""))  # botocore decodes EC2's base64 itself
        return dict(out) if marker in last["text"] else None

    out = wait_until(f"{marker!r} reaches the console", holding, timeout, 0.1,
                     detail=lambda: f"it holds {last['text']!r}")
    assert out["InstanceId"] == iid and out["Timestamp"].tzinfo is not None
    return last["text"]


def test_console_output_shows_what_the_instance_printed(ec2: Any) -> None:
    (inst,) = run(ec2, UserData="echo hello-from-console\nexec sleep 600")
    iid = inst["InstanceId"]
    assert "hello-from-console" in console(ec2, iid, "hello-from-console")
    with pytest.raises(ClientError) as bad:
        ec2.get_console_output(InstanceId="i-zzz")
    assert code(bad) == "InvalidInstanceID.Malformed"
    with pytest.raises(ClientError) as missing:
        ec2.get_console_output(InstanceId="i-0123456789abcdef0")
    assert code(missing) == "InvalidInstanceID.NotFound"


def test_console_output_keeps_the_last_64_kib(ec2: Any) -> None:
    script = "i=0; while [ $i -lt 3000 ]; do echo line-$i-padding-padding-padding; " \
             "i=$((i+1)); done; echo tail-marker; exec sleep 600"
    (inst,) = run(ec2, UserData=script)
    text = console(ec2, inst["InstanceId"], "tail-marker")
    assert 60 * 1024 < len(text.encode()) <= 64 * 1024
    assert "line-0-" not in text and text.rstrip().endswith("tail-marker")


def test_reboot_restarts_the_program_in_place(ec2: Any, pcluster: ThreadedCluster) -> None:
    (inst,) = run(ec2, UserData="echo booted-$$\nexec sleep 600")
    iid = inst["InstanceId"]
    first = console(ec2, iid, "booted-")
    ec2.reboot_instances(InstanceIds=[iid])
    wait_until("the instance boots again",
               lambda: console(ec2, iid, "booted-").count("booted-") >= 2, 15, 0.1)
    after = wait_state(ec2, iid, "running")
    assert after["InstanceId"] == iid and after["State"]["Name"] == "running"
    assert first.count("booted-") == 1
    assert pcluster.allocations() == {"n1": 1}  # same allocation, nothing leaked

    ec2.stop_instances(InstanceIds=[iid])
    wait_state(ec2, iid, "stopped", timeout=15)
    with pytest.raises(ClientError) as stopped:
        ec2.reboot_instances(InstanceIds=[iid])
    assert code(stopped) == "IncorrectInstanceState"


def test_termination_and_stop_protection(ec2: Any) -> None:
    (inst,) = run(ec2, DisableApiTermination=True)
    iid = inst["InstanceId"]
    wait_state(ec2, iid, "running")
    attr = ec2.describe_instance_attribute(InstanceId=iid, Attribute="disableApiTermination")
    assert attr["DisableApiTermination"]["Value"] is True
    with pytest.raises(ClientError) as refused:
        ec2.terminate_instances(InstanceIds=[iid])
    assert code(refused) == "OperationNotPermitted"
    assert "disableApiTermination" in refused.value.response["Error"]["Message"]
    assert wait_state(ec2, iid, "running")["State"]["Name"] == "running"

    ec2.modify_instance_attribute(InstanceId=iid, DisableApiStop={"Value": True})
    with pytest.raises(ClientError) as no_stop:
        ec2.stop_instances(InstanceIds=[iid], Force=True)
    assert code(no_stop) == "OperationNotPermitted"
    attr = ec2.describe_instance_attribute(InstanceId=iid, Attribute="disableApiStop")
    assert attr["DisableApiStop"]["Value"] is True

    ec2.modify_instance_attribute(InstanceId=iid, DisableApiTermination={"Value": False})
    ec2.terminate_instances(InstanceIds=[iid])
    wait_state(ec2, iid, "terminated", timeout=15)


def test_a_protected_instance_refuses_the_whole_call(ec2: Any) -> None:
    plain, guarded = run(ec2)[0], run(ec2, DisableApiTermination=True)[0]
    with pytest.raises(ClientError) as refused:
        ec2.terminate_instances(InstanceIds=[plain["InstanceId"], guarded["InstanceId"]])
    assert code(refused) == "OperationNotPermitted"
    assert wait_state(ec2, plain["InstanceId"], "running")  # untouched, not half done


@pytest.mark.parametrize(("behaviour", "final"), [("stop", "stopped"),
                                                  ("terminate", "terminated")])
def test_shutdown_behaviour_decides_what_an_exit_does(ec2: Any, behaviour: str,
                                                      final: str) -> None:
    (inst,) = run(ec2, UserData="sleep 0.5; exit 3",
                  InstanceInitiatedShutdownBehavior=behaviour)
    iid = inst["InstanceId"]
    done = wait_state(ec2, iid, final, timeout=15)
    assert done["StateReason"]["Code"] == "Client.InstanceInitiatedShutdown"
    attr = ec2.describe_instance_attribute(InstanceId=iid,
                                           Attribute="instanceInitiatedShutdownBehavior")
    assert attr["InstanceInitiatedShutdownBehavior"]["Value"] == behaviour


def test_type_and_user_data_change_only_while_stopped(ec2: Any) -> None:
    (inst,) = run(ec2, UserData="echo first-data\nexec sleep 600")
    iid = inst["InstanceId"]
    wait_state(ec2, iid, "running")
    with pytest.raises(ClientError) as running:
        ec2.modify_instance_attribute(InstanceId=iid, InstanceType={"Value": "t3.small"})
    assert code(running) == "IncorrectInstanceState"

    ec2.stop_instances(InstanceIds=[iid])
    wait_state(ec2, iid, "stopped", timeout=15)
    ec2.modify_instance_attribute(InstanceId=iid, InstanceType={"Value": "t3.small"})
    ec2.modify_instance_attribute(InstanceId=iid,
                                  UserData={"Value": b"echo second-data\nexec sleep 600"})
    attr = ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")
    assert base64.b64decode(attr["UserData"]["Value"]) == b"echo second-data\nexec sleep 600"
    ec2.start_instances(InstanceIds=[iid])
    now = wait_state(ec2, iid, "running", timeout=15)
    assert now["InstanceType"] == "t3.small"
    assert "second-data" in console(ec2, iid, "second-data")

    with pytest.raises(ClientError) as unknown:
        ec2.modify_instance_attribute(InstanceId=iid, InstanceType={"Value": "zz9.huge"})
    assert code(unknown) == "InvalidParameterValue"


def test_starting_as_a_type_with_no_room_is_a_capacity_error(ec2: Any) -> None:
    (big,) = run(ec2, itype="m7i.xlarge")  # 4 vCPU / 16 GiB of the node's 5 / 17
    iid = big["InstanceId"]
    ec2.stop_instances(InstanceIds=[iid])
    wait_state(ec2, iid, "stopped", timeout=15)
    ec2.modify_instance_attribute(InstanceId=iid, InstanceType={"Value": "m7i.2xlarge"})
    with pytest.raises(ClientError) as full:
        ec2.start_instances(InstanceIds=[iid])
    assert code(full) == "InsufficientInstanceCapacity"
    assert wait_state(ec2, iid, "stopped")["InstanceType"] == "m7i.2xlarge"


def test_metadata_options_at_launch_and_after(ec2: Any) -> None:
    (inst,) = run(ec2, MetadataOptions={"HttpTokens": "required",
                                        "InstanceMetadataTags": "enabled"})
    iid = inst["InstanceId"]
    assert inst["MetadataOptions"]["HttpTokens"] == "required"
    assert inst["MetadataOptions"]["InstanceMetadataTags"] == "enabled"
    assert inst["MetadataOptions"]["HttpProtocolIpv6"] == "disabled"
    out = ec2.modify_instance_metadata_options(InstanceId=iid, HttpEndpoint="disabled",
                                               HttpProtocolIpv6="enabled")
    assert out["InstanceMetadataOptions"]["HttpEndpoint"] == "disabled"
    assert out["InstanceMetadataOptions"]["HttpTokens"] == "required"  # kept
    described = wait_state(ec2, iid, "running")
    assert described["MetadataOptions"]["HttpEndpoint"] == "disabled"
    assert described["MetadataOptions"]["HttpProtocolIpv6"] == "enabled"
    with pytest.raises(ClientError) as bad:
        ec2.modify_instance_metadata_options(InstanceId=iid, HttpProtocolIpv6="on")
    assert code(bad) == "InvalidParameterValue"


@pytest.mark.parametrize("kw", [
    {"InstanceInitiatedShutdownBehavior": "hibernate"},
    {"MetadataOptions": {"HttpTokens": "sometimes"}},
    {"MetadataOptions": {"HttpPutResponseHopLimit": 99}},
])
def test_bad_launch_options_are_refused_before_anything_runs(
        ec2: Any, pcluster: ThreadedCluster, kw: dict[str, Any]) -> None:
    before = pcluster.allocations()
    with pytest.raises(ClientError) as bad:
        ec2.run_instances(ImageId=IMAGE, InstanceType="t3.micro", MinCount=1, MaxCount=1, **kw)
    assert code(bad) == "InvalidParameterValue"
    assert pcluster.allocations() == before


def test_bad_modify_values(ec2: Any) -> None:
    (inst,) = run(ec2)
    iid = inst["InstanceId"]
    with pytest.raises(ClientError) as behaviour:
        ec2.modify_instance_attribute(InstanceId=iid,
                                      InstanceInitiatedShutdownBehavior={"Value": "explode"})
    assert code(behaviour) == "InvalidParameterValue"
    with pytest.raises(ClientError) as tokens:
        ec2.modify_instance_metadata_options(InstanceId=iid, HttpTokens="maybe")
    assert code(tokens) == "InvalidParameterValue"
    with pytest.raises(ClientError) as dry:
        ec2.modify_instance_attribute(InstanceId=iid, DisableApiStop={"Value": True},
                                      DryRun=True)
    assert code(dry) == "DryRunOperation"
    attr = ec2.describe_instance_attribute(InstanceId=iid, Attribute="disableApiStop")
    assert attr["DisableApiStop"]["Value"] is False  # the dry run changed nothing


def aws_cli(cluster: ThreadedCluster, *args: str, check: bool = True) -> dict[str, Any]:
    """The AWS CLI v1 from this virtualenv against ``cluster``: its JSON answer, or
    ``{"stderr": ...}`` when ``check`` is off and it failed."""
    env = {**os.environ, "AWS_ACCESS_KEY_ID": cluster.key,
           "AWS_SECRET_ACCESS_KEY": cluster.secret, "AWS_DEFAULT_REGION": cluster.spec.region,
           "AWS_MAX_ATTEMPTS": "1"}
    done = subprocess.run([str(AWS), "--endpoint-url", cluster.endpoint, "--output", "json",
                           *args], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    if done.returncode != 0:
        assert not check, done.stderr
        return {"stderr": done.stderr}
    return dict(json.loads(done.stdout or "{}"))


def test_the_aws_cli_reads_the_console_and_reboots(pcluster: ThreadedCluster,
                                                   ec2: Any) -> None:
    (inst,) = run(ec2, UserData="echo cli-marker\nexec sleep 600")
    iid = inst["InstanceId"]
    console(ec2, iid, "cli-marker")
    out = aws_cli(pcluster, "ec2", "get-console-output", "--instance-id", iid)
    assert "cli-marker" in out["Output"]  # the CLI decodes the base64 itself
    aws_cli(pcluster, "ec2", "reboot-instances", "--instance-ids", iid)
    aws_cli(pcluster, "ec2", "modify-instance-attribute", "--instance-id", iid,
            "--disable-api-termination")
    refused = aws_cli(pcluster, "ec2", "terminate-instances", "--instance-ids", iid,
                      check=False)
    assert "OperationNotPermitted" in refused["stderr"]
    on = aws_cli(pcluster, "ec2", "describe-instance-attribute", "--instance-id", iid,
                 "--attribute", "disableApiTermination")
    assert on["DisableApiTermination"]["Value"] is True

    done = aws_cli(pcluster, "ec2", "run-instances", "--image-id", IMAGE, "--instance-type",
                   "t3.micro", "--user-data", "exit 0",
                   "--instance-initiated-shutdown-behavior", "terminate")
    ended = done["Instances"][0]["InstanceId"]
    final = wait_state(ec2, ended, "terminated", timeout=20)
    assert final["StateReason"]["Code"] == "Client.InstanceInitiatedShutdown"
