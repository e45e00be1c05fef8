"""The torch backend's forward pass as one TorchScript graph (``runtime.torch_graph: trace``). No Ray.

Eager Hugging Face modules run Python between every operator: on a CPU that is a fifth of a small
pass's time, and each operator re-takes the GIL, so two passes on two threads (``parallel_passes``)
queue for it. A traced, frozen graph runs all operators in C++ with the GIL released. Tracing records
one example's path, so the graph is checked against the eager model on other shapes (padded rows,
one token, a single row) before it is used: the service refuses to start on a mismatch rather than
serve different vectors (docs/architecture.md, decision log).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import torch

from deployments.runtime.packed_linear import pack_linears

GraphFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# (rows, longest, shortest) of the check batches: padded and unpadded, one row, one token.
CHECK_SHAPES = ((1, 1, 1), (1, 9, 9), (3, 17, 4), (8, 40, 12), (2, 64, 64))
MIN_COSINE = 0.9999  # embeddings (the backend parity bar)
MAX_PROB_DIFF = 1e-3  # class probabilities


class TraceMismatchError(RuntimeError):
    """A graph (traced, or a lone pass's ONNX export) does not reproduce its reference: names shape, gap."""


def pool(hidden: torch.Tensor, attention: torch.Tensor, pooling: str | None, normalize: bool) -> torch.Tensor:
    """Sentence embedding from token states; padded positions carry junk, so only real tokens count."""
    if pooling == "cls":
        pooled = hidden[:, 0]
    else:
        weights = attention.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
    if normalize:
        pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
    return pooled


def sparse_pool(logits: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """SPLADE: log(1 + relu(logits)) per token and vocabulary entry, max-pooled over the real tokens."""
    weights = torch.log1p(torch.relu(logits)) * attention.unsqueeze(-1).to(logits.dtype)
    return weights.max(dim=1).values


def pair_type_ids(input_ids: torch.Tensor, sep_id: int) -> torch.Tensor:
    """Token type ids of encoded pairs ([CLS] a [SEP] b [SEP]): 1 after the first separator. Derived from
    the ids inside the graph, so a cross-encoder takes the same two inputs as every other model."""
    is_sep = (input_ids == sep_id).to(torch.int64)
    return ((torch.cumsum(is_sep, dim=1) - is_sep) > 0).to(torch.int64)


class _Head(torch.nn.Module):
    """Model plus what the service returns: pooled (and normalized) float32 vectors, probabilities, a
    cross-encoder's raw logit (the activation is the serializer's: TEI's raw_scores needs the logit), or
    SPLADE weights over the vocabulary."""

    def __init__(
        self,
        model: torch.nn.Module,
        task: str,
        pooling: str | None,
        normalize: bool,
        sep_id: int | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.task = task
        self.pooling = pooling
        self.normalize = normalize
        # Pairs need segment ids only where the model has segment embeddings (BERT; not RoBERTa).
        types = int(getattr(model.config, "type_vocab_size", 1) or 1)
        self.sep_id = sep_id if task == "rerank" and types > 1 else None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.sep_id is not None:
            types = pair_type_ids(input_ids, self.sep_id)
            result = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=types)
        else:
            result = self.model(input_ids=input_ids, attention_mask=attention_mask)
        if self.task == "classify":
            return torch.softmax(result.logits.float(), dim=-1)
        if self.task == "rerank":
            return result.logits.float()
        if self.task == "sparse_embed":
            return sparse_pool(result.logits.float(), attention_mask)
        return pool(result.last_hidden_state.float(), attention_mask, self.pooling, self.normalize)


def check_batch(
    rows: int, longest: int, shortest: int, vocab: int, device: torch.device
) -> list[torch.Tensor]:
    """Deterministic token ids (1..vocab-1) with lengths spread from ``shortest`` to ``longest``."""
    gen = np.random.default_rng(rows * 1000 + longest)
    lengths = np.linspace(longest, shortest, rows).round().astype(int)
    ids = np.zeros((rows, longest), dtype=np.int64)
    mask = np.zeros((rows, longest), dtype=np.int64)
    for r, n in enumerate(lengths):
        ids[r, :n] = gen.integers(1, vocab, n)
        mask[r, :n] = 1
    return [torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)]


def eager_head(
    model: torch.nn.Module, task: str, pooling: str | None, normalize: bool, sep_id: int | None = None
) -> GraphFn:
    return _Head(model, task, pooling, normalize, sep_id).eval()


@torch.inference_mode()
def traced_head(
    model: torch.nn.Module,
    task: str,
    pooling: str | None,
    normalize: bool,
    device: torch.device,
    sep_id: int | None = None,
    pack: bool = False,
) -> GraphFn:
    """The traced, frozen head, verified against the eager one on ``CHECK_SHAPES``. ``pack``: its linear
    layers' weights packed once (``packed_linear``; the model is changed in place), verified the same
    way: the references come from the model as loaded."""
    eager = _Head(model, task, pooling, normalize, sep_id).eval()
    vocab = int(getattr(model.config, "vocab_size", 1000))
    checks = [(shape, check_batch(*shape, vocab, device)) for shape in CHECK_SHAPES]
    wanted = [eager(ids, mask) for _, (ids, mask) in checks]
    if pack:
        pack_linears(model, script=True)
    example = check_batch(2, 8, 5, vocab, device)  # padded, so the mask path is what gets recorded
    with warnings.catch_warnings():
        # Shape-dependent Python branches become constants; the check below is what vouches for them.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.freeze(torch.jit.trace(eager, tuple(example), check_trace=False).eval())
    for (shape, (ids, mask)), want in zip(checks, wanted, strict=True):
        compare_outputs(task, shape, want, traced(ids, mask))
    return traced


def compare_outputs(
    task: str, shape: tuple[int, int, int], want: torch.Tensor, got: torch.Tensor, what: str = "traced graph"
) -> None:
    """``got`` (from ``what``) against ``want`` within the backend parity bar, or ``TraceMismatchError``."""
    if want.shape != got.shape:
        raise TraceMismatchError(
            f"{what} gives shape {tuple(got.shape)} for {shape}, expected {tuple(want.shape)}"
        )
    if task != "embed":  # probabilities, logits, sparse weights: relative to their scale
        gap = float((want - got).abs().max()) / max(1.0, float(want.abs().max()))
        if gap > MAX_PROB_DIFF:
            raise TraceMismatchError(f"{what}: outputs differ by {gap:.2e} at {shape} (max {MAX_PROB_DIFF})")
        return
    cosine = float(torch.nn.functional.cosine_similarity(want, got, dim=1).min())
    if not cosine >= MIN_COSINE:
        raise TraceMismatchError(f"{what}: vectors at cosine {cosine:.6f} at {shape} (min {MIN_COSINE})")
