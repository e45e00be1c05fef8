"""Typed, frozen configuration built from ``serve_config.yaml``.

``RouterArgs`` and ``ModelAppArgs`` are the applications' ``args`` blocks (fixed for a deployment's life);
the ``user_config`` blocks, tunable at run time, are in ``deployments/user_config.py``.
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
    task: Literal["embed", "classify", "rerank", "sparse_embed", "generate"] = Field(
        default="embed",
        description="embed, classify, rerank (cross-encoder), sparse_embed (SPLADE) or generate (a causal "
        "LM: /v1/completions, /v1/chat/completions), as in the manifest.",
    )
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
        if self.task == "generate" and self.precision == "fp16" and self.device == "cpu":
            raise ValueError("task generate on a CPU runs fp32 or bf16")
        if self.backend == "onnx" and self.task not in ("embed", "classify"):
            raise ValueError(
                f"task {self.task} is served by backend torch (the ONNX export covers embed, classify)"
            )
        return self

    def manifest_path(self) -> Path:
        version_dir = resolve_path(self.repository) / self.name / self.version
        if self.backend == "onnx":
            version_dir = version_dir / onnx_subdir(self.precision)
        return version_dir / "manifest.json"


class LimitsConfig(_Frozen):
    """The sizes a client must respect, router-wide. ``GET /v1/models`` lists them in each entry's ``limits``
    (with the model's own ``max_tokens_per_input``, from its manifest), and each is a 4xx naming it."""

    max_inputs_per_request: int = Field(
        default=256,
        ge=1,
        description="Inputs (texts or token-id lists) per request; also a rerank's documents. Over it: 400 "
        "too_many_inputs.",
    )
    max_body_bytes: int = Field(
        default=2 * 1024 * 1024,
        ge=1024,
        description="Request body bytes (listed as max_request_bytes). Over it: 413 payload_too_large.",
    )

    @property
    def max_documents_per_rerank(self) -> int:
        """A rerank's documents are sequences in the same token-budget batches as an embedding request's
        inputs and cost the same, so one bound serves both (Cohere's API takes up to 1000: raise
        ``max_inputs_per_request`` for that)."""
        return self.max_inputs_per_request


class ProfilerConfig(_Frozen):
    """torch.profiler around the next ``batches`` inference batches (then off); see docs/profiling.md."""

    enabled: bool = False
    out_dir: str = "/tmp/textserve-profile"
    batches: int = Field(default=20, ge=1)


class RuntimeConfig(_Frozen):
    cuda_alloc_conf: str | None = Field(
        default="expandable_segments:True",
        description="PYTORCH_CUDA_ALLOC_CONF for the replicas that run a model (an encoder's Inference, a "
        "generate model's Model), set before CUDA initializes; a value already in the environment wins.",
    )
    cuda_cache_release_fraction: float = Field(
        default=0.9,
        gt=0.0,
        le=1.0,
        description="Release the CUDA allocator's cache (after a batch, or a generate model's decode step) "
        "only while it holds more than this share of the GPU's memory.",
    )
    verify_checksums: bool = Field(
        default=True, description="Check weight files against the manifest's sha256 sums at start."
    )
    intra_op_threads: int | None = Field(
        default=1,
        ge=1,
        description="Intra-op threads per forward pass (torch or ONNX Runtime); null: the backend's default "
        "(every core the process sees). Keep intra_op_threads x parallel_passes at most the replica's cores; "
        "on a GPU it only sets the CPU threads around the passes.",
    )
    parallel_passes: int = Field(
        default=2,
        ge=1,
        le=16,
        description="Forward passes of one batch run at once, each on its own thread (the batch is cut "
        "into at least this many length-sorted passes). On a CPU, set it to the replica's cores with "
        "intra_op_threads 1; on a GPU, 1.",
    )
    torch_graph: Literal["eager", "trace"] = Field(
        default="trace",
        description="torch backend: trace runs the model as one TorchScript graph (no Python between "
        "operators, checked against eager at start; the replica refuses to start on a mismatch); eager: "
        "the Hugging Face module as is. Ignored by the onnx backend.",
    )
    torch_profiler: ProfilerConfig = ProfilerConfig()


class DraftModelConfig(_Frozen):
    """The draft model of speculative decoding: a smaller causal LM with the target's tokenizer, in the
    target's repository, loaded in the target's precision on its device."""

    name: str
    version: str = "1"


class SpeculativeConfig(_Frozen):
    """Speculative decoding (deployments/runtime/generate/speculative.py): a cheap proposer guesses
    ``tokens`` next tokens of each row and the model checks them all in one pass, keeping the longest run
    it agrees with plus one token of its own. Greedy output stays the model's own, sampled output follows
    its distribution. Pays when one decode step is dominated by reading the weights (small batches)."""

    method: Literal["draft", "ngram"] = Field(
        description="draft: a small model with the same tokenizer proposes (needs ``draft``); ngram: the "
        "tokens that followed the last n-gram's most recent earlier occurrence in the prompt and output "
        "(no model; pays when outputs copy the prompt: extraction, code edits, RAG quotes)."
    )
    draft: DraftModelConfig | None = None
    tokens: int = Field(
        default=4,
        ge=1,
        le=16,
        description="Tokens proposed per step. More pays when the proposer agrees often (a well-matched "
        "draft); fewer when it does not. Each costs one KV slot per request beside its reservation.",
    )
    max_rows: int = Field(
        default=8,
        ge=1,
        description="Speculate while the batch has at most this many rows; above it, plain decode steps. "
        "A large batch is compute-bound and gains little from checking several tokens per row: raise it "
        "on a GPU, where a step is memory-bound up to larger batches.",
    )
    ngram_max: int = Field(default=4, ge=1, description="ngram: the longest n-gram looked up first.")
    ngram_min: int = Field(default=2, ge=1, description="ngram: the shortest n-gram tried.")

    @model_validator(mode="after")
    def _draft_named(self) -> SpeculativeConfig:
        if self.method == "draft" and self.draft is None:
            raise ValueError("speculative.method draft needs speculative.draft (name, version)")
        if self.ngram_min > self.ngram_max:
            raise ValueError("speculative.ngram_min is above ngram_max")
        return self


class GenerationConfig(_Frozen):
    """Task generate: the continuous-batching engine's bounds (deployments/runtime/generate/engine.py)."""

    max_running: int = Field(default=32, ge=1, description="Requests decoded together (rows of a step).")
    kv_cache_tokens: int = Field(
        default=32768,
        ge=16,
        description="KV cache bound in token slots per layer, padding included: the running batch's "
        "buffers never hold more. A request is admitted only when the batch can hold its whole generation "
        "(prompt + max_tokens); until then it waits. Must hold one request of the model's whole context "
        "(refused at start otherwise). Raise it for more concurrent long requests if memory allows.",
    )
    prefix_cache_tokens: int = Field(
        default=8192,
        ge=0,
        description="Prefix caching: prompt prefixes already computed (a shared system prompt, an "
        "instruction template) are kept, up to this many token slots per layer beside kv_cache_tokens, and "
        "reused instead of prefilled again; least recently used evicted first. 0 turns it off. Size it to "
        "the distinct shared prefixes your traffic has (each costs its length).",
    )
    prefix_block_tokens: int = Field(
        default=16,
        ge=1,
        le=512,
        description="Prefix caching's unit: prompts share cached keys and values in whole blocks of this "
        "many tokens. Smaller reuses more of a partly shared prefix, at more lookups.",
    )
    speculative: SpeculativeConfig | None = Field(
        default=None, description="Speculative decoding; null: off (one token per decode step)."
    )
    prefill_chunk_tokens: int = Field(
        default=256,
        ge=1,
        description="Prompt tokens prefilled per engine iteration (between two decode steps): a long "
        "prompt is prefilled in chunks, so running streams keep their pace.",
    )
    prefill_pack_tokens: int = Field(
        default=1024,
        ge=1,
        description="Whole prompts of at most prefill_chunk_tokens waiting together are prefilled in one "
        "pass, up to this many tokens (with row_group_attention): a burst of short prompts costs one pass, "
        "not one per prompt with decode steps between, so its first tokens come sooner. Running streams then "
        "pause for at most this many tokens' prefill. At most prefill_chunk_tokens: no packing.",
    )
    max_waiting: int = Field(
        default=128, ge=1, description="Requests waiting for admission; past it: 503 with Retry-After."
    )
    default_max_tokens: int = Field(default=256, ge=1, description="max_tokens when a request gives none.")
    max_tokens_cap: int = Field(default=2048, ge=1, description="The largest max_tokens a request may ask.")
    intra_op_threads: int | None = Field(
        default=None, ge=1, description="torch threads of the engine's forward passes; null: torch's default."
    )
    packed_weights: bool = Field(
        default=True,
        description="fp32 on CPU: run the model's linear layers on oneDNN with weights packed once at "
        "load (deployments/runtime/packed_linear.py): faster small-batch decode steps than PyTorch's "
        "default kernel. Costs the linear weights' memory once more while loading; turn it off where "
        "memory is short. Ignored for other precisions and on a GPU.",
    )
    row_group_attention: bool = Field(
        default=True,
        description="A decode step's attention by groups of rows of similar length, each over its own "
        "longest row rather than the batch's (deployments/runtime/generate/row_attention.py): less padding "
        "read at mixed lengths. Needs the model on SDPA; otherwise ignored.",
    )


class CandidateConfig(_Frozen):
    """A second version of the same model served beside the stable one (canary, or pinned per request).
    Its share of unpinned traffic is the Model deployment's ``user_config.candidate_share`` (changed
    without a restart)."""

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


class ModelAppArgs(_Frozen):
    """The ``args`` of one model's application (``deployments.app:build_model``). Each model is its own
    Serve application, so a change here (a new version) rolls that model's replicas and no other's."""

    model: ModelConfig = ModelConfig()
    candidate: CandidateConfig | None = None
    runtime: RuntimeConfig = RuntimeConfig()
    generation: GenerationConfig = GenerationConfig()
    observability: ObservabilityConfig = ObservabilityConfig()

    @model_validator(mode="after")
    def _candidate_differs(self) -> ModelAppArgs:
        if self.candidate is not None and self.candidate.version == self.model.version:
            raise ValueError(f"candidate version {self.candidate.version!r} is the stable version")
        if self.model.task == "generate" and self.candidate is not None:
            raise ValueError("task generate serves one version at a time: roll it by changing model.version")
        return self

    def served_models(self) -> list[ModelConfig]:
        """Stable first, then the candidate (same model, other version)."""
        models = [self.model]
        if self.candidate is not None:
            models.append(self.model.model_copy(update={"version": self.candidate.version}))
        return models


class AuthConfig(_Frozen):
    """Who may call the model routes (``docs/security.md``). Without ``keys_file`` every request is the
    tenant ``anonymous``, with no limits; with one, each model route needs ``Authorization: Bearer <key>``."""

    keys_file: str | None = Field(
        default=None,
        description="The tenants file (``python -m deployments.tools.keys``): each tenant's policy and its "
        "API keys as salted hashes. Relative paths are from the project root. Read again when it changes.",
    )
    reload_interval_s: float = Field(default=2.0, gt=0, description="How often the file is checked.")


class RouterArgs(_Frozen):
    """The ``args`` of the HTTP application (``deployments.app:build_router``): which models it routes to.

    The router never changes when a model's version does, so rolling one model leaves its replicas alone."""

    models: list[str] = Field(
        min_length=1,
        description="Model applications in the same config; a client names a model by its application's "
        "name (the model's own name, unless the application serves it under another).",
    )
    default_model: str | None = Field(
        default=None, description="Answers requests that name no model; null: the first of ``models``."
    )
    limits: LimitsConfig = LimitsConfig()
    auth: AuthConfig = AuthConfig()
    observability: ObservabilityConfig = ObservabilityConfig()

    @model_validator(mode="after")
    def _default_is_served(self) -> RouterArgs:
        if len(set(self.models)) != len(self.models):
            raise ValueError(f"a model is listed twice: {self.models}")
        if self.default_model is not None and self.default_model not in self.models:
            raise ValueError(f"default_model {self.default_model!r} is not one of models {self.models}")
        return self

    @property
    def default(self) -> str:
        return self.default_model or self.models[0]


def resolve_path(path: str) -> Path:
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p.resolve()
    return (PROJECT_ROOT / p).resolve()
