"""A lone pass on both cores (deployments/runtime/lone_pass.py): only where it was measured, only with an
export that checks out against the served model, and never with answers that differ from the copy's."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from deployments.repository.manifest import ManifestError, ResolvedModel
from deployments.runtime.lone_pass import (
    LonePass,
    Overlaps,
    Placement,
    check_agrees,
    load_export,
    placement,
)
from deployments.runtime.runner_base import BatchRunner
from deployments.runtime.torch_graph import TraceMismatchError


def test_only_two_allowed_cpus_place_a_lone_pass() -> None:
    assert placement({5, 3}) == Placement(caller_cpu=3, worker_cpu=5)
    assert placement({0}) is None
    assert placement({0, 1, 2, 3}) is None


def _with_export_manifest(served: ResolvedModel, tmp_path: Path, **changes: object) -> ResolvedModel:
    """The served model beside a copy of its export whose manifest has ``changes``."""
    version = tmp_path / "1"
    shutil.copytree(
        served.manifest_path.parent / "onnx", version / "onnx", ignore=shutil.ignore_patterns("*.onnx")
    )
    (version / "onnx" / "model.onnx").symlink_to(served.manifest_path.parent / "onnx" / "model.onnx")
    manifest = json.loads((version / "onnx" / "manifest.json").read_text())
    manifest.update(changes)
    (version / "onnx" / "manifest.json").write_text(json.dumps(manifest))
    shutil.copy(served.manifest_path, version / "manifest.json")
    return ResolvedModel(served.manifest, version / "manifest.json", served.weights_dir, served.precision)


def test_the_export_is_checked_against_the_served_model(served: ResolvedModel, tmp_path: Path) -> None:
    export = load_export(served, hash_files=True)
    assert export.manifest.format == "onnx" and export.onnx_file.is_file()
    with pytest.raises(ManifestError) as named:
        load_export(_with_export_manifest(served, tmp_path / "a", name="another-model"), hash_files=False)
    assert named.value.field == "name"
    with pytest.raises(ManifestError) as fp16:
        load_export(_with_export_manifest(served, tmp_path / "b", precision="fp16"), hash_files=False)
    assert fp16.value.field == "format"
    with pytest.raises(FileNotFoundError):
        load_export(ResolvedModel(served.manifest, tmp_path / "none.json", served.weights_dir), False)


def _two_cpus() -> set[int]:
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("pinning a lone pass's two threads needs two CPUs")
    return set(allowed[:2])


def test_a_lone_pass_is_built_only_where_measured_and_checked(
    served: ResolvedModel, copy: BatchRunner, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    two = _two_cpus()
    lone = LonePass.for_copy(served, copy, hash_files=True, allowed=two)
    assert lone is not None and lone.where == placement(two)
    assert lone.executor.submit(os.sched_getaffinity, 0).result() == {min(two)}
    assert LonePass.for_copy(served, copy, hash_files=True, allowed={*two, max(two) + 1}) is None
    caplog.set_level(logging.INFO, "textserve.runner")
    renamed = _with_export_manifest(served, tmp_path, name="another-model")
    assert LonePass.for_copy(renamed, copy, hash_files=False, allowed=two) is None
    assert "manifest field 'name'" in caplog.text


class _Shifted(BatchRunner):
    """The copy's outputs with one column moved: a graph that does not reproduce the model."""

    backend = "shifted"

    def __init__(self, of: BatchRunner) -> None:
        super().__init__(of.model_info, of.pad_id)
        self._of = of

    @property
    def device_name(self) -> str:
        return "cpu"

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        values = self._of._forward(ids, mask).copy()
        values[:, 0] += 0.5
        return values


def test_outputs_that_differ_from_the_copys_are_refused(served: ResolvedModel, copy: BatchRunner) -> None:
    lone = LonePass.for_copy(served, copy, hash_files=False, allowed=_two_cpus())
    assert lone is not None
    check_agrees(copy, lone.runner, vocab=1000)  # the real export agrees
    with pytest.raises(TraceMismatchError, match="cosine"):
        check_agrees(copy, _Shifted(copy), vocab=1000)


def test_a_lone_pass_stops_while_recent_groups_overlap_and_comes_back() -> None:
    rule = Overlaps(max_overlap=0.25)
    assert all(rule.takes(running=0, beside=0) for _ in range(50))  # one client: never overlaps
    assert rule.share == 0.0
    assert not rule.takes(running=1, beside=1)  # never beside a group on the one-thread copy
    assert rule.takes(running=1, beside=0)  # but behind lone passes, while few overlap
    busy = 2
    while rule.share <= 0.25:  # a burst: arrivals keep finding the copy busy
        assert not rule.takes(running=1, beside=1)
        busy += 1
    assert busy == math.ceil(math.log(0.75) / math.log(1 - rule.weight))  # share = 1 - (1 - w) ** busy
    for _ in range(16):  # the burst goes on: groups run beside each other on one thread each
        assert not rule.takes(running=1, beside=0)
    peak = rule.share
    idle = 1
    while not rule.takes(running=0, beside=0):  # idle arrivals, yet the last ones overlapped
        idle += 1
    # back once the burst has faded from the average: share = peak * (1 - w) ** idle
    assert idle == math.ceil(math.log(0.25 / peak) / math.log(1 - rule.weight)) > 1


def test_with_no_bound_every_group_runs_on_the_lone_pass() -> None:
    rule = Overlaps(max_overlap=1.0)
    for _ in range(100):
        assert rule.takes(running=2, beside=0)
    assert rule.share > 0.99
    assert rule.takes(running=0, beside=0)
    assert not rule.takes(running=1, beside=1)
