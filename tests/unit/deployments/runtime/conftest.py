"""Fixtures shared by this folder's tests: the generation engine's tiny models (test_generate_engine.py,
test_generate_limits.py), and a served model with an ONNX export."""

from pathlib import Path

import pytest

from deployments.config import ModelConfig
from deployments.repository.manifest import ResolvedModel
from deployments.repository.resolve import resolve_model
from tests.unit.deployments.runtime.generate_support import gpt2, llama, one_thread


@pytest.fixture(scope="module")
def served(onnx_repository: Path) -> ResolvedModel:
    return resolve_model(ModelConfig(repository=str(onnx_repository)), hash_files=False)


__all__ = ["gpt2", "llama", "one_thread", "served"]
