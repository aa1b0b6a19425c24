"""EBS rules that need no state: device names, size ranges, EC2's default iops and
throughput, and the ids derived for launch volumes."""

from __future__ import annotations

import pytest

from roost.domain.volumes import (
    Attachment,
    Volume,
    default_iops,
    default_throughput,
    launch_volume_id,
    size_error,
    valid_device,
)


@pytest.mark.parametrize("name", ["/dev/sdb", "/dev/sdf1", "/dev/xvdba", "/dev/sdb19", "xvdh"])
def test_device_names_ec2_takes(name: str) -> None:
    assert valid_device(name)


@pytest.mark.parametrize("name", ["", "sdb", "/dev/nvme0n1", "/dev/sd", "/dev/sdB", "/dev/sdb123"])
def test_device_names_ec2_refuses(name: str) -> None:
    assert not valid_device(name)


def test_size_ranges_per_type() -> None:
    assert size_error("gp2", 1) == "" and size_error("gp3", 16384) == ""
    assert "out of range for sc1 (125-16384 GiB)" in size_error("sc1", 124)
    assert size_error("standard", 1025) != ""


def test_defaults() -> None:
    assert default_iops("gp2", 8) == 100 and default_iops("gp2", 1000) == 3000
    assert default_iops("gp2", 10_000) == 16000 and default_iops("gp3", 8) == 3000
    assert default_iops("standard", 8) is None
    assert default_throughput("gp3") == 125 and default_throughput("gp2") is None


def test_launch_volume_ids_are_stable_and_distinct() -> None:
    a = launch_volume_id("i-0123456789abcdef0", "/dev/sdb")
    assert a == launch_volume_id("i-0123456789abcdef0", "/dev/sdb")
    assert a != launch_volume_id("i-0123456789abcdef0", "/dev/sdc")
    assert a.startswith("vol-") and len(a) == 21


def test_state_follows_the_attachment() -> None:
    vol = Volume("vol-1", 1, "gp2", "z", "2026-01-01T00:00:00.000Z")
    assert vol.state == "available"
    att = Attachment("i-1", "/dev/sdf", "2026-01-01T00:00:00.000Z")
    assert Volume("vol-1", 1, "gp2", "z", "t", attachment=att).state == "in-use"
