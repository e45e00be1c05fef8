"""Linear weights packed once for oneDNN (CPU, bf16): the same products as ``nn.Linear``, every linear
layer replaced (tied weights included), only where it applies, and checked at start against the model as
loaded, so a packing that changed the outputs would refuse to start."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from deployments.config import ModelConfig
from deployments.repository.resolve import resolve_model
from deployments.runtime import torch_graph
from deployments.runtime.backends import create_runner
from deployments.runtime.packed_linear import PackedLinear, pack_linears, packs
from deployments.runtime.torch_graph import TraceMismatchError, traced_head
from deployments.tools.demo_models import DEMOS, VERSION, build
from preprocess.tokenize import TextTokenizer
from tests.support.vectors import row_cosines

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(
    not packs(CPU, torch.bfloat16), reason="this torch has no oneDNN linear to pack for"
)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 48), (5, 48), (3, 7, 48), (2, 1, 48)])
def test_packed_linear_computes_what_linear_does(shape: tuple[int, ...], bias: bool) -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 96, bias=bias).to(torch.bfloat16)
    x = torch.randn(*shape).to(torch.bfloat16)
    with torch.inference_mode():
        want = linear(x)
        got = torch.jit.script(PackedLinear(linear))(x)
    assert got.shape == want.shape and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


class _Tied(torch.nn.Module):
    """An embedding and a decoder sharing one weight (a masked-LM head), beside a nested linear."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(40, 16)
        self.block = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU())
        self.decoder = torch.nn.Linear(16, 40, bias=False)
        self.decoder.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.block(self.embed(ids)))


def test_every_linear_is_replaced_and_a_tied_embedding_keeps_its_weight() -> None:
    model = _Tied().to(torch.bfloat16).eval()
    ids = torch.tensor([[1, 5, 39, 0]])
    embedding = model.embed.weight.detach().clone()
    with torch.inference_mode():
        want = model(ids)
    assert pack_linears(model) == 2
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert torch.equal(model.embed.weight, embedding)
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).float(), want.float(), atol=5e-2, rtol=2e-2)


def test_only_a_cpu_in_bf16_packs() -> None:
    assert packs(CPU, torch.bfloat16)
    assert not packs(CPU, torch.float32)  # oneDNN's packed op is not faster there at every shape
    assert not packs(torch.device("cuda"), torch.bfloat16)


def test_the_runner_packs_bf16_traced_graphs_only() -> None:
    def linears(runner) -> int:
        return sum(isinstance(m, torch.nn.Linear) for m in runner.model.modules())

    bf16 = resolve_model(ModelConfig(precision="bf16"), hash_files=False)
    fp32 = resolve_model(ModelConfig(precision="fp32"), hash_files=False)
    assert linears(create_runner(bf16, "cpu", graph="trace")) == 0
    assert linears(create_runner(bf16, "cpu", graph="eager")) > 0  # eager is the module as loaded
    assert linears(create_runner(fp32, "cpu", graph="trace")) > 0


def test_a_packing_that_changes_outputs_refuses_to_start(monkeypatch) -> None:
    """The references are taken from the model as loaded, before packing: a packing step that changed
    the model (here, one that doubles a weight) is a mismatch, not a new reference."""
    model = resolve_model(ModelConfig(precision="bf16"), hash_files=False)
    runner = create_runner(model, "cpu", graph="eager")  # an unpacked bf16 model to trace again

    def corrupting(module: torch.nn.Module) -> None:
        first = next(m for m in module.modules() if isinstance(m, torch.nn.Linear))
        with torch.no_grad():
            first.weight.mul_(2.0)

    monkeypatch.setattr(torch_graph, "pack_model", corrupting)
    with pytest.raises(TraceMismatchError, match="cosine"):
        traced_head(runner.model, "embed", "mean", True, CPU, pack=True)


@pytest.fixture(scope="module")
def demos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("packed-demos")
    for spec in DEMOS:
        if spec.task in ("rerank", "sparse_embed"):
            assert build(spec, repo, onnx=False).startswith("built")
    return repo


@pytest.mark.parametrize("task", ["rerank", "sparse_embed"])
def test_packed_heads_serve_what_the_eager_model_does(demos: Path, task: str) -> None:
    """A cross-encoder (segment ids in the graph) and a SPLADE model (its decoder tied to the
    embeddings), bf16: the packed traced graph against the same weights run eagerly."""
    spec = next(s for s in DEMOS if s.task == task)
    config = ModelConfig(repository=str(demos), name=spec.name, version=VERSION, task=task, precision="bf16")
    model = resolve_model(config)
    tokenizer = TextTokenizer(model.tokenizer_file, model.manifest.input.max_tokens)
    texts = ["how do cats purr", "Cats purr by vibrating the larynx, and also when stressed.", "purr"]
    sequences = list(tokenizer.encode(texts, truncate=True).sequences())
    want = create_runner(model, "cpu", graph="eager").run(sequences).values
    got = create_runner(model, "cpu", graph="trace").run(sequences).values
    assert got.shape == want.shape
    if task == "sparse_embed":
        assert float(row_cosines(want, got).min()) >= 0.999
    else:
        np.testing.assert_allclose(got, want, atol=5e-2 * max(1.0, float(np.abs(want).max())))
