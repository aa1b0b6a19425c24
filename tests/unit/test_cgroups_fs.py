"""The cgroup library against directory trees laid out like cgroupfs.

A tmp tree cannot act like the kernel (no files appear on mkdir, nothing is enforced),
so `kernel_dir` plays the kernel's part for groups a test expects to exist, and the
checks are about what the library reads and writes: the right files, the right values.
"""

from __future__ import annotations

import errno
import signal
import subprocess
from pathlib import Path

import pytest

from roost.node.cgroups import (
    JOIN_SHIM,
    CgroupError,
    Cgroups,
    CgroupUnavailable,
    Limits,
    Usage,
    detect,
)
from roost.node.cgroups._detect import parse_mountinfo

OWN = "/process_api/abc"
MIB = 1024 * 1024

V1_FILES = {
    "memory": {
        "memory.limit_in_bytes": "9223372036854771712",
        "memory.memsw.limit_in_bytes": "9223372036854771712",
        "memory.swappiness": "60",
        "memory.use_hierarchy": "1",
        "memory.usage_in_bytes": "0",
        "memory.max_usage_in_bytes": "0",
        "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
    },
    "cpu": {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "-1"},
    "cpuacct": {"cpuacct.usage": "0"},
    "cpu,cpuacct": {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "-1", "cpuacct.usage": "0"},
    "pids": {"pids.max": "max"},
    "freezer": {"freezer.state": "THAWED"},
}
V2_CONTROLLERS = "cpuset cpu io memory hugetlb pids rdma misc"
V2_FILES = {
    "cgroup.controllers": V2_CONTROLLERS,
    "cgroup.subtree_control": "",
    "cgroup.events": "populated 0\nfrozen 0\n",
    "cgroup.freeze": "0",
    "cgroup.kill": "",
    "cpu.max": "max 100000",
    "cpu.stat": "usage_usec 0\nuser_usec 0\nsystem_usec 0\n",
    "memory.max": "max",
    "memory.swap.max": "max",
    "memory.current": "0",
    "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
    "pids.max": "max",
}


@pytest.fixture(autouse=True)
def default_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """These trees are laid out with roost's default root directory name; the test
    session itself runs its nodes under a root of its own (tests/conftest.py)."""
    monkeypatch.setenv("ROOST_CGROUP_ROOT", "roost")


def kernel_dir(d: Path, files: dict[str, str]) -> Path:
    """What the kernel's mkdir would make: the directory with its control files."""
    d.mkdir(parents=True, exist_ok=True)
    for name, value in {"cgroup.procs": "", **files}.items():
        (d / name).write_text(value)
    return d


def v1_host(tmp: Path, *, comount: bool = False, skip: tuple[str, ...] = ()) -> dict[str, Path]:
    """A hybrid host like the one these tests run on: v1 controllers mounted apart (or
    cpu,cpuacct together), an empty cgroup2 at unified, and the agent's memory group
    at /process_api/abc."""
    base = tmp / "sys/fs/cgroup"
    names = ["cpu,cpuacct"] if comount else ["cpu", "cpuacct"]
    names += ["cpuset", "memory", "devices", "freezer", "blkio", "pids"]
    names = [n for n in names if n not in skip]
    lines, cgroup_lines = [], ["0::/"]
    for i, name in enumerate(names):
        kernel_dir(base / name, V1_FILES.get(name, {}))
        lines.append(
            f"{32 + i} 31 0:{29 + i} / {base / name} rw,relatime - cgroup cgroup rw,{name}"
        )
        cgroup_lines.append(f"{i + 1}:{name}:{OWN if name == 'memory' else '/'}")
    if "memory" in names:
        kernel_dir(base / "memory" / OWN.strip("/"), V1_FILES["memory"])
    lines.append(f"40 31 0:37 / {base / 'systemd'} rw - cgroup cgroup rw,name=systemd")
    kernel_dir(base / "unified", {"cgroup.controllers": "", "cgroup.subtree_control": ""})
    lines.append(f"41 31 0:38 / {base / 'unified'} rw,relatime - cgroup2 cgroup2 rw")
    (tmp / "mountinfo").write_text("\n".join(lines) + "\n")
    (tmp / "cgroup").write_text("\n".join(cgroup_lines) + "\n")
    return {n: base / n for n in names}


