"""`roost up` as a user runs it, driven by the AWS CLI v1 it tells them to paste."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

AWS = Path(sys.executable).parent / "aws"


def read_until(proc: subprocess.Popen[bytes], log: Path, marker: str,
               timeout: float = 60.0) -> str:
    """The output so far, once it holds ``marker``; fails with it on timeout or exit."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        text = log.read_text(errors="replace")
        if marker in text:
            return text
        time.sleep(0.05)
    raise AssertionError(f"no {marker!r} from roost up; got:\n{log.read_text()}")


@pytest.fixture
def roost_up(
    tmp_path: Path, outside_tmp: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Path, str]]:
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from roost.up.cli import up; up()", "--nodes", "3",
             "--driver", "sim", "--node-capacity", "4vcpu,8GiB", "--port", "0",
             "--nats-port", "0", "--data-dir", str(outside_tmp / "up")],
            stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        yield proc, log, read_until(proc, log, "Ctrl-C stops everything")
    finally:
        if proc.poll() is None:  # the test failed before its own Ctrl-C
            os.kill(proc.pid, signal.SIGINT)  # so that roost up stops its nats-server too
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)


def test_roost_up_then_the_pasted_aws_cli_line(
    roost_up: tuple[subprocess.Popen[bytes], Path, str],
) -> None:
    if not AWS.exists():
        pytest.fail(f"the AWS CLI is not installed at {AWS} (pip install awscli)")
    proc, log, banner = roost_up
    export = re.search(r"export (.+)", banner)
    run_line = re.search(r"(aws ec2 run-instances .+)", banner)
    assert export and run_line, banner
    env = dict(os.environ)
    env.update(dict(kv.split("=", 1) for kv in export.group(1).split()))
    env.pop("AWS_PROFILE", None)

    def aws(*args: str) -> dict[str, object]:
        res = subprocess.run([str(AWS), *args, "--output", "json"], env=env,
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        return dict(json.loads(res.stdout)) if res.stdout.strip() else {}

    pasted = shlex.split(run_line.group(1))
    out = aws(*pasted[1:])
    instances = out["Instances"]
    assert isinstance(instances, list) and len(instances) == 1
    iid = instances[0]["InstanceId"]
    endpoint = pasted[pasted.index("--endpoint-url") + 1]

    described = aws("ec2", "describe-instances", "--endpoint-url", endpoint,
                    "--instance-ids", iid)
    reservations = described["Reservations"]
    assert isinstance(reservations, list)
    assert reservations[0]["Instances"][0]["InstanceId"] == iid

    gone = aws("ec2", "terminate-instances", "--endpoint-url", endpoint, "--instance-ids", iid)
    changes = gone["TerminatingInstances"]
    assert isinstance(changes, list) and changes[0]["InstanceId"] == iid

    # The key roost up made is the default account's, in the accounts bucket, and the
    # env file it wrote points `roost accounts` at this cluster and its operator key.
    data_dir = Path(banner.rsplit("source ", 1)[1].split()[0].rstrip(")")).parent
    for line in (data_dir / "env").read_text().splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        env[name] = value
    shown = subprocess.run([sys.executable, "-m", "roost", "accounts", "show", "000000000000",
                            "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    keys = [(k["access_key_id"], k["admin"]) for k in json.loads(shown.stdout)["keys"]]
    assert keys == [(env["AWS_ACCESS_KEY_ID"], True)]  # the operator's: sees every account
    for secret_file in ("operator.key", "credentials.json", "env"):
        assert (data_dir / secret_file).stat().st_mode & 0o777 == 0o600

    os.kill(proc.pid, signal.SIGINT)  # Ctrl-C
    assert proc.wait(30) == 0
    assert "roost stopped." in log.read_text()
