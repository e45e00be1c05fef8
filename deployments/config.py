"""Typed, frozen configuration built from ``serve_config.yaml``.

``AppArgs`` is the application's ``args`` block (fixed for the life of a deployment).
``BatchingConfig`` and ``SerializerConfig`` are ``user_config`` blocks: Ray Serve hands them to
``reconfigure()``, so changing them in the config file takes effect without restarting replicas.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

PROJECT_ROOT = Path(__file__).resolve().parent.parent
ONNX_SUBDIR = "onnx"  # where export_onnx puts a version's ONNX Runtime model by default


def onnx_subdir(precision: str) -> str:
    """The export of a version in ``precision``: ``onnx/`` (fp32) or ``onnx-fp16/``."""
    return ONNX_SUBDIR if precision == "fp32" else f"{ONNX_SUBDIR}-{precision}"


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
    backend: Literal["torch", "onnx"] = Field(
        default="torch",
        description="torch: <name>/<version>/manifest.json (Hugging Face weights); onnx: the export in "
        "<name>/<version>/onnx/manifest.json (python -m deployments.runtime.export_onnx).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="auto: CUDA when the replica has a GPU, CPU otherwise."
    )
    precision: Literal["fp32", "fp16", "bf16"] = Field(
        default="fp32",
        description="fp16/bf16 halve the model's memory and use a GPU's tensor cores (on a CPU fp16 is "
        "slow; bf16 needs bf16 instructions). torch: weights cast at load. onnx: fp32 or fp16, served "
        "from the export in <version>/onnx-fp16/ "
        "(python -m deployments.runtime.export_onnx --precision fp16).",
    )

    @model_validator(mode="after")
    def _onnx_precisions(self) -> ModelConfig:
        if self.backend == "onnx" and self.precision == "bf16":
            raise ValueError("precision bf16 needs backend torch (ONNX exports are fp32 or fp16)")
        return self

    def manifest_path(self) -> Path:
        version_dir = resolve_path(self.repository) / self.name / self.version
        if self.backend == "onnx":
            version_dir = version_dir / onnx_subdir(self.precision)
        return version_dir / "manifest.json"


class LimitsConfig(_Frozen):
    max_inputs_per_request: int = Field(default=256, ge=1)
    max_body_bytes: int = Field(default=2 * 1024 * 1024, ge=1024)


class ProfilerConfig(_Frozen):
    """torch.profiler around the next ``batches`` inference batches (then off); see docs/profiling.md."""

    enabled: bool = False
    out_dir: str = "/tmp/textserve-profile"
    batches: int = Field(default=20, ge=1)


class RuntimeConfig(_Frozen):
    cuda_alloc_conf: str | None = Field(
        default="expandable_segments:True",
        description="PYTORCH_CUDA_ALLOC_CONF for inference replicas, set before CUDA initializes.",
    )
    cuda_cache_release_fraction: float = Field(
        default=0.9, gt=0.0, le=1.0, description="Release the allocator cache only above this reserved share."
    )
    verify_checksums: bool = Field(
        default=True, description="Check weight files against the manifest's sha256 sums at start."
    )
    intra_op_threads: int | None = Field(
        default=None,
        ge=1,
        description="Intra-op threads per forward pass (torch or ONNX Runtime); null: the backend's default.",
    )
    parallel_passes: int = Field(
        default=1,
        ge=1,
        le=16,
        description="Forward passes of one batch run at once, each on its own thread (the batch is cut "
        "into at least this many length-sorted passes). CPU: with intra_op_threads 1, one per core.",
    )
    torch_graph: Literal["eager", "trace"] = Field(
        default="eager",
        description="torch backend: trace runs the model as one TorchScript graph (no Python between "
        "operators, checked against eager at start; the replica refuses to start on a mismatch); eager: "
        "the Hugging Face module as is. Ignored by the onnx backend.",
    )
    torch_profiler: ProfilerConfig = ProfilerConfig()


class CandidateConfig(_Frozen):
    """A second version of the same model served beside the stable one (canary, or pinned per request).
    Its share of unpinned traffic is the Ingress ``user_config.candidate_share`` (changed without restart)."""

    version: str


class ObservabilityConfig(_Frozen):
    """Logs and traces. Both leave the request path at once: logs through a bounded queue drained by
    a thread, spans through OpenTelemetry's batch processor; unsampled requests cost one comparison."""

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_queue_size: int = Field(default=10000, ge=1, description="Past it, DEBUG/INFO lines are dropped.")
    access_log: bool = Field(default=True, description="One JSON line per request, with its request id.")
    trace_sample_ratio: float = Field(default=0.01, ge=0.0, le=1.0)
    otlp_endpoint: str | None = Field(
        default=None,
        description="OTLP/HTTP collector, e.g. http://otel-collector:4318; null: spans go to the log.",
    )
    trace_to_log: bool = True