def v2_host(tmp: Path, controllers: str = V2_CONTROLLERS) -> Path:
    mount = kernel_dir(
        tmp / "sys/fs/cgroup", {"cgroup.controllers": controllers, "cgroup.subtree_control": ""}
    )
    (tmp / "mountinfo").write_text(
        f"29 23 0:26 / {mount} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
    )
    (tmp / "cgroup").write_text("0::/system.slice/roost-agent.service\n")
    return mount


def detect_in(tmp: Path, node_id: str = "n1", **kwargs: object) -> Cgroups:
    return detect(
        node_id,
        mountinfo=tmp / "mountinfo",
        proc_self_cgroup=tmp / "cgroup",
        proc=tmp / "proc",
        **kwargs,  # type: ignore[arg-type]
    )


def v1_group_dirs(mounts: dict[str, Path], instance: str, node: str = "n1") -> dict[str, Path]:
    """Play the kernel for a v1 group: its directories, with control files, exist."""
    out = {}
    for name, mount in mounts.items():
        own = mount / OWN.strip("/") if name == "memory" else mount
        for d in (own / "roost", own / "roost" / node):
            kernel_dir(d, V1_FILES.get(name, {}))
        out[name] = kernel_dir(own / "roost" / node / instance, V1_FILES.get(name, {}))
    return out


def v2_group_dirs(mount: Path, instance: str, parent: str = "roost", node: str = "n1") -> Path:
    kernel_dir(mount / parent, V2_FILES)
    kernel_dir(mount / parent / node, V2_FILES)
    return kernel_dir(mount / parent / node / instance, V2_FILES)


# detection


def test_hybrid_host_uses_v1_under_the_agents_own_groups(tmp_path: Path) -> None:
    mounts = v1_host(tmp_path)
    cg = detect_in(tmp_path)
    assert cg.version == 1
    assert cg.root.startswith("v1:")
    assert set(cg.root.removeprefix("v1:").split(",")) == {
        f"cpu={mounts['cpu']}/roost/n1",
        f"cpuacct={mounts['cpuacct']}/roost/n1",
        f"memory={mounts['memory']}{OWN}/roost/n1",
        f"pids={mounts['pids']}/roost/n1",
        f"freezer={mounts['freezer']}/roost/n1",
    }
    # The write probe made and removed the node root: nothing is left behind.
    assert not (mounts["memory"] / OWN.strip("/") / "roost").exists()
    assert not (mounts["pids"] / "roost").exists()


def test_comounted_cpu_cpuacct_is_one_hierarchy(tmp_path: Path) -> None:
    mounts = v1_host(tmp_path, comount=True)
    cg = detect_in(tmp_path)
    v1_group_dirs(mounts, "i-1")
    group = cg.create("i-1", Limits(500, 32, 8))
    files = group.procs_files()
    assert len(files) == 4  # cpu,cpuacct + memory + pids + freezer
    assert mounts["cpu,cpuacct"] / "roost/n1/i-1/cgroup.procs" in files
    assert (mounts["cpu,cpuacct"] / "roost/n1/i-1/cpu.cfs_quota_us").read_text() == "50000"


def test_mountinfo_root_field_maps_a_bind_mounted_subtree(tmp_path: Path) -> None:
    """A container that sees only its own memory subtree mounts it with root=OWN."""
    mounts = v1_host(tmp_path)
    text = (tmp_path / "mountinfo").read_text()
    text = text.replace(f"/ {mounts['memory']} ", f"{OWN} {mounts['memory']} ")
    (tmp_path / "mountinfo").write_text(text)
    cg = detect_in(tmp_path)
    assert f"memory={mounts['memory']}/roost/n1" in cg.root


def test_own_group_outside_every_mount_is_unavailable(tmp_path: Path) -> None:
    mounts = v1_host(tmp_path)
    text = (tmp_path / "mountinfo").read_text()
    (tmp_path / "mountinfo").write_text(
        text.replace(f"/ {mounts['memory']} ", f"/elsewhere {mounts['memory']} ")
    )
    with pytest.raises(CgroupUnavailable, match="outside every memory mount"):
        detect_in(tmp_path)


def test_missing_v1_controller_without_v2_controllers_is_unavailable(tmp_path: Path) -> None:
    v1_host(tmp_path, skip=("pids",))
    with pytest.raises(CgroupUnavailable) as caught:
        detect_in(tmp_path)
    message = str(caught.value)
    assert "no pids hierarchy mounted" in message
    assert "lacks memory,cpu,pids" in message
    assert "\n" not in message


