"""bench/idle_pass.py: a lone pass after an idle gap, by threads and backend."""

from __future__ import annotations

import argparse
import os

import pytest

from bench.idle_pass import Measured, main, parse_pauses, render, summary_ms
from deployments.repository.manifest import ResolvedModel
from deployments.runtime.lone_pass import placement


def test_pauses_are_milliseconds_and_must_be_some() -> None:
    assert parse_pauses("5,20, 100") == [0.005, 0.02, 0.1]
    for bad in ("", "5,-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_pauses(bad)


def test_summary_and_table_give_each_variant_its_median_and_mean() -> None:
    assert summary_ms([0.010, 0.012, 0.020]) == pytest.approx((12.0, 14.0))
    seconds = {0.1: {"torch bf16, 1 thread": [0.010, 0.012, 0.020], "onnx, 2 threads": [0.004]}}
    cpu = {(0.1, "torch bf16, 1 thread"): 0.015, (0.1, "onnx, 2 threads"): 0.0605}
    lines = render(Measured(seconds, cpu)).splitlines()
    assert lines[2] == "| 100 ms | torch bf16, 1 thread | 12.00 | 14.00 | 15.0 |"
    assert lines[3] == "| 100 ms | onnx, 2 threads | 4.00 | 4.00 | 60.5 |"


def test_a_short_run_measures_every_variant_at_every_pause(
    default_model: ResolvedModel, capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir = default_model.manifest_path.parent
    assert main(["--model-dir", str(model_dir), "--texts", "2", "--pauses", "0,1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line[:3].strip("| ").isdigit()]
    labels = {row.split(" | ")[1] for row in rows}
    assert {"torch bf16, 1 thread (the pipeline's copy)", "torch bf16, 2 threads"} <= labels
    assert {row.split(" | ")[0] for row in rows} == {"| 0 ms", "| 1 ms"}
    for row in rows:  # every cell a positive time
        p50, mean, cpu = (float(cell) for cell in row.strip(" |").split(" | ")[2:5])
        assert p50 > 0 and mean > 0 and cpu > 0


def test_an_onnx_export_adds_its_thread_and_spinning_variants(
    onnx_model: ResolvedModel, capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir = onnx_model.onnx_file.parent.parent  # the version directory: <it>/onnx/model.onnx
    assert main(["--model-dir", str(model_dir), "--texts", "1", "--pauses", "0"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 0 ms")]
    labels = {row.split(" | ")[1] for row in rows}
    assert {
        "onnx fp32, 1 thread",
        "onnx fp32, 2 threads",
        "onnx fp32, 2 threads, spinning",
        "onnx fp32, 2 threads, spinning within a run only",
    } <= labels
    lone = [label for label in labels if label.startswith("onnx fp32, the lone pass")]
    # Only where the service would use one: exactly two CPUs allowed (deployments/runtime/lone_pass.py).
    assert len(lone) == (placement(os.sched_getaffinity(0)) is not None)


def test_by_length_each_text_length_gets_a_column_and_torch_gets_its_pinned_lone_pass(
    onnx_model: ResolvedModel, capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir = onnx_model.onnx_file.parent.parent
    argv = ["--model-dir", str(model_dir), "--texts", "2", "--pauses", "0", "--lengths", "4,30"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].strip(" |").split(" | ")
    assert header[0] == "pause" and header[-1] == "CPU ms per pass"
    lengths = [int(cell.split()[0]) for cell in header[2:-1]]
    assert len(lengths) == 2 and lengths[0] < lengths[1]  # the corpus texts nearest 4 and 30 tokens
    rows = [line.strip(" |").split(" | ") for line in lines[2:]]
    assert all(len(row) == len(header) and float(row[2]) > 0 and float(row[3]) > 0 for row in rows)
    on_torch = [row[1] for row in rows if "the lone pass on torch" in row[1]]
    assert len(on_torch) == (placement(os.sched_getaffinity(0)) is not None)
