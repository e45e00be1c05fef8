"""The preflight refuses a config whose HAProxy launcher Ray would not find from here: Ray would then start
no HAProxy and serve no HTTP at all."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deployments.tools.check import main, missing_haproxy_binary

ROOT = Path(__file__).resolve().parents[4]
SHIPPED = ROOT / "serve_config.yaml"
LAUNCHER = "deployments/ingress/haproxy/haproxy"


def _config() -> dict:
    return yaml.safe_load(SHIPPED.read_text())


def test_the_shipped_launcher_is_found_from_the_project_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert (
        _config()["controller_options"]["runtime_env"]["env_vars"]["RAY_SERVE_HAPROXY_BINARY_PATH"]
        == LAUNCHER
    )
    assert missing_haproxy_binary(_config()) is None


def test_from_elsewhere_the_preflight_names_it_and_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert missing_haproxy_binary(_config()) == LAUNCHER
    assert main([str(SHIPPED)]) == 1
    assert f"RAY_SERVE_HAPROXY_BINARY_PATH={LAUNCHER}" in capsys.readouterr().err


def test_an_absolute_path_or_no_haproxy_needs_no_particular_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    config = _config()
    env = config["controller_options"]["runtime_env"]["env_vars"]
    env["RAY_SERVE_HAPROXY_BINARY_PATH"] = str(ROOT / LAUNCHER)
    assert missing_haproxy_binary(config) is None
    del config["controller_options"]  # Serve's Python proxy: no HAProxy to start
    assert missing_haproxy_binary(config) is None
