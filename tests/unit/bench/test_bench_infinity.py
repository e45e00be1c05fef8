"""Infinity's configurations: the command lines the benchmark starts it with (no Infinity needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import infinity, systems
from bench.cli import SYSTEM_CHOICES

ENV = infinity.InfinityEnv(Path("/venv"))


def _flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_each_configuration_is_a_distinct_command() -> None:
    model = Path("/m")
    cmds = {c.label: infinity.command(ENV, c.engine, model, 7000, "m", c.dtype) for c in infinity.CONFIGS}
    assert set(cmds) == {"infinity-torch", "infinity-torch-bf16", "infinity-onnx"}
    torch_cmd, torch_cwd = cmds["infinity-torch"]
    bf16_cmd, _ = cmds["infinity-torch-bf16"]
    onnx_cmd, onnx_cwd = cmds["infinity-onnx"]
    assert _flag(torch_cmd, "--engine") == _flag(bf16_cmd, "--engine") == "torch"
    assert _flag(torch_cmd, "--dtype") is None and _flag(bf16_cmd, "--dtype") == "bfloat16"
    # 0.0.78 finds a local ONNX file only from inside the model directory (module docstring).
    assert _flag(onnx_cmd, "--engine") == "optimum" and _flag(onnx_cmd, "--model-id") == "."
    assert onnx_cwd == torch_cwd == model
    assert all(
        _flag(c, "--pooling-method") == "mean" and _flag(c, "--port") == "7000" for c, _ in cmds.values()
    )
    # Like for like: the service writes an access line per request by default, so the peer keeps its own.
    assert all(_flag(c, "--log-level") == "info" for c, _ in cmds.values())


def test_servers_and_cli_choices_follow_the_configurations(tmp_path: Path) -> None:
    for config in infinity.CONFIGS:
        server = systems.infinity_server(ENV, config, tmp_path, tmp_path)
        assert server.name == config.label and config.flags in server.description
        assert "--log-level info" in server.description
        assert config.label in SYSTEM_CHOICES
    with pytest.raises(ValueError, match="unknown Infinity engine"):
        infinity.command(ENV, "tensorrt", tmp_path, 7000, "m")