def test_freezer_is_optional_on_v1(tmp_path: Path) -> None:
    mounts = v1_host(tmp_path, skip=("freezer",))
    cg = detect_in(tmp_path)
    v1_group_dirs(mounts, "i-1")
    group = cg.create("i-1", Limits(1000, 64, 32))
    assert not group.can_freeze
    assert len(group.procs_files()) == 4


def test_unhierarchical_own_memory_group_is_refused(tmp_path: Path) -> None:
    mounts = v1_host(tmp_path)
    (mounts["memory"] / OWN.strip("/") / "memory.use_hierarchy").write_text("0")
    with pytest.raises(CgroupUnavailable, match="escape its memory limit"):
        detect_in(tmp_path)


def test_pure_v2_host(tmp_path: Path) -> None:
    mount = v2_host(tmp_path)
    cg = detect_in(tmp_path)
    assert cg.version == 2
    assert cg.root == f"v2:{mount}/roost/n1"
    assert not (mount / "roost").exists()


def test_v2_without_pids_is_unavailable(tmp_path: Path) -> None:
    v2_host(tmp_path, controllers="cpu memory")
    with pytest.raises(CgroupUnavailable, match=r"cgroup\.controllers lacks pids"):
        detect_in(tmp_path)


def test_no_cgroup_mounts_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "mountinfo").write_text("22 1 0:21 / /proc rw - proc proc rw\n")
    (tmp_path / "cgroup").write_text("0::/\n")
    with pytest.raises(CgroupUnavailable, match=r"no memory hierarchy mounted.*no cgroup2 mount"):
        detect_in(tmp_path)


def test_unreadable_mountinfo_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(CgroupUnavailable, match=r"cannot read .*mountinfo"):
        detect_in(tmp_path)


def test_mountinfo_escapes_are_decoded() -> None:
    line = r"41 31 0:38 / /mnt/my\040cgroups rw - cgroup2 cgroup2 rw"
    assert parse_mountinfo(line)[0].point == Path("/mnt/my cgroups")


# limits


def test_v1_limits_are_written_to_each_controller(tmp_path: Path) -> None:
    mounts = v1_host(tmp_path)
    cg = detect_in(tmp_path)
    dirs = v1_group_dirs(mounts, "i-1")
    cg.create("i-1", Limits(cpu_milli=1500, mem_mib=64, pids_max=32))
    assert (dirs["cpu"] / "cpu.cfs_period_us").read_text() == "100000"
    assert (dirs["cpu"] / "cpu.cfs_quota_us").read_text() == "150000"
    assert (dirs["memory"] / "memory.limit_in_bytes").read_text() == str(64 * MIB)
    assert (dirs["memory"] / "memory.memsw.limit_in_bytes").read_text() == str(64 * MIB)
    assert (dirs["memory"] / "memory.swappiness").read_text() == "0"
    assert (dirs["pids"] / "pids.max").read_text() == "32"


def test_v1_create_is_idempotent_and_reapplies_limits(tmp_path: Path) -> None:
    mounts = v1_host(tmp_path)
    cg = detect_in(tmp_path)
    dirs = v1_group_dirs(mounts, "i-1")
    cg.create("i-1", Limits(1000, 64, 32))
    again = cg.create("i-1", Limits(1000, 128, 64))
    assert again.name == "i-1"
    assert (dirs["memory"] / "memory.limit_in_bytes").read_text() == str(128 * MIB)
    assert (dirs["memory"] / "memory.memsw.limit_in_bytes").read_text() == str(128 * MIB)
    assert (dirs["pids"] / "pids.max").read_text() == "64"


def test_v1_without_swap_accounting_writes_no_memsw(tmp_path: Path) -> None:
    mounts = v1_host(tmp_path)
    cg = detect_in(tmp_path)
    dirs = v1_group_dirs(mounts, "i-1")
    (dirs["memory"] / "memory.memsw.limit_in_bytes").unlink()
    cg.create("i-1", Limits(1000, 64, 32))
    assert not (dirs["memory"] / "memory.memsw.limit_in_bytes").exists()
    assert (dirs["memory"] / "memory.limit_in_bytes").read_text() == str(64 * MIB)


