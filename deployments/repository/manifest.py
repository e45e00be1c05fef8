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
    dimension: int | None = Field(default=None, ge=1, description="Embedding size (task embed).")
    labels: tuple[str, ...] | None = Field(default=None, description="Class names in logit order.")


class Manifest(_Strict):
    schema_version: Literal[1] = 1
    name: str = Field(min_length=1)
    version: str = Field(min_length=1)
    task: Literal["embed", "classify"]
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
    files: dict[str, str] = Field(default_factory=dict, description="sha256 of weight files.")

    @model_validator(mode="after")
    def _signature_fits_task(self) -> Manifest:
        if self.task == "embed":
            if self.output.dimension is None:
                raise ValueError("output.dimension is required for task 'embed'")
            if self.pooling is None:
                raise ValueError("pooling is required for task 'embed'")
        else:
            labels = self.output.labels
            if not labels or len(labels) < 2 or len(set(labels)) != len(labels):
                raise ValueError("output.labels must list at least two distinct labels for 'classify'")
        return self


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
        out = self.manifest.output
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
        if "." in word or word in ("pooling",):
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
