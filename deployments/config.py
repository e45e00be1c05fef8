"""Typed, frozen configuration built from ``serve_config.yaml``.

``AppArgs`` is the application's ``args`` block (fixed for the life of a deployment).
``BatchingConfig`` and ``SerializerConfig`` are ``user_config`` blocks: Ray Serve hands them to
``reconfigure()``, so changing them in the config file takes effect without restarting replicas.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelConfig(_Frozen):
    """Which model to serve. Name, version and task must agree with the model's manifest."""

    repository: str = Field(
        default="models",
        description="Model repository root: <repository>/<name>/<version>/manifest.json. "
        "A relative path is taken from the working directory, else from the project root.",
    )
    name: str = "all-MiniLM-L6-v2"
    version: str = "1"
    task: Literal["embed", "classify"] = "embed"
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="auto: CUDA when the replica has a GPU, CPU otherwise."
    )

    def manifest_path(self) -> Path:
        return resolve_path(self.repository) / self.name / self.version / "manifest.json"


class LimitsConfig(_Frozen):
    max_inputs_per_request: int = Field(default=256, ge=1)
    max_body_bytes: int = Field(default=2 * 1024 * 1024, ge=1024)


class RuntimeConfig(_Frozen):
    verify_checksums: bool = Field(
        default=True, description="Check weight files against the manifest's sha256 sums at start."
    )
    torch_threads: int | None = Field(
        default=None, ge=1, description="Intra-op threads per inference replica; null: Ray's default."
    )


class AppArgs(_Frozen):
    """The ``args`` of the application in ``serve_config.yaml``."""

    model: ModelConfig = ModelConfig()
    limits: LimitsConfig = LimitsConfig()
    runtime: RuntimeConfig = RuntimeConfig()


class BatchingConfig(_Frozen):
    """Inference ``user_config``: the dynamic-batching knobs, tunable at run time."""

    max_batch_size: int = Field(default=32, ge=1, le=4096)
    # A maximum wait for the first request of a batch: a full batch leaves at once.
    batch_wait_timeout_s: float = Field(default=0.005, ge=0.0, le=1.0)


class SerializerConfig(_Frozen):
    """Serializer ``user_config``."""

    float_decimals: int | None = Field(
        default=6, ge=0, le=9, description="Round JSON floats to this many decimals; null keeps all."
    )


def resolve_path(path: str) -> Path:
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p.resolve()
    return (PROJECT_ROOT / p).resolve()
