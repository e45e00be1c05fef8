"""The model for the in-process rows, with the libraries directly and not the service's code: ``tokenizers``
for the tokenizer file, ``transformers`` + torch with the manifest's pooling for ``format: transformers``,
``onnxruntime`` on ``model.onnx`` (pooling inside the export) for ``format: onnx`` (``bench/inprocess.py``
measures it)."""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from deployments.repository.manifest import load_manifest, weights_dir_of

ONNX_FILE = "model.onnx"
PAD_TOKENS = ("[PAD]", "<pad>", "<|padding|>")


@dataclass(frozen=True)
class ModelFiles:
    """What a model directory's ``manifest.json`` says, with the absolute path of its weights."""

    manifest: Any  # deployments.repository.manifest.Manifest
    weights_dir: Path

    @property
    def tokenizer_file(self) -> Path:
        return self.weights_dir / self.manifest.input.tokenizer


def load_model_dir(model_dir: Path) -> ModelFiles:
    path = (model_dir / "manifest.json").resolve()
    manifest = load_manifest(path)
    if manifest.task != "embed":
        raise ValueError(f"{path}: task {manifest.task!r}; the in-process rows measure embedding models")
    return ModelFiles(manifest, weights_dir_of(manifest, path))


def plan_passes(
    lengths: list[int], max_sequences: int, max_tokens: int, at_least: int = 1
) -> list[list[int]]:
    """Indices sorted by length, cut into forward passes of at most ``max_sequences`` texts and
    ``max_tokens`` padded tokens (a text longer than that runs alone), and into at least ``at_least``
    passes where there are that many texts (so that parallel passes have something to share)."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    per_pass = max(1, min(max_sequences, -(-len(order) // max(1, at_least))))
    passes: list[list[int]] = []
    for i in order:
        current = passes[-1] if passes else None
        if current is not None and len(current) < per_pass and lengths[i] * (len(current) + 1) <= max_tokens:
            current.append(i)
        else:
            passes.append([i])
    return passes


class Embedder:
    """Tokenize + forward + pool of one embedding model, with torch/transformers or ONNX Runtime.

    ``precision`` (fp32, fp16, bf16) and ``graph`` (eager, or trace: one frozen TorchScript graph) are the
    torch model's; ``threads`` is the intra-op threads per pass (None: the library's default) and
    ``parallel`` the passes of one call run at once, each on its own thread."""

    def __init__(
        self,
        files: ModelFiles,
        device: str = "cpu",
        precision: str = "fp32",
        graph: str = "eager",
        threads: int | None = None,
        parallel: int = 1,
    ) -> None:
        from tokenizers import Tokenizer

        self.files = files
        self.max_tokens = files.manifest.input.max_tokens
        self.tokenizer = Tokenizer.from_file(str(files.tokenizer_file))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_tokens)
        self.pad_id = _pad_id(self.tokenizer)
        self.parallel = parallel
        self._pool = ThreadPoolExecutor(parallel, initializer=self._set_threads) if parallel > 1 else None
        self.threads = threads
        self._set_threads()
        if files.manifest.format == "onnx":
            self._forward = self._onnx(device, threads)
        else:
            self._forward = self._torch(device, precision, graph)

    def _set_threads(self) -> None:
        if self.threads is not None and self.files.manifest.format != "onnx":
            import torch

            torch.set_num_threads(self.threads)

    def _onnx(self, device: str, threads: int | None) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        providers = ["CUDAExecutionProvider"] if device == "cuda" else []
        session = ort.InferenceSession(
            str(self.files.weights_dir / ONNX_FILE), options, providers=[*providers, "CPUExecutionProvider"]
        )
        output = session.get_outputs()[0].name

        def forward(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            (values,) = session.run([output], {"input_ids": ids, "attention_mask": mask})
            return np.asarray(values, dtype=np.float32)

        return forward

    def _torch(self, device: str, precision: str, graph: str) -> Any:
        import torch
        from transformers import AutoModel

        dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
        dev = torch.device(device)
        model = AutoModel.from_pretrained(str(self.files.weights_dir), dtype=dtype).to(dev).eval()
        head = _pooled_head(model, self.files.manifest.pooling, self.files.manifest.normalize)
        if graph == "trace":
            mask = torch.ones((2, 8), dtype=torch.long, device=dev)
            mask[1, 5:] = 0  # padded, so that the mask's path is what gets recorded
            example = (torch.ones_like(mask), mask)
            with torch.inference_mode(), warnings.catch_warnings():
                warnings.simplefilter("ignore", torch.jit.TracerWarning)
                head = torch.jit.freeze(torch.jit.trace(head, example, check_trace=False).eval())

        @torch.inference_mode()
        def forward(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            out = head(torch.from_numpy(ids).to(dev), torch.from_numpy(mask).to(dev))
            return out.float().cpu().numpy()

        return forward

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(texts)]

    def lengths(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self.encode(texts)]

    def _pass(self, sequences: list[list[int]]) -> np.ndarray:
        width = max(len(s) for s in sequences)
        ids = np.full((len(sequences), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(sequences), width), dtype=np.int64)
        for row, seq in enumerate(sequences):
            ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        return self._forward(ids, mask)

    def embed(
        self, texts: list[str], max_sequences: int | None = None, max_tokens: int | None = None
    ) -> np.ndarray:
        """The texts' embeddings in order, through passes of at most ``max_sequences`` texts and
        ``max_tokens`` padded tokens (default: one pass for all)."""
        sequences = self.encode(texts)
        passes = plan_passes(
            [len(s) for s in sequences],
            max_sequences or len(sequences),
            max_tokens or len(sequences) * self.max_tokens,
            self.parallel,
        )
        mapped = self._pool.map if self._pool is not None else map
        outputs = list(mapped(lambda idx: self._pass([sequences[i] for i in idx]), passes))
        result = np.empty((len(texts), outputs[0].shape[1]), dtype=np.float32)
        for idx, values in zip(passes, outputs, strict=True):
            result[idx] = values
        return result


def _pad_id(tokenizer: Any) -> int:
    if tokenizer.padding:
        return int(tokenizer.padding["pad_id"])
    for token in PAD_TOKENS:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return int(token_id)
    return 0  # masked out either way


def _pooled_head(model: Any, pooling: str | None, normalize: bool) -> Any:
    """``model`` with the manifest's pooling (mean over real tokens, or the first token) and L2 norm."""
    import torch

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            if pooling == "cls":
                pooled = hidden[:, 0]
            else:
                weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
            if normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
            return pooled

    return Pooled().eval()
