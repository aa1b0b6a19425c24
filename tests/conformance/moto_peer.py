"""A peer's conformance suite against roost: moto's own EC2 instance tests, run in moto's
server mode against a real roost cluster.

Nothing of moto's code is committed. Its sdist is fetched with pip at test time (once per
test run), the handful of files its test module needs are extracted, and pytest runs them
in a subprocess with ``TEST_SERVER_MODE=true``. Every boto3 client moto's tests make then
talks to ``TEST_SERVER_MODE_ENDPOINT``: a small loopback shim in front of the gateway
that does only what moto's server does beside EC2:

- ``POST /moto-api/reset`` (every ``mock_aws`` context starts with it) empties the
  cluster through the EC2 API: it terminates every instance and deletes what moto's tests
  create (key pairs, launch templates, volumes, security groups, subnets, VPCs), and
  creates the default VPC and subnets again if a test deleted them, as a fresh account
  has them;
- STS ``GetCallerIdentity`` (the suite's ``account_id`` fixture) answers with the
  gateway's owner id: roost serves no STS;
- moto's example AMIs are registered with roost as an operator would register them
  (RegisterImage with their root device, ``/dev/sda1``), and their ids are mapped to
  the ids roost gave them on the way in and back on the way out.

- as moto's server keeps one backend per region, the shim sends each request to the
  roost cluster of the region it was signed for (the credential scope of its SigV4
  ``Authorization`` header): one cluster per region, as an operator runs one per site,
  each behind its own endpoint as EC2's regions are.

Every other byte of a request reaches the gateway as the test sent it. The shim re-signs
requests (SigV4, the cluster's keys) because mapping an AMI id changes the signed body.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import boto3
import urllib3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

MOTO_VERSION = "5.2.5"
MODULE = "tests/test_ec2/test_instances.py"
SUITE_FILES = (
    "tests/__init__.py",
    "tests/conftest.py",
    "tests/markers.py",
    "tests/test_ec2/__init__.py",
    "tests/test_ec2/conftest.py",
    "tests/test_ec2/helpers.py",
    MODULE,
)

REGIONS: Mapping[str, tuple[str, ...]] = {
    "us-east-1": ("us-east-1a", "us-east-1b", "us-east-1c"),
    "us-west-1": ("us-west-1a", "us-west-1b"),
    "us-west-2": ("us-west-2a",),
    "eu-central-1": ("eu-central-1a",),
    "eu-west-1": ("eu-west-1a",),
    "ap-south-1": ("ap-south-1a", "ap-south-1b", "ap-south-1c"),
}
"""The regions moto's instance tests sign their requests for, and the zones (one node
each) of the roost cluster that serves each: moto's zones where a test names them
(``us-west-1a``/``b``, ``ap-south-1b``/``c``), one zone elsewhere."""

MOTO_ACCOUNT = "123456789012"
"""moto's default account id (``moto.core.DEFAULT_ACCOUNT_ID``): the cluster under test
is configured with it as its owner id, as an operator names their account."""

EXAMPLE_AMIS: Mapping[str, str] = {
    "ami-12c6146b": "/dev/sda1",  # EXAMPLE_AMI_ID
    "ami-03cf127a": "/dev/sda1",  # EXAMPLE_AMI_ID2
}
"""moto's example AMIs (``tests/__init__.py``) and their root devices (moto's
``ec2/resources/amis.json``). ``EXAMPLE_AMI_PARAVIRTUAL`` and ``EXAMPLE_AMI_WINDOWS``
are not registered: no test that runs launches them."""


def register_examples(target: Target, workdir: Path) -> dict[str, str]:
    """Register moto's example AMIs with roost, each with its root device, as an
    operator registers an image (RegisterImage takes a disk file on the nodes' host: a
    small raw one here; the cluster's ``sim`` driver runs no disk). Returns moto's id
    -> roost's."""
    disk = workdir / "moto-example.raw"
    disk.write_bytes(bytes(4096))
    ec2 = target.client()
    out: dict[str, str] = {}
    for moto_id, root_device in EXAMPLE_AMIS.items():
        name = f"moto-example-{moto_id}"
        found = ec2.describe_images(Owners=["self"],
                                    Filters=[{"Name": "name", "Values": [name]}])["Images"]
        out[moto_id] = (found[0]["ImageId"] if found else ec2.register_image(
            Name=name, ImageLocation=str(disk), RootDeviceName=root_device)["ImageId"])
    return out


def fetch_suite(workdir: Path) -> Path:
    """moto's sdist from PyPI (``pip download``), and its test files extracted under
    ``workdir/moto-<version>``, which is returned (the suite's root)."""
    sdist_dir = workdir / "sdist"
    sdists = sorted(sdist_dir.glob(f"moto-{MOTO_VERSION}.tar.gz"))
    if not sdists:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", f"moto=={MOTO_VERSION}",
             "--no-binary", ":all:", "--no-deps", "-q",
             "-d", str(sdist_dir)],
            check=True, timeout=300,
        )
        sdists = sorted(sdist_dir.glob(f"moto-{MOTO_VERSION}.tar.gz"))
    root = workdir / f"moto-{MOTO_VERSION}"
    with tarfile.open(sdists[0]) as tar:
        for name in SUITE_FILES:
            tar.extract(f"moto-{MOTO_VERSION}/{name}", workdir, filter="data")
    # The suite's own pytest configuration lives in moto's setup.cfg; an empty one keeps
    # roost's (warnings as errors, asyncio mode) out of the peer's run.
    (root / "pytest.ini").write_text("[pytest]\n")
    return root


