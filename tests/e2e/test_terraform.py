"""Terraform's AWS provider, offline: `aws_instance` apply, then destroy.

Needs `terraform` on PATH and the hashicorp/aws provider in a filesystem mirror, at
$ROOST_TF_PLUGIN_MIRROR (default /opt/tf-plugins), laid out as
``registry.terraform.io/hashicorp/aws/<version>/<os>_<arch>/``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import IMAGE, ThreadedCluster, make_cluster

PROVIDER_VERSION = "5.100.0"

MAIN_TF = """
terraform {{
  required_providers {{
    aws = {{ source = "hashicorp/aws", version = "{version}" }}
  }}
}}

provider "aws" {{
  region                      = "roost-1"
  skip_region_validation      = true
  skip_credentials_validation = true
  skip_requesting_account_id  = true
  skip_metadata_api_check     = true
  endpoints {{ ec2 = "{endpoint}" }}
}}

resource "aws_instance" "web" {{
  ami           = "{image}"
  instance_type = "t3.micro"
  user_data     = "echo hello from roost"
  tags          = {{ Name = "roost-terraform" }}
}}

output "id" {{ value = aws_instance.web.id }}
"""


def mirror() -> Path:
    path = Path(os.environ.get("ROOST_TF_PLUGIN_MIRROR", "/opt/tf-plugins"))
    provider = path / "registry.terraform.io" / "hashicorp" / "aws" / PROVIDER_VERSION
    if shutil.which("terraform") is None:
        pytest.fail("terraform is not on PATH: install Terraform >= 1.5 to run this test")
    if not provider.is_dir():
        pytest.fail(f"no hashicorp/aws {PROVIDER_VERSION} provider under {path}: set "
                    "ROOST_TF_PLUGIN_MIRROR to a filesystem mirror that holds it")
    return path

Terraform = Callable[..., subprocess.CompletedProcess[str]]


def terraform_in(work: Path, cluster: ThreadedCluster, *, timeout: float) -> Terraform:
    """``terraform`` run in ``work`` against ``cluster``: the provider from the offline
    mirror only, the cluster's keys, no checkpoint calls and no IMDS lookups."""
    (work / "cli.tfrc").write_text(
        "provider_installation {\n"
        f'  filesystem_mirror {{\n    path = "{mirror()}"\n'
        '    include = ["registry.terraform.io/hashicorp/aws"]\n  }\n'
        '  direct { exclude = ["registry.terraform.io/hashicorp/aws"] }\n}\n'
    )
    env = {
        **os.environ,
        "TF_CLI_CONFIG_FILE": str(work / "cli.tfrc"),
        "TF_IN_AUTOMATION": "1",
        "CHECKPOINT_DISABLE": "1",
        "AWS_ACCESS_KEY_ID": cluster.key,
        "AWS_SECRET_ACCESS_KEY": cluster.secret,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    env.pop("AWS_PROFILE", None)

    def tf(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["terraform", *args, "-no-color"], cwd=work, env=env,
                              capture_output=True, text=True, timeout=timeout)

    return tf


@pytest.mark.timeout(600)  # two provider waits of >= 10 s each; slow on a busy machine
def test_aws_instance_apply_destroy(tmp_path: Path) -> None:
    mirror()  # fails at once, saying how, when Terraform or the provider is missing
    cluster: ThreadedCluster = make_cluster(tmp_path / "cluster")
    try:
        work = tmp_path / "tf"
        work.mkdir()
        (work / "main.tf").write_text(MAIN_TF.format(
            version=PROVIDER_VERSION, endpoint=cluster.endpoint, image=IMAGE))
        tf = terraform_in(work, cluster, timeout=300)

        for step in (["init", "-input=false"], ["apply", "-auto-approve", "-input=false"]):
            res = tf(*step)
            assert res.returncode == 0, f"terraform {step[0]}:\n{res.stdout}\n{res.stderr}"
        iid = tf("output", "-raw", "id").stdout.strip()
        record = cluster.record(iid)
        assert record is not None and record.tags == {"Name": "roost-terraform"}

        # No separate `terraform plan`: apply and destroy each refresh the instance
        # (DescribeInstances, attributes, credit specification) and would fail on a
        # shape the provider cannot read. Each extra run costs ~10 s of provider start.
        res = tf("destroy", "-auto-approve", "-input=false")
        assert res.returncode == 0, f"terraform destroy:\n{res.stdout}\n{res.stderr}"
        gone = cluster.record(iid)
        assert gone is not None and gone.state == "terminated"
    finally:
        cluster.stop()
