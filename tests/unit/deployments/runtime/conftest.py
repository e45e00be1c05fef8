"""Fixtures shared by this folder's tests: the generation engine's tiny models (test_generate_engine.py,
test_generate_limits.py), and a served model with an ONNX export and its one-thread copy (test_lone_pass.py,
test_lone_torch.py)."""

from pathlib import Path

import pytest

from deployments.config import ModelConfig
from deployments.repository.manifest import ResolvedModel
from deployments.repository.resolve import resolve_model
from deployments.runtime.backends import ready_runner
from deployments.runtime.runner_base import BatchRunner
from tests.unit.deployments.runtime.generate_support import gpt2, llama, one_thread


@pytest.fixture(scope="module")
def served(onnx_repository: Path) -> ResolvedModel:
    return resolve_model(ModelConfig(repository=str(onnx_repository)), hash_files=False)


@pytest.fixture(scope="module")
def copy(served: ResolvedModel) -> BatchRunner:
    """The pipeline's copy as the service builds it: the traced graph, one thread, two passes at once."""
    return ready_runner(served, "cpu", 4, threads=1, parallel_passes=2, graph="trace")


__all__ = ["copy", "gpt2", "llama", "one_thread", "served"]
