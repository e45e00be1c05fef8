"""The CUDA allocator settings every model replica applies (runtime/cuda_memory.py), and the generate
model's replica applying them: the allocator's variable before CUDA initializes, the cache released only
above the configured share (a fake CUDA here)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import torch

from deployments.config import GenerationConfig, ModelConfig, ObservabilityConfig, RuntimeConfig
from deployments.pipeline import generator
from deployments.repository.resolve import resolve_model
from deployments.runtime import cuda_memory
from deployments.runtime.cuda_memory import ENV, CacheRelease, apply_alloc_conf

GIB = 1 << 30


def test_the_variable_is_set_before_cuda_initializes() -> None:
    # A fresh interpreter: this one's torch may have touched CUDA already (never on a CPU-only machine).
    code = (
        "import os, torch\n"
        "from deployments.runtime.cuda_memory import ENV, apply_alloc_conf\n"
        "assert apply_alloc_conf('expandable_segments:True')\n"
        "assert not torch.cuda.is_initialized()\n"
        "print(os.environ[ENV])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != ENV}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "expandable_segments:True"


def test_the_environment_wins_and_none_sets_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "max_split_size_mb:64")
    assert not apply_alloc_conf("expandable_segments:True")
    assert os.environ[ENV] == "max_split_size_mb:64"
    monkeypatch.delenv(ENV)
    assert not apply_alloc_conf(None) and ENV not in os.environ
    assert apply_alloc_conf("expandable_segments:True") and os.environ[ENV] == "expandable_segments:True"


class FakeCuda:
    """torch.cuda's calls that CacheRelease makes, on a GPU of 10 GiB."""

    def __init__(self, reserved: int) -> None:
        self.reserved = reserved
        self.emptied = 0

    def get_device_properties(self, device: torch.device) -> Any:
        return type("Props", (), {"total_memory": 10 * GIB})()

    def memory_reserved(self, device: torch.device) -> int:
        return self.reserved

    def empty_cache(self) -> None:
        self.emptied += 1
        self.reserved = GIB


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    fake = FakeCuda(reserved=5 * GIB)
    for name in ("get_device_properties", "memory_reserved", "empty_cache"):
        monkeypatch.setattr(cuda_memory.torch.cuda, name, getattr(fake, name))
    return fake


def test_the_cache_is_released_only_above_the_share(fake_cuda: FakeCuda) -> None:
    release = CacheRelease("cuda", 0.9)
    assert not release() and fake_cuda.emptied == 0  # 5 of 10 GiB
    fake_cuda.reserved = 9 * GIB  # at the share: kept
    assert not release() and fake_cuda.emptied == 0
    fake_cuda.reserved = 9 * GIB + 1
    assert release() and fake_cuda.emptied == 1 and release.releases == 1
    assert not release()  # back at 1 GiB
    lower = CacheRelease("cuda", 0.4)
    fake_cuda.reserved = 5 * GIB
    assert lower() and fake_cuda.emptied == 2


def test_nothing_happens_on_a_cpu(fake_cuda: FakeCuda) -> None:
    fake_cuda.reserved = 10 * GIB
    assert not CacheRelease(torch.device("cpu"), 0.1)()
    assert fake_cuda.emptied == 0
    with pytest.raises(ValueError, match="cuda_cache_release_fraction"):
        CacheRelease("cuda", 0.0)


class _Loaded(Exception):
    pass


def test_the_generate_replica_applies_both(monkeypatch: pytest.MonkeyPatch, fake_cuda: FakeCuda) -> None:
    monkeypatch.delenv(ENV, raising=False)
    seen: dict[str, Any] = {}

    def load(*args: Any, **kwargs: Any) -> Any:
        seen["env"] = os.environ.get(ENV)  # what CUDA would read when the model moves to it
        raise _Loaded

    monkeypatch.setattr(generator, "load_causal_lm", load)
    monkeypatch.setattr(generator, "setup_replica", lambda observability: None)
    model = resolve_model(ModelConfig(name="demo-gpt2-lm", task="generate"), hash_files=False)
    runtime = RuntimeConfig(cuda_alloc_conf="expandable_segments:True", cuda_cache_release_fraction=0.5)
    cls = generator.GeneratorDeployment.func_or_class
    with pytest.raises(_Loaded):
        cls(model, "cpu", GenerationConfig(), ObservabilityConfig(), runtime)
    assert seen["env"] == "expandable_segments:True"

    # After each decode step (the engine's on_step): the replica's CacheRelease for the model's device.
    replica = cls.__new__(cls)
    replica._metrics = type("M", (), {"batch_rows": type("H", (), {"observe": lambda self, v: None})()})()
    replica._release = CacheRelease("cuda", runtime.cuda_cache_release_fraction)
    fake_cuda.reserved = 4 * GIB
    replica._step(8, 0.01)
    assert fake_cuda.emptied == 0
    fake_cuda.reserved = 6 * GIB
    replica._step(8, 0.01)
    assert fake_cuda.emptied == 1