def _swap(data: bytes, pairs: Mapping[str, str]) -> bytes:
    for old, new in pairs.items():
        data = data.replace(old.encode(), new.encode())
    return data


_STS_IDENTITY = """<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <GetCallerIdentityResult>
    <Arn>arn:aws:iam::{account}:user/roost</Arn>
    <UserId>{key}</UserId>
    <Account>{account}</Account>
  </GetCallerIdentityResult>
  <ResponseMetadata><RequestId>00000000-0000-0000-0000-000000000000</RequestId></ResponseMetadata>
</GetCallerIdentityResponse>"""


@dataclass
class Target:
    """The gateway the shim fronts and the keys it signs with."""

    endpoint: str
    region: str
    key: str
    secret: str
    owner_id: str
    zones: tuple[str, ...] = ()
    _client: Any = field(default=None, repr=False)

    def client(self) -> Any:
        """One client for every reset: making a boto3 client costs more than a reset's
        calls (only the shim's handler thread uses it, one reset at a time)."""
        if self._client is None:
            self._client = boto3.client(
                "ec2", endpoint_url=self.endpoint, region_name=self.region,
                aws_access_key_id=self.key, aws_secret_access_key=self.secret,
                config=Config(retries={"total_max_attempts": 3, "mode": "standard"}),
            )
        return self._client


def reset(target: Target) -> None:
    """Empty the cluster as moto's reset empties moto: everything the suite can create."""
    ec2 = target.client()
    ids = [i["InstanceId"]
           for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
           if i["State"]["Name"] != "terminated"]
    for start in range(0, len(ids), 100):
        ec2.terminate_instances(InstanceIds=ids[start:start + 100])
    # A subnet whose instances are still shutting down cannot be deleted (as on EC2).
    deadline = time.monotonic() + 60
    while ids and time.monotonic() < deadline:
        pages = ec2.describe_instances(InstanceIds=ids)["Reservations"]
        ids = [i["InstanceId"] for r in pages for i in r["Instances"]
               if i["State"]["Name"] != "terminated"]
        time.sleep(0.05 if ids else 0)
    for t in ec2.describe_launch_templates()["LaunchTemplates"]:
        ec2.delete_launch_template(LaunchTemplateId=t["LaunchTemplateId"])
    for k in ec2.describe_key_pairs()["KeyPairs"]:
        ec2.delete_key_pair(KeyPairId=k["KeyPairId"])
    for v in ec2.describe_volumes()["Volumes"]:
        if v["State"] == "available":
            ec2.delete_volume(VolumeId=v["VolumeId"])
    for g in ec2.describe_security_groups()["SecurityGroups"]:
        if g["GroupName"] != "default":
            ec2.delete_security_group(GroupId=g["GroupId"])
    defaults: set[str] = set()  # zones with a default subnet
    for s in ec2.describe_subnets()["Subnets"]:
        if s.get("DefaultForAz"):
            defaults.add(s["AvailabilityZone"])
        else:
            ec2.delete_subnet(SubnetId=s["SubnetId"])
    default_vpc = False
    for v in ec2.describe_vpcs()["Vpcs"]:
        if v.get("IsDefault"):
            default_vpc = True
        else:
            ec2.delete_vpc(VpcId=v["VpcId"])
    # A fresh account has its default VPC and subnets: a test may have deleted them.
    if not default_vpc:
        ec2.create_default_vpc()
    elif missing := [z for z in target.zones if z not in defaults]:
        for zone in missing:
            ec2.create_default_subnet(AvailabilityZone=zone)


_SCOPE = re.compile(r"Credential=[^/,]+/\d{8}/([a-z0-9-]+)/")


