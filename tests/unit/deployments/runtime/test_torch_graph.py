"""The traced torch graph (runtime.torch_graph: trace): same vectors as eager on what users receive,
in fp32 and bf16, one pass or two in parallel, for embeddings and class probabilities; a trace that does
not generalize is refused at start, never served."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from deployments.config import ModelConfig, RuntimeConfig
from deployments.repository.resolve import resolve_model
from deployments.runtime.backends import create_runner
from deployments.runtime.batching import BatchLimits
from deployments.runtime.torch_graph import CHECK_SHAPES, TraceMismatchError, check_batch, traced_head
from preprocess.tokenize import TextTokenizer
from tests.support.models import build_classifier
from tests.support.vectors import row_cosines

MIN_COSINE = 0.9999
TEXTS = [
    "Short.",
    "one",
    "A sentence of middling length about batching requests by length.",
    "Ünïcödé and 日本語 and emoji 🚀",
    "Serving transformer models well means sorting requests by length so that little compute goes to "
    "padding, and keeping the latency of every single request low, even under heavy load. " * 3,
]


@pytest.fixture(scope="module")
def sequences(default_model) -> list[np.ndarray]:
    tok = TextTokenizer(default_model.tokenizer_file, 256)
    return list(tok.encode(TEXTS * 5, truncate=True).sequences())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("parallel", [1, 2])
def test_trace_matches_eager(sequences, precision, parallel) -> None:
    model = resolve_model(ModelConfig(precision=precision), hash_files=False)
    eager = create_runner(model, "cpu")
    traced = create_runner(model, "cpu", graph="trace", parallel_passes=parallel)
    assert (eager.graph, traced.graph) == ("eager", "trace")
    # Small passes: many shapes, padded rows, the one-token text alone or beside long ones.
    limits = BatchLimits(7, 600)
    want, got = eager.run(sequences, limits), traced.run(sequences, limits)
    assert got.micro_batches > 2 and got.values.shape == want.values.shape
    assert row_cosines(want.values, got.values).min() >= MIN_COSINE
    np.testing.assert_allclose(np.linalg.norm(got.values, axis=1), 1.0, atol=1e-4)
    # Order is the caller's: each text alone gives its own row of the batched answer.
    for i in (0, 4, len(sequences) - 1):
        alone = traced.run([sequences[i]]).values[0]
        assert float(row_cosines(alone[None], got.values[i : i + 1])[0]) >= MIN_COSINE


def test_trace_of_classifier_matches_eager(tmp_path: Path, sequences) -> None:
    build_classifier(tmp_path)
    config = ModelConfig(repository=str(tmp_path), name="tiny-sentiment", version="1", task="classify")
    model = resolve_model(config)
    eager = create_runner(model, "cpu").run(sequences, BatchLimits(4, 1024)).values
    traced = create_runner(model, "cpu", graph="trace").run(sequences, BatchLimits(4, 1024)).values
    np.testing.assert_allclose(traced, eager, atol=1e-4)
    np.testing.assert_allclose(traced.sum(axis=1), 1.0, atol=1e-5)


class _ShapeBranching(torch.nn.Module):
    """A model whose forward takes a Python branch on the sequence length: tracing freezes the branch
    taken by the example, so other lengths come out wrong, the kind of model tracing cannot serve."""

    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(vocab_size=50)
        self.embed = torch.nn.Embedding(50, 8)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
        hidden = self.embed(input_ids)
        if input_ids.shape[1] > 8:  # the example is 8 long: this branch is never recorded
            hidden = -hidden
        return SimpleNamespace(last_hidden_state=hidden)


def test_a_trace_that_does_not_generalize_is_refused() -> None:
    with pytest.raises(TraceMismatchError, match="cosine"):
        traced_head(_ShapeBranching(), "embed", "mean", True, torch.device("cpu"))


def test_check_batches_cover_padding_and_single_tokens() -> None:
    shapes = [check_batch(*s, 100, torch.device("cpu")) for s in CHECK_SHAPES]
    lengths = [mask.sum(dim=1).tolist() for _, mask in shapes]
    assert [1] in lengths  # one row of one token
    assert any(len(set(row)) > 1 for row in lengths)  # padded rows beside longer ones
    assert all(int(ids.max()) < 100 and int(ids[mask.bool()].min()) >= 1 for ids, mask in shapes)


def test_graph_setting_is_validated() -> None:
    assert RuntimeConfig().torch_graph == "trace"  # the default lives in code now
    assert RuntimeConfig(torch_graph="eager").torch_graph == "eager"
    with pytest.raises(ValidationError):
        RuntimeConfig(torch_graph="compile")
    model = resolve_model(ModelConfig(), hash_files=False)
    with pytest.raises(ValueError, match="eager or trace"):
        create_runner(model, "cpu", graph="compile")  # the runner refuses it too, not a silent eager


def test_bf16_on_a_cpu_without_bf16_instructions_warns(monkeypatch, caplog) -> None:
    import deployments.runtime.torch_runner as model_runner

    model = resolve_model(ModelConfig(precision="bf16"), hash_files=False)
    for native, warned in ((True, False), (False, True)):
        monkeypatch.setattr(model_runner, "cpu_has_bf16", lambda native=native: native)
        caplog.clear()
        with caplog.at_level("WARNING", logger="textserve.runner"):
            create_runner(model, "cpu")
        assert any("without bf16 instructions" in r.getMessage() for r in caplog.records) == warned
