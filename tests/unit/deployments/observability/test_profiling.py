"""The batch profiler: profiles the next N batches once, writes a Chrome trace and a table, stops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from deployments.observability.profiling import BatchProfiler


def _matmul() -> None:
    a = torch.randn(32, 32)
    torch.mm(a, a)


def test_enabled_writes_trace_and_table_after_n_batches_then_stops(tmp_path: Path):
    out = tmp_path / "profile"
    profiler = BatchProfiler(enabled=True, out_dir=str(out), batches=3)
    for _ in range(2):
        with profiler.batch():
            _matmul()
    assert profiler.enabled and not out.exists()

    with profiler.batch():
        _matmul()
    assert not profiler.enabled
    trace_path, table_path = profiler.written
    assert sorted(out.iterdir()) == sorted([trace_path, table_path])
    events = json.loads(trace_path.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert "aten::mm" in names
    assert {"batch 0", "batch 1", "batch 2"} <= names
    assert "aten::mm" in table_path.read_text()

    # Done: later batches are no-ops and write nothing more.
    with profiler.batch():
        _matmul()
    assert sorted(out.iterdir()) == sorted([trace_path, table_path])


def test_disabled_writes_nothing_and_hands_back_one_shared_noop(tmp_path: Path):
    out = tmp_path / "profile"
    profiler = BatchProfiler(enabled=False, out_dir=str(out), batches=1)
    contexts = set()
    for _ in range(5):
        ctx = profiler.batch()
        contexts.add(id(ctx))
        with ctx:
            _matmul()
    assert len(contexts) == 1  # no per-batch object, let alone a profiler
    assert not out.exists() and profiler.written == ()


def test_a_failing_batch_counts_and_the_error_propagates(tmp_path: Path):
    profiler = BatchProfiler(enabled=True, out_dir=str(tmp_path), batches=1)
    with pytest.raises(RuntimeError, match="batch failed"), profiler.batch():
        _matmul()
        raise RuntimeError("batch failed")
    assert not profiler.enabled and all(p.exists() for p in profiler.written)
    assert len(profiler.written) == 2


def test_batches_must_be_positive(tmp_path: Path):
    with pytest.raises(ValueError):
        BatchProfiler(enabled=True, out_dir=str(tmp_path), batches=0)
