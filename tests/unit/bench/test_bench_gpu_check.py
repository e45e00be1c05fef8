"""The prepared GPU check on a machine without one: a clear message and a non-zero exit, by either command;
its reporting and the service config it starts, without a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from bench import gpu_check
from bench.gpu_check_service import _gpu_config

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the exit where there is no CUDA device")
@pytest.mark.parametrize("command", [["bench/gpu_check.py"], ["-m", "bench.gpu_check"]])
def test_without_a_gpu_it_says_so_and_fails(command: list[str]) -> None:
    done = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert gpu_check.NO_GPU in done.stderr


def test_each_check_reports_pass_or_fail(capsys: pytest.CaptureFixture[str]) -> None:
    def broken() -> tuple[bool, dict]:
        raise RuntimeError("boom")

    assert gpu_check.run_checks({"good": lambda: (True, {"x": 1})})
    assert not gpu_check.run_checks({"good": lambda: (True, {}), "bad": lambda: (False, {}), "err": broken})
    lines = [line for line in capsys.readouterr().out.splitlines() if line[:4] in ("PASS", "FAIL")]
    assert [line.split()[:2] for line in lines] == [
        ["PASS", "good"],
        ["PASS", "good"],
        ["FAIL", "bad"],
        ["FAIL", "err"],
    ]
    assert "x=1" in lines[0] and "RuntimeError: boom" in lines[3]


def test_the_service_it_starts_puts_inference_on_the_gpu(tmp_path: Path) -> None:
    config = yaml.safe_load(_gpu_config(tmp_path).read_text())
    models = [a for a in config["applications"] if a["import_path"] == "deployments.app:build_model"]
    assert models
    for app in models:
        (inference,) = [d for d in app["deployments"] if d["name"] == "Inference"]
        assert inference["ray_actor_options"]["num_gpus"] == 1