class _Shim(BaseHTTPRequestHandler):
    targets: Mapping[str, Target]  # region -> its cluster
    pool: urllib3.PoolManager
    errors: list[str]
    amis: Mapping[str, Mapping[str, str]]  # region -> moto's id -> roost's
    touched: set[str]  # regions a request reached since the last reset

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            if name.lower() not in ("content-length", "transfer-encoding", "connection",
                                    "date", "server"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._forward()

    def do_POST(self) -> None:
        if self.path.startswith("/moto-api/reset"):
            # Only the regions used since the last reset have anything to empty.
            for region in sorted(self.touched):
                try:
                    reset(self.targets[region])
                except Exception as exc:  # shown in the report; the suite then runs on
                    self.errors.append(f"reset {region}: {exc!r}")
            self.touched.clear()
            self._answer(200, b'{"status": "ok"}', {"Content-Type": "application/json"})
            return
        self._forward()

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        form = parse_qs(body.decode(errors="replace"))
        scope = _SCOPE.search(self.headers.get("Authorization") or "")
        region = scope.group(1) if scope else ""
        target = self.targets.get(region)
        if form.get("Action") == ["GetCallerIdentity"]:
            anyone = next(iter(self.targets.values()))
            xml = _STS_IDENTITY.format(account=anyone.owner_id, key=anyone.key)
            self._answer(200, xml.encode(), {"Content-Type": "text/xml"})
            return
        if target is None:
            self.errors.append(f"a request signed for {region!r}, a region with no cluster")
            self._answer(400, b"no cluster serves this region", {})
            return
        self.touched.add(region)
        amis = self.amis[region]
        body = _swap(body, amis)
        url = target.endpoint + self.path
        headers = {k: v for k, v in self.headers.items()
                   if k.lower() in ("content-type", "user-agent")}
        request = AWSRequest(method=self.command, url=url, data=body, headers=headers)
        SigV4Auth(Credentials(target.key, target.secret), "ec2",
                  target.region).add_auth(request)
        reply = self.pool.request(self.command, url, body=body,
                                  headers=dict(request.headers.items()), retries=False)
        back = {v: k for k, v in amis.items()}
        self._answer(reply.status, _swap(reply.data, back), dict(reply.headers))


@contextmanager
def shim(targets: Mapping[str, Target], workdir: Path) -> Iterator[tuple[str, list[str]]]:
    """A loopback shim in front of one cluster per region (``targets``): its URL, and the
    errors it met (a reset that failed, a request for a region with no cluster). moto's
    example AMIs are registered first in each region (`register_examples`, files in
    ``workdir``)."""
    errors: list[str] = []
    handler = type("Shim", (_Shim,), {
        "targets": targets, "errors": errors, "touched": set(targets),
        "amis": {region: register_examples(t, workdir) for region, t in targets.items()},
        "pool": urllib3.PoolManager(maxsize=8)})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", errors
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@dataclass
class Outcome:
    passed: list[str]
    failed: dict[str, str]  # test name -> first line of its failure
    skipped: list[str]

    @property
    def ran(self) -> int:
        return len(self.passed) + len(self.failed)


def parse_junit(path: Path) -> Outcome:
    passed: list[str] = []
    failed: dict[str, str] = {}
    skipped: list[str] = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if case.find("skipped") is not None:
            skipped.append(name)
        elif bad is not None:
            failed[name] = (bad.get("message") or "").splitlines()[0][:300] if bad.get(
                "message") else ""
        else:
            passed.append(name)
    return Outcome(sorted(passed), dict(sorted(failed.items())), sorted(skipped))


def run_suite(root: Path, endpoint: str, target: Target, *, timeout: float = 1200,
              extra: list[str] | None = None) -> Outcome:
    """moto's module under pytest in a subprocess, in server mode against ``endpoint``."""
    junit = root / "junit.xml"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MOTO_"))},
        "TEST_SERVER_MODE": "true",
        "TEST_SERVER_MODE_ENDPOINT": endpoint,
        "AWS_ACCESS_KEY_ID": target.key,
        "AWS_SECRET_ACCESS_KEY": target.secret,
        "AWS_DEFAULT_REGION": target.region,
        # One attempt: a 5xx shows as what it is, rather than as a 20 s backoff.
        "AWS_MAX_ATTEMPTS": "1",
        "AWS_RETRY_MODE": "standard",
        # Only the plugin the run needs (a per-test timeout): the others installed here
        # (hypothesis, asyncio, playwright) cost seconds of start-up and nothing else.
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    subprocess.run(
        [sys.executable, "-m", "pytest", MODULE, "-q", "-p", "no:cacheprovider",
         "-p", "pytest_timeout", "--timeout", "60",
         "--junitxml", str(junit), *(extra or [])],
        cwd=root, env=env, timeout=timeout, check=False,
        stdout=subprocess.DEVNULL if not os.environ.get("ROOST_CONFORMANCE_VERBOSE") else None,
    )
    return parse_junit(junit)


def summary(outcome: Outcome) -> str:
    return json.dumps({"passed": len(outcome.passed), "failed": len(outcome.failed),
                       "skipped": len(outcome.skipped), "ran": outcome.ran})
