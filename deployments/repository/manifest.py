"""Model manifests: what a model directory claims to be, checked against its weights and the config.

The service refuses to start when a manifest is missing, malformed, or disagrees with the weights
or with what ``serve_config.yaml`` asks for; the error names the offending field. No Ray import.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

PACKAGE_SCHEME = "package://"
ONNX_FILE = "model.onnx"
Precision = Literal["fp32", "fp16", "bf16"]


class ManifestError(Exception):
    """A model that must not be served. ``field`` names the manifest field at fault."""

    def __init__(self, field: str, message: str, manifest_path: str | Path = "") -> None:
        super().__init__(field, message, str(manifest_path))
        self.field = field
        self.message = message
        self.manifest_path = str(manifest_path)

    def __str__(self) -> str:
        return (
            f"refusing to serve model: manifest field '{self.field}': {self.message} ({self.manifest_path})"
        )


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class InputSignature(_Strict):
    tokenizer: str = Field(default="tokenizer.json", description="Fast tokenizer file, in the weights dir.")
    max_tokens: int = Field(ge=1, description="Longest input in tokens, special tokens included.")


class OutputSignature(_Strict):
    dimension: int | None = Field(
        default=None, ge=1, description="Embedding size (task embed); vocabulary size (task sparse_embed)."
    )
    labels: tuple[str, ...] | None = Field(default=None, description="Class names in logit order.")


class Quantization(_Strict):
    """Per-dimension (min, max) of the model's embeddings over a calibration corpus: the int8/uint8 buckets
    (``python -m deployments.tools.calibrate``)."""

    ranges: tuple[tuple[float, ...], tuple[float, ...]]
    corpus: str = Field(default="", description="What the ranges were calibrated on, and how many texts.")


Task = Literal["embed", "classify", "rerank", "sparse_embed", "generate"]


class Manifest(_Strict):
    schema_version: Literal[1] = 1
    name: str = Field(min_length=1)
    version: str = Field(min_length=1)
    task: Task
    weights: str = Field(
        default=".", description="Weights dir: relative to the manifest, or package://pkg/sub."
    )
    format: Literal["transformers", "onnx"] = Field(
        default="transformers", description="transformers: torch backend; onnx: ONNX Runtime (model.onnx)."
    )
    precision: Precision = Field(
        default="fp32",
        description="Compute precision of an ONNX graph (its inputs and output stay int64 / float32). "
        "Torch weights are cast at load time to the configured precision instead.",
    )
    input: InputSignature
    output: OutputSignature
    pooling: Literal["mean", "cls"] | None = None
    normalize: bool = False
    activation: Literal["sigmoid", "identity"] | None = Field(
        default=None,
        description="Task rerank: the relevance score from the one-label logit (sigmoid, as "
        "sentence-transformers' CrossEncoder does by default, or identity).",
    )
    prompts: dict[str, str] = Field(
        default_factory=dict,
        description="Named prompts prepended to a text (sentence-transformers' prompts), e.g. "
        '{"query": "query: ", "document": "passage: "}; chosen per request by input_type or prompt_name.',
    )
    default_prompt_name: str | None = Field(default=None, description="The prompt used when none is named.")
    matryoshka_dimensions: tuple[int, ...] | None = Field(
        default=None,
        description="Task embed: the dimensions the model was trained to be cut to; a request's "
        "`dimensions` must be one of them (a model without them refuses `dimensions`).",
    )
    quantization: Quantization | None = None
    chat_template: bool = Field(
        default=False,
        description="Task generate: the tokenizer (tokenizer_config.json) has a chat template, so the model "
        "serves /v1/chat/completions; without one it serves /v1/completions only.",
    )
    files: dict[str, str] = Field(default_factory=dict, description="sha256 of weight files.")

    @model_validator(mode="after")
    def _signature_fits_task(self) -> Manifest:
        if self.task in ("embed", "sparse_embed") and self.output.dimension is None:
            raise ValueError(f"output.dimension is required for task '{self.task}'")
        if self.task == "embed" and self.pooling is None:
            raise ValueError("pooling is required for task 'embed'")
        if self.task == "classify":
            labels = self.output.labels
            if not labels or len(labels) < 2 or len(set(labels)) != len(labels):
                raise ValueError("output.labels must list at least two distinct labels for 'classify'")
        if self.task == "rerank" and self.activation is None:
            raise ValueError("activation is required for task 'rerank' (sigmoid or identity)")
        if self.task == "generate" and (self.pooling or self.output.dimension or self.output.labels):
            raise ValueError("task 'generate' takes no pooling, output.dimension or output.labels")
        if self.chat_template and self.task != "generate":
            raise ValueError("chat_template is for task 'generate' only")
        if self.default_prompt_name is not None and self.default_prompt_name not in self.prompts:
            raise ValueError(f"default_prompt_name {self.default_prompt_name!r} is not one of prompts")
        self._check_embedding_extras()
        return self

    def _check_embedding_extras(self) -> None:
        dimension = self.output.dimension or 0
        dims = self.matryoshka_dimensions
        if dims is not None and (self.task != "embed" or not all(1 <= d <= dimension for d in dims)):
            raise ValueError(f"matryoshka_dimensions must be embedding sizes from 1 to {dimension}")
        if self.quantization is not None:
            lows, highs = self.quantization.ranges
            if self.task != "embed" or len(lows) != dimension or len(highs) != dimension:
                raise ValueError(f"quantization.ranges must hold two rows of {dimension} values")


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """A manifest that passed every check, with absolute paths to what it describes."""

    manifest: Manifest
    manifest_path: Path
    weights_dir: Path
    precision: Precision = "fp32"  # the configured one: the torch backend loads its weights in it

    @property
    def onnx_file(self) -> Path:
        return self.weights_dir / ONNX_FILE

    @property
    def tokenizer_id(self) -> str:
        """A short hash of the tokenizer file: equal ids, equal token ids (EncodedTexts.tokenizer_id)."""
        return hashlib.sha256(self.tokenizer_file.read_bytes()).hexdigest()[:16]

    @property
    def tokenizer_file(self) -> Path:
        return self.weights_dir / self.manifest.input.tokenizer

    @property
    def output_size(self) -> int:
        """Columns the model returns per text: embedding or vocabulary size, labels, or 1 (a rerank score)."""
        out = self.manifest.output
        if self.manifest.task == "rerank":
            return 1
        return out.dimension if out.dimension is not None else len(out.labels or ())


def load_manifest(path: Path) -> Manifest:
    if not path.is_file():
        raise ManifestError("manifest.json", "file is missing", path)
    try:
        text = path.read_text(encoding="utf-8")
        json.loads(text)  # a clear message for malformed files before schema checks
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError("manifest.json", f"not valid JSON: {exc}", path) from None
    try:
        # JSON mode: strict types, but JSON arrays are accepted where tuples are declared.
        return Manifest.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        field = ".".join(str(p) for p in first["loc"]) or _field_in(first["msg"])
        raise ManifestError(field, first["msg"], path) from None


def _field_in(message: str) -> str:
    # Cross-field rules report their field in the message ("output.labels must ...").
    for word in message.replace("Value error, ", "").split():
        if "." in word or word in ("pooling", "activation", "default_prompt_name", "matryoshka_dimensions"):
            return word
    return "manifest.json"


def weights_dir_of(manifest: Manifest, manifest_path: Path) -> Path:
    if manifest.weights.startswith(PACKAGE_SCHEME):
        package, _, sub = manifest.weights[len(PACKAGE_SCHEME) :].partition("/")
        try:
            root = importlib.resources.files(package)
        except ModuleNotFoundError:
            raise ManifestError("weights", f"package {package!r} is not installed", manifest_path) from None
        return Path(str(root / sub)).resolve()
    return (manifest_path.parent / manifest.weights).resolve()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))
