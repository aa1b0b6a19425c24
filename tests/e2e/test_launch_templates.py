"""boto3 against a live cluster: launch templates (create, versions, default version,
describe, delete) and RunInstances from a template, each error code they answer."""

from __future__ import annotations

import base64
from typing import Any

from tests.e2e.conftest import IMAGE
from tests.e2e.test_boto3 import run
from tests.e2e.test_network import fails

DATA = {
    "ImageId": IMAGE, "InstanceType": "t3.micro",
    "BlockDeviceMappings": [{"DeviceName": "/dev/xvda",
                             "Ebs": {"VolumeSize": 12, "VolumeType": "gp3"}}],
    "TagSpecifications": [{"ResourceType": "instance",
                           "Tags": [{"Key": "from", "Value": "template"}]}],
    "MetadataOptions": {"HttpTokens": "required"},
    "UserData": base64.b64encode(b"echo hi").decode(),
}


def test_template_versions_and_launch(ec2: Any) -> None:
    made = ec2.create_launch_template(LaunchTemplateName="web", LaunchTemplateData=DATA,
                                      VersionDescription="first")["LaunchTemplate"]
    tid = made["LaunchTemplateId"]
    assert (made["DefaultVersionNumber"], made["LatestVersionNumber"]) == (1, 1)
    fails("InvalidLaunchTemplateName.AlreadyExistsException", ec2.create_launch_template,
          LaunchTemplateName="web", LaunchTemplateData=DATA)
    fails("InvalidLaunchTemplateName.MalformedException", ec2.create_launch_template,
          LaunchTemplateName="a b", LaunchTemplateData=DATA)
    (v1,) = ec2.describe_launch_template_versions(LaunchTemplateId=tid)[
        "LaunchTemplateVersions"]
    assert v1["LaunchTemplateData"]["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 12
    assert v1["LaunchTemplateData"]["MetadataOptions"]["HttpTokens"] == "required"
    assert v1["DefaultVersion"] and v1["VersionDescription"] == "first"

    v2 = ec2.create_launch_template_version(
        LaunchTemplateName="web", SourceVersion="1",
        LaunchTemplateData={"InstanceType": "t3.small"})["LaunchTemplateVersion"]
    assert v2["VersionNumber"] == 2 and not v2["DefaultVersion"]
    assert v2["LaunchTemplateData"]["ImageId"] == IMAGE  # from the source version
    assert v2["LaunchTemplateData"]["InstanceType"] == "t3.small"
    latest = ec2.describe_launch_template_versions(
        LaunchTemplateId=tid, Versions=["$Latest"])["LaunchTemplateVersions"]
    assert [v["VersionNumber"] for v in latest] == [2]
    fails("InvalidLaunchTemplateId.VersionNotFound", ec2.describe_launch_template_versions,
          LaunchTemplateId=tid, Versions=["7"])

    (inst,) = ec2.run_instances(MinCount=1, MaxCount=1,
                                LaunchTemplate={"LaunchTemplateId": tid})["Instances"]
    assert inst["InstanceType"] == "t3.micro"  # $Default is still version 1
    tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
    assert tags["from"] == "template" and tags["aws:ec2launchtemplate:id"] == tid
    assert tags["aws:ec2launchtemplate:version"] == "1"
    vol = ec2.describe_volumes(Filters=[{"Name": "attachment.instance-id",
                                         "Values": [inst["InstanceId"]]}])["Volumes"][0]
    assert (vol["Size"], vol["VolumeType"]) == (12, "gp3")
    (latest_inst,) = ec2.run_instances(
        MinCount=1, MaxCount=1, LaunchTemplate={"LaunchTemplateName": "web",
                                                "Version": "$Latest"})["Instances"]
    assert latest_inst["InstanceType"] == "t3.small"
    (override,) = ec2.run_instances(
        MinCount=1, MaxCount=1, InstanceType="t3.nano",
        LaunchTemplate={"LaunchTemplateId": tid, "Version": "2"})["Instances"]
    assert override["InstanceType"] == "t3.nano"  # the request wins over the template

    ec2.modify_launch_template(LaunchTemplateId=tid, DefaultVersion="2")
    (t,) = ec2.describe_launch_templates(LaunchTemplateNames=["web"])["LaunchTemplates"]
    assert (t["DefaultVersionNumber"], t["LatestVersionNumber"]) == (2, 2)
    fails("InvalidLaunchTemplateId.VersionNotFound", ec2.modify_launch_template,
          LaunchTemplateId=tid, DefaultVersion="9")
    found = ec2.describe_launch_templates(
        Filters=[{"Name": "launch-template-name", "Values": ["w*"]}])["LaunchTemplates"]
    assert [x["LaunchTemplateId"] for x in found] == [tid]
    fails("InvalidLaunchTemplateId.NotFound", run, ec2,
          LaunchTemplate={"LaunchTemplateId": "lt-0123456789abcdef0"})
    fails("InvalidLaunchTemplateName.NotFoundException", ec2.describe_launch_templates,
          LaunchTemplateNames=["nope"])
    fails("InvalidLaunchTemplateId.Malformed", ec2.describe_launch_templates,
          LaunchTemplateIds=["lt-x"])
    ids = [i["InstanceId"] for i in (inst, latest_inst, override)]
    ec2.terminate_instances(InstanceIds=ids)
    gone = ec2.delete_launch_template(LaunchTemplateName="web")["LaunchTemplate"]
    assert gone["LaunchTemplateId"] == tid
    fails("InvalidLaunchTemplateId.NotFound", ec2.delete_launch_template, LaunchTemplateId=tid)
    again = ec2.create_launch_template(LaunchTemplateName="web", LaunchTemplateData=DATA)
    ec2.delete_launch_template(LaunchTemplateId=again["LaunchTemplate"]["LaunchTemplateId"])