class AppArgs(_Frozen):
    """The ``args`` of the application in ``serve_config.yaml``."""

    model: ModelConfig = ModelConfig()
    candidate: CandidateConfig | None = None
    limits: LimitsConfig = LimitsConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    observability: ObservabilityConfig = ObservabilityConfig()

    @model_validator(mode="after")
    def _candidate_differs(self) -> AppArgs:
        if self.candidate is not None and self.candidate.version == self.model.version:
            raise ValueError(f"candidate version {self.candidate.version!r} is the stable version")
        return self

    def served_models(self) -> list[ModelConfig]:
        """Stable first, then the candidate (same model, other version)."""
        models = [self.model]
        if self.candidate is not None:
            models.append(self.model.model_copy(update={"version": self.candidate.version}))
        return models


class BatchingConfig(_Frozen):
    """Inference ``user_config``: the dynamic-batching knobs, tunable at run time."""

    max_batch_size: int = Field(default=64, ge=1, le=4096, description="Sequences per batch.")
    max_batch_tokens: int = Field(
        default=16384,
        ge=1,
        description="Padded tokens per batch (longest x count); a longer item runs alone.",
    )
    # Per forward pass. On CPU, small passes win (cache-resident activations): measured here 320 seq/s
    # at 512 padded tokens vs 160 seq/s at 32 x longest; on a GPU, raise both.
    micro_batch_size: int = Field(default=32, ge=1, le=4096, description="Sequences per forward pass.")
    micro_batch_tokens: int = Field(default=512, ge=1, description="Padded tokens per forward pass.")
    # A maximum wait for the first request of a batch: a full batch leaves at once.
    batch_wait_timeout_s: float = Field(default=0.005, ge=0.0, le=1.0)
    adaptive_wait: bool = Field(
        default=True, description="Shrink the wait when batches stay small, grow it when they hit the cap."
    )
    min_wait_s: float = Field(default=0.0005, ge=0.0, le=1.0)
    max_wait_s: float = Field(default=0.02, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _window_in_bounds(self) -> BatchingConfig:
        if self.min_wait_s > self.max_wait_s:
            raise ValueError("min_wait_s must not exceed max_wait_s")
        return self


class IngressConfig(_Frozen):
    """Ingress ``user_config``: concurrent requests are grouped so that each downstream call
    (tokenize, infer, serialize) carries many requests; the per-call cost of a hop is then shared."""

    max_in_flight: int = Field(
        default=512,
        ge=1,
        description="Requests inside one ingress replica; past it: 503 + Retry-After at once.",
    )
    request_timeout_s: float = Field(
        default=30.0, gt=0, description="Default deadline; a client may ask for less with X-Request-Timeout."
    )
    fallback_cache_mb: float = Field(
        default=0.0,
        ge=0.0,
        description="LRU of recent answers served, marked degraded, when the model path "
        "fails or times out; 0 turns it off.",
    )
    candidate_share: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Share of requests that name no version sent to the candidate version (canary).",
    )
    max_group_size: int = Field(default=64, ge=1, le=1024, description="Requests per group.")
    # Measured on 2 cores, single texts at concurrency 8: 2 ms 54 req/s, 4 ms 70, 8 ms 82 (p99 139 ms).
    group_wait_timeout_s: float = Field(
        default=0.008,
        ge=0.0,
        le=1.0,
        description="The longest the first request of a group waits for company.",
    )
    adaptive_wait: bool = Field(
        default=True,
        description="Wait only while company can still come: a request alone (nothing else in "
        "flight) leaves at once unless the clients of a group answered within the window are "
        "coming back, and while no group is running a group leaves as soon as it holds as many "
        "requests as were lately in flight at once.",
    )


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
