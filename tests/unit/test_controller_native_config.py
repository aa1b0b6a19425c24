"""`--native-config` serves the native adapter; a file that doesn't load is a setting
error, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from roost.controller.clock import SystemClock
from roost.controller.config import ControllerConfig, SettingError
from roost.controller.service import build_orchestrators


def test_native_config_serves_the_native_adapter(tmp_path: Path) -> None:
    f = tmp_path / "native.toml"
    f.write_text('endpoint = "http://127.0.0.1:8773"\nregion = "roost-1"\n'
                 'access_key_id = "AKIATEST"\nsecret_access_key = "s3cret"\n')
    out = build_orchestrators(ControllerConfig(native_config=str(f)), SystemClock())
    assert set(out) == {"native"} and out["native"].name == "native"


@pytest.mark.parametrize("text", ["endpoint = ", 'region = "roost-1"'])
def test_a_bad_native_config_is_a_setting_error(tmp_path: Path, text: str) -> None:
    f = tmp_path / "native.toml"
    f.write_text(text)
    with pytest.raises(SettingError, match="native_config"):
        build_orchestrators(ControllerConfig(native_config=str(f)), SystemClock())