def test_a_failed_create_names_the_file_and_undoes_its_directories(tmp_path: Path) -> None:
    """In a tmp tree mkdir makes no control files, as if every controller were missing."""
    mounts = v1_host(tmp_path)
    cg = detect_in(tmp_path)
    with pytest.raises(CgroupError, match=r"cpu\.cfs_period_us") as caught:
        cg.create("i-1", Limits(1000, 64, 32))
    assert str(mounts["cpu"]) in str(caught.value)
    assert cg.instance_ids() == []
    assert cg.open("i-1") is None


def test_v2_limits_and_subtree_control(tmp_path: Path) -> None:
    mount = v2_host(tmp_path)
    cg = detect_in(tmp_path)
    d = v2_group_dirs(mount, "i-1")
    cg.create("i-1", Limits(cpu_milli=500, mem_mib=64, pids_max=32))
    for parent in (mount, mount / "roost", mount / "roost/n1"):
        assert (parent / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert (d / "cpu.max").read_text() == "50000 100000"
    assert (d / "memory.max").read_text() == str(64 * MIB)
    assert (d / "memory.swap.max").read_text() == "0"
    assert (d / "pids.max").read_text() == "32"


def test_v2_enables_only_missing_controllers(tmp_path: Path) -> None:
    mount = v2_host(tmp_path)
    (mount / "cgroup.subtree_control").write_text("cpu memory pids io")
    cg = detect_in(tmp_path)
    v2_group_dirs(mount, "i-1")
    cg.create("i-1", Limits(500, 64, 32))
    assert (mount / "cgroup.subtree_control").read_text() == "cpu memory pids io"


def test_v2_delegated_parent_leaves_the_root_alone(tmp_path: Path) -> None:
    mount = v2_host(tmp_path)
    parent = "user.slice/roost.service"
    cg = detect_in(tmp_path, parent=parent)
    assert cg.root == f"v2:{mount}/{parent}/n1"
    d = v2_group_dirs(mount, "i-1", parent=parent)
    cg.create("i-1", Limits(500, 64, 32))
    assert (mount / "cgroup.subtree_control").read_text() == ""
    assert (mount / parent / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert (d / "pids.max").read_text() == "32"


def test_v2_parent_lacking_a_controller_says_where(tmp_path: Path) -> None:
    mount = v2_host(tmp_path)
    cg = detect_in(tmp_path, parent="delegated")
    v2_group_dirs(mount, "i-1", parent="delegated")
    (mount / "delegated/cgroup.controllers").write_text("cpu memory")
    with pytest.raises(CgroupUnavailable, match=r"delegated/cgroup\.controllers lacks pids"):
        cg.create("i-1", Limits(500, 64, 32))


def test_v2_at_without_controllers_skips_limits(tmp_path: Path) -> None:
    mount = kernel_dir(tmp_path / "unified", {"cgroup.controllers": ""})
    cg = Cgroups.v2_at(mount, "roost-test", "n1", require_controllers=False)
    d = v2_group_dirs(mount, "i-1", parent="roost-test")
    group = cg.create("i-1", Limits(500, 64, 32))
    assert (d / "pids.max").read_text() == "max"
    assert group.usage() == Usage(0.0, 0, 0, 0)
    with pytest.raises(CgroupUnavailable, match="lacks memory,cpu,pids"):
        Cgroups.v2_at(mount, "roost-test", "n1")


# usage, membership, listing, removal


def test_v1_usage(tmp_path: Path) -> None:
    mounts = v1_host(tmp_path)
    cg = detect_in(tmp_path)
    dirs = v1_group_dirs(mounts, "i-1")
    group = cg.create("i-1", Limits(1000, 64, 32))
    (dirs["cpuacct"] / "cpuacct.usage").write_text("2500000000\n")
    (dirs["memory"] / "memory.usage_in_bytes").write_text("1048576\n")
    (dirs["memory"] / "memory.max_usage_in_bytes").write_text("4194304\n")
    (dirs["memory"] / "memory.oom_control").write_text(
        "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"
    )
    assert group.usage() == Usage(2.5, 1048576, 4194304, 3)


def test_v2_usage_without_memory_peak(tmp_path: Path) -> None:
    mount = v2_host(tmp_path)
    cg = detect_in(tmp_path)
    d = v2_group_dirs(mount, "i-1")
    group = cg.create("i-1", Limits(500, 64, 32))
    (d / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\n")
    (d / "memory.current").write_text("8192\n")
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n")
    assert group.usage() == Usage(1.5, 8192, 0, 2)
    (d / "memory.peak").write_text("65536\n")
    assert group.usage().memory_peak_bytes == 65536


def test_instance_ids_open_and_remove(tmp_path: Path) -> None:
    mounts = v1_host(tmp_path)
    cg = detect_in(tmp_path)
    dirs = v1_group_dirs(mounts, "i-2")
    v1_group_dirs(mounts, "i-1")
    (mounts["pids"] / "roost/n1/not.an.id").mkdir()
    cg.create("i-1", Limits(1000, 64, 32))
    cg.create("i-2", Limits(1000, 64, 32))
    assert cg.instance_ids() == ["i-1", "i-2"]
    assert cg.open("i-3") is None
    group = cg.open("i-2")
    assert group is not None and group.version == 1
    (dirs["pids"] / "cgroup.procs").write_text("4242\n")
    assert group.pids() == {4242} and group.populated()
    with pytest.raises(CgroupError, match="still populated") as caught:
        group.remove()
    assert caught.value.errno == errno.EBUSY
    assert str(dirs["memory"]) in str(caught.value)
    for d in dirs.values():  # the kernel's rmdir drops the control files with the dir
        for f in d.iterdir():
            f.unlink()
    group.remove()
    group.remove()  # a missing directory is already removed
    assert cg.instance_ids() == ["i-1"]


def test_group_of_reads_proc_pid_cgroup(tmp_path: Path) -> None:
    v1_host(tmp_path)
    cg = detect_in(tmp_path)
    proc = tmp_path / "proc"
    (proc / "100").mkdir(parents=True)
    (proc / "100/cgroup").write_text(
        f"8:pids:/roost/n1/i-7\n4:memory:{OWN}/roost/n1/i-7\n1:cpu:/\n0::/\n"
    )
    (proc / "101").mkdir()
    (proc / "101/cgroup").write_text(f"8:pids:/roost/n2/i-7\n4:memory:{OWN}\n0::/\n")
    assert cg.group_of(100) == "i-7"
    assert cg.group_of(101) is None  # another node's group is not ours
    assert cg.group_of(102) is None  # gone


def test_ids_cannot_escape(tmp_path: Path) -> None:
    v1_host(tmp_path)
    cg = detect_in(tmp_path)
    for bad in ("../x", "a/b", "", ".", "i 1"):
        with pytest.raises(ValueError, match="invalid instance id"):
            cg.create(bad, Limits(1000, 64, 32))
    with pytest.raises(ValueError, match="invalid node id"):
        detect_in(tmp_path, node_id="../n1")


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="mem_mib"):
        Limits(1000, 0, 32)
    assert Limits(5, 64, 32).cpu_quota_us == 1000  # the kernel's floor, not a refusal


def test_join_command_is_the_documented_shim(tmp_path: Path) -> None:
    mount = v2_host(tmp_path)
    cg = detect_in(tmp_path)
    v2_group_dirs(mount, "i-1")
    group = cg.create("i-1", Limits(500, 64, 32))
    procs = str(mount / "roost/n1/i-1/cgroup.procs")
    assert group.join_command(["python3", "-c", "pass"]) == [
        "/bin/sh",
        "-c",
        JOIN_SHIM,
        "roost-join",
        procs,
        "--",
        "python3",
        "-c",
        "pass",
    ]
    assert JOIN_SHIM == (
        'while [ "$1" != -- ]; do echo $$ > "$1" || { echo "roost: cannot join cgroup $1" >&2;'
        ' exit 125; }; shift; done; shift; exec "$@"'
    )


@pytest.mark.parametrize("skip", [(), ("freezer",)], ids=["frozen", "unfrozen"])
def test_kill_all_passes_over_a_vanished_pid(tmp_path: Path, skip: tuple[str, ...]) -> None:
    mounts = v1_host(tmp_path, skip=skip)
    cg = detect_in(tmp_path)
    dirs = v1_group_dirs(mounts, "i-1")
    group = cg.create("i-1", Limits(1000, 64, 32))
    exited = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True)
    (dirs["pids"] / "cgroup.procs").write_text(exited.stdout)
    assert group.kill_all(signal.SIGTERM) == 0
    if not skip:  # froze, then thawed, through freezer.state
        assert (dirs["freezer"] / "freezer.state").read_text() == "THAWED"
