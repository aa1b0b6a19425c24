"""DescribeInstances at 10,000 instances: filters, page and XML, CPU time per call.

Runs against whichever roost is on PYTHONPATH, so one script compares two commits:

    git archive <old> src | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old/src python bench/describe_instances_10k.py
    PYTHONPATH=src python bench/describe_instances_10k.py

CPU time (``process_time``) rather than wall time, so a busy machine skews it less.
"""
import statistics
import time

from roost.bus import schemas as s
from roost.domain.catalog import BUILTIN
from roost.gateway import render
from roost.gateway.describe import INSTANCE_FIELDS, apply_filters, paginate
from roost.gateway.model import Paged, Reservation
from roost.gateway.requests import Filter, Page

N = 10_000
new = hasattr(s, "InstanceNetwork")
recs = []
for i in range(N):
    kw = dict(instance_id=f"i-{i:017x}", node_id="n1", instance_type="t3.micro",
              image_id="ami-00000000000000001", state="running", launch_id=f"r-{i}-0",
              reservation_id=f"r-{i:017x}", launch_time="2026-01-01T00:00:00.000Z",
              availability_zone="roost-1a", tags={"Name": f"web-{i}"} if i % 2 else {},
              private_ip=f"172.31.{i // 250}.{i % 250 + 4}",
              updated_at="2026-01-01T00:00:00.000Z")
    if new:
        kw["network"] = s.InstanceNetwork(
            subnet_id="subnet-0123456789abcdef0", vpc_id="vpc-0123456789abcdef0",
            security_group_ids=["sg-0123456789abcdef0"], key_name="ops")
    if "public_ip" in s.InstanceRecord.__struct_fields__:  # default subnets map them
        kw["public_ip"] = f"198.18.{i // 250}.{i % 250 + 4}"
    recs.append(s.InstanceRecord(**kw))
types = dict(BUILTIN.items())
names = {"sg-0123456789abcdef0": "default"}
devices = None
if hasattr(render, "Devices"):  # the volume lookup DescribeInstances makes per instance
    from roost.gateway.volactions import devices_of
    from roost.gateway.volservice import VolumeService
    from roost.gateway.volumes import VolumeStore
    devices = devices_of(VolumeService(VolumeStore(None, lambda: recs), None, list))

try:  # reservations in launch order, paged as reservations (Ec2Reads.describe_instances)
    from roost.gateway.reads import launch_order
except ImportError:
    launch_order = None


def once(filters):
    chosen = apply_filters(recs, filters, INSTANCE_FIELDS, tags=lambda r: r.tags)
    if launch_order is not None:
        grouped = {}
        for r in chosen:
            grouped.setdefault(r.reservation_id, []).append(r)
        rs = (Reservation(k, "000000000000", tuple(sorted(v, key=lambda r: r.ami_launch_index)))
              for k, v in grouped.items())
        res = paginate(rs, Page(), key=launch_order).items
    else:
        page = paginate(chosen, Page(), key=lambda r: r.instance_id)
        grouped = {}
        for r in page.items:
            grouped.setdefault(r.reservation_id, []).append(r)
        res = tuple(Reservation(k, "000000000000", tuple(v)) for k, v in grouped.items())
    if devices is not None:
        return render.describe_instances(Paged(res), types, "req", names, devices)
    if new:
        return render.describe_instances(Paged(res), types, "req", names)
    return render.describe_instances(Paged(res), types, "req")

FILTERED = [Filter("instance-state-name", ("running",)), Filter("tag:Name", ("web-1*",))]
for label, filters in (("all", []), ("filtered", FILTERED)):
    once(filters)
    times = []
    for _ in range(7):
        t = time.process_time()
        out = once(filters)
        times.append(time.process_time() - t)
    print(f"{'new' if new else 'old'} {label}: median {statistics.median(times) * 1000:.1f} ms"
          f"  min {min(times) * 1000:.1f} ms  bytes {len(out)}")
