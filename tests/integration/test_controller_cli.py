"""``roost pools``, ``roost db migrate`` and ``roost controller``'s settings, through the
click objects (the commands run their own event loop, so they run in a thread here)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import asyncpg
from click.testing import CliRunner, Result

from roost.controller.cli import controller, db, pools


async def invoke(cmd: Any, *args: str, env: dict[str, str] | None = None) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, cmd, list(args), env=env)


async def test_db_migrate_is_idempotent(pg_dsn: str) -> None:
    first = await invoke(db, "migrate", "--dsn", pg_dsn)
    assert first.exit_code == 0, first.output
    assert "applied 0001 controller" in first.output and "applied 0002 tasks" in first.output
    again = await invoke(db, "migrate", env={"ROOST_CONTROLLER_DSN": pg_dsn})
    assert again.exit_code == 0 and "up to date" in again.output


async def test_pools_create_list_update_delete(pg_dsn: str) -> None:
    assert (await invoke(db, "migrate", "--dsn", pg_dsn)).exit_code == 0
    env = {"ROOST_DSN": pg_dsn}
    made = await invoke(pools, "create", "batch", "--max", "8", "--target", "4",
                        "--cpu-milli", "500", "--memory-mib", "1024", "--db-pool-size", "3",
                        "--orchestrator", "static", "--ref", "batch", env=env)
    assert made.exit_code == 0, made.output
    dup = await invoke(pools, "create", "batch", "--max", "8", "--target", "4",
                       "--cpu-milli", "500", "--memory-mib", "1024", "--db-pool-size", "3",
                       "--orchestrator", "static", env=env)
    assert dup.exit_code == 1 and "already exists" in dup.output
    listed = await invoke(pools, "list", "--json", env=env)
    [row] = json.loads(listed.output)
    assert (row["pool_id"], row["max_replicas"], row["target_per_replica"]) == ("batch", 8, 4)
    upd = await invoke(pools, "update", "batch", "--min", "2", "--revision", "r7", "--json",
                       env=env)
    assert upd.exit_code == 0, upd.output
    [row] = json.loads(upd.output)
    assert (row["min_replicas"], row["expected_revision"], row["max_replicas"]) == (2, "r7", 8)
    bad = await invoke(pools, "update", "batch", "--min", "9", env=env)
    assert bad.exit_code == 1 and "min_replicas <= max_replicas" in bad.output
    table = await invoke(pools, "list", env={**env, "COLUMNS": "200"})
    assert "batch" in table.output and "static" in table.output

    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute("INSERT INTO workers (id, pool_id) VALUES ('w1', 'batch')")
        busy = await invoke(pools, "delete", "batch", env=env)
        assert busy.exit_code == 1 and "1 live workers" in busy.output
        forced = await invoke(pools, "delete", "batch", "--force", env=env)
        assert forced.exit_code == 0
        assert await conn.fetchval("SELECT count(*) FROM workers") == 0
    finally:
        await conn.close()
    missing = await invoke(pools, "delete", "batch", env=env)
    assert missing.exit_code == 1 and "no worker pool 'batch'" in missing.output


async def test_pools_without_a_schema_say_so(pg_dsn: str) -> None:
    res = await invoke(pools, "list", "--dsn", pg_dsn)
    assert res.exit_code == 1 and "roost db migrate" in res.output


async def test_controller_settings_flag_beats_env_beats_file(tmp_path: Path) -> None:
    cfg = tmp_path / "controller.toml"
    cfg.write_text('[controller]\ninterval = 5\nscale_up_window = 11\n'
                   'memory_target_percent = 70\nstatic_config = "pools.toml"\n')
    env = {"ROOST_CONTROLLER_SCALE_UP_WINDOW": "22", "ROOST_CONTROLLER_SHADOW": "true"}
    res = await invoke(controller, "--config", str(cfg), "--memory-target-percent", "75",
                       "--print-config", env=env)
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert got["interval"] == 5  # file
    assert got["scale_up_window"] == 22  # env beats file
    assert got["memory_target_percent"] == 75  # flag beats file
    assert got["shadow"] is True
    assert got["static_config"] == str(tmp_path / "pools.toml")  # relative to the file


async def test_controller_rejects_bad_settings(tmp_path: Path) -> None:
    res = await invoke(controller, "--memory-target-percent", "95", "--memory-hard-percent",
                       "90", "--print-config")
    assert res.exit_code == 2 and "memory target" in res.output
    cfg = tmp_path / "c.toml"
    cfg.write_text("[controller]\nintervall = 5\n")
    res = await invoke(controller, "--config", str(cfg), "--print-config")
    assert res.exit_code == 2 and "intervall" in res.output


async def test_pools_refuse_bounds_that_could_never_scale(pg_dsn: str) -> None:
    assert (await invoke(db, "migrate", "--dsn", pg_dsn)).exit_code == 0
    env = {"ROOST_DSN": pg_dsn}
    base = ["--max", "8", "--target", "4", "--cpu-milli", "500", "--memory-mib", "1024",
            "--db-pool-size", "3", "--orchestrator", "static"]
    for flag, value, words in [
        ("--growth-replicas", "0", "growth_replicas must be >= 1"),
        ("--disruption-replicas", "0", "disruption_replicas must be >= 1"),
        ("--disruption-replicas", "-3", "disruption_replicas must be >= 1"),
        ("--growth-percent", "-5", "growth_percent must be >= 0"),
    ]:
        res = await invoke(pools, "create", "bad", *base, flag, value, env=env)
        assert res.exit_code == 1 and words in res.output, res.output
    made = await invoke(pools, "create", "ok", *base, "--growth-replicas", "8",
                        "--disruption-percent", "50", "--json", env=env)
    assert made.exit_code == 0, made.output
    [row] = json.loads(made.output)
    assert (row["growth_replicas"], row["disruption_percent"]) == (8, 50)
    upd = await invoke(pools, "update", "ok", "--disruption-replicas", "0", env=env)
    assert upd.exit_code == 1 and "disruption_replicas must be >= 1" in upd.output
    listed = await invoke(pools, "list", "--json", env=env)
    assert json.loads(listed.output)[0]["disruption_replicas"] == 2  # unchanged

    # a pool's own scale-down window: set, refused out of HPA's range, back to the
    # controller's with 'default'; a word that is not seconds is a usage error
    assert json.loads(listed.output)[0]["scale_down_window"] is None
    own = await invoke(pools, "update", "ok", "--scale-down-window", "300", "--json", env=env)
    assert own.exit_code == 0 and json.loads(own.output)[0]["scale_down_window"] == 300
    shown = await invoke(pools, "list", env={**env, "COLUMNS": "200"})
    assert "300s" in shown.output, shown.output
    # 80 columns cannot hold the table: a block per pool, every value whole
    narrow = await invoke(pools, "list", env={**env, "COLUMNS": "80"})
    lines = narrow.output.splitlines()
    assert "…" not in narrow.output and max(len(x.rstrip()) for x in lines) <= 80
    assert re.search(r"^scale-down window +300s$", narrow.output, re.M), narrow.output
    assert re.search(r"^growth/period +max\(8, 100%\)$", narrow.output, re.M), narrow.output
    # the periods are the controller's settings: named once, with their defaults
    footnote = "period: the controller's growth_period, disruption_period (default 15 s, 60 s)"
    assert narrow.output.rstrip().endswith(footnote), narrow.output
    assert shown.output.rstrip().endswith(footnote), shown.output
    for bad in ("3601", "-1"):
        res = await invoke(pools, "update", "ok", "--scale-down-window", bad, env=env)
        assert res.exit_code == 1, res.output
        assert "scale_down_window must be whole seconds within 0..3600" in res.output
    res = await invoke(pools, "update", "ok", "--scale-down-window", "5m", env=env)
    assert res.exit_code == 2 and "not whole seconds or 'default'" in res.output
    listed = await invoke(pools, "list", "--json", env=env)
    assert json.loads(listed.output)[0]["scale_down_window"] == 300  # nothing lost
    back = await invoke(pools, "update", "ok", "--scale-down-window", "default", "--json",
                        env=env)
    assert back.exit_code == 0 and json.loads(back.output)[0]["scale_down_window"] is None
    made = await invoke(pools, "create", "quick", *base, "--scale-down-window", "0", "--json",
                        env=env)
    assert made.exit_code == 0 and json.loads(made.output)[0]["scale_down_window"] == 0
    # 'default' means the controller's window for that flag only: elsewhere it is text
    named = await invoke(pools, "update", "quick", "--ref", "default", "--revision", "default",
                         "--json", env=env)
    assert named.exit_code == 0, named.output
    [row] = json.loads(named.output)
    assert (row["orchestrator_ref"], row["expected_revision"]) == ("default", "default")
    assert row["scale_down_window"] == 0


async def test_pools_refuse_integers_their_columns_cannot_hold(pg_dsn: str) -> None:
    """Postgres ``integer`` columns stop at 2^31 - 1: past it is refused with the field's
    range, not a traceback out of asyncpg, and an update changes nothing."""
    assert (await invoke(db, "migrate", "--dsn", pg_dsn)).exit_code == 0
    env = {"ROOST_DSN": pg_dsn}
    base = {"--max": "8", "--target": "4", "--cpu-milli": "500", "--memory-mib": "1024",
            "--db-pool-size": "3", "--orchestrator": "static"}
    big = "2147483648"
    for flag, words in [
        ("--max", "max_replicas must be within 0..2147483647 (got 2147483648)"),
        ("--target", "target_per_replica must be within 1..2147483647 (got 2147483648)"),
        ("--cpu-milli", "worker_cpu_milli must be within 1..2147483647"),
        ("--memory-mib", "worker_mem_mib must be within 1..2147483647"),
        ("--db-pool-size", "worker_db_pool_size must be within 0..2147483647"),
        ("--growth-replicas", "growth_replicas must be within 1..2147483647"),
        ("--growth-percent", "growth_percent must be within 0..2147483647"),
        ("--disruption-replicas", "disruption_replicas must be within 1..2147483647"),
        ("--disruption-percent", "disruption_percent must be within 0..100"),
    ]:
        args = [a for k, v in {**base, flag: big}.items() for a in (k, v)]
        res = await invoke(pools, "create", "huge", *args, env=env)
        assert res.exit_code == 1 and f"Error: {words}" in res.output, (flag, res.output)
        assert "Traceback" not in res.output
    made = await invoke(pools, "create", "ok", *[a for kv in base.items() for a in kv],
                        "--max", "2147483647", env=env)
    assert made.exit_code == 0, made.output
    for flag in ("--max", "--growth-replicas", "--disruption-replicas", "--target",
                 "--cpu-milli"):
        res = await invoke(pools, "update", "ok", flag, "99999999999999999999", env=env)
        assert res.exit_code == 1 and "must be within" in res.output, (flag, res.output)
    listed = await invoke(pools, "list", "--json", env=env)
    [row] = json.loads(listed.output)
    assert (row["pool_id"], row["max_replicas"], row["growth_replicas"],
            row["target_per_replica"]) == ("ok", 2147483647, 4, 4)


async def test_pools_say_the_rule_a_pool_id_breaks(pg_dsn: str) -> None:
    assert (await invoke(db, "migrate", "--dsn", pg_dsn)).exit_code == 0
    res = await invoke(pools, "create", "Bad_Name", "--max", "8", "--target", "4",
                       "--cpu-milli", "500", "--memory-mib", "1024", "--db-pool-size", "3",
                       "--orchestrator", "static", "--dsn", pg_dsn)
    assert res.exit_code == 1, res.output
    assert ("Error: pool id 'Bad_Name' must be 1 to 63 lower-case letters, digits and '-', "
            "starting and ending with a letter or digit") in res.output


async def test_a_bad_dsn_is_an_error_that_never_shows_the_password() -> None:
    for dsn, words in [
        ("not a dsn", 'scheme is expected to be either "postgresql" or "postgres"'),
        ("postgresql://x@127.0.0.1:99999/x", "port must be 0-65535"),
        ("postgresql://u:s3cret@127.0.0.1:99999/x", "port must be 0-65535"),
        ("postgresql://u:s3cret@127.0.0.1:s3cret/x", "invalid literal for int()"),
        ("postgresql://u@127.0.0.1:99999/x?password=s3cret", "port must be 0-65535"),
        ("postgresql://u:s3cret@127.0.0.1/x?sslmode=sometimes", "sslmode"),
    ]:
        for cmd, args in [(pools, ["list"]), (pools, ["delete", "p"]), (db, ["migrate"])]:
            res = await invoke(cmd, *args, "--dsn", dsn)
            assert res.exit_code == 1, (dsn, args, res.output, res.exception)
            assert res.output.startswith("Error: --dsn is not a usable Postgres DSN: "), (
                dsn, args, res.output)
            assert words in res.output and "s3cret" not in res.output, (dsn, res.output)
