"""Linear weights packed once for oneDNN (deployments/runtime/packed_linear.py): the same products as
``nn.Linear`` in fp32 and bf16, scripted or not; every linear layer swapped (GPT-2's ``Conv1D`` and tied
weights included) with the model's numbers unchanged; packed only where each caller packs (generation:
fp32, encoders: bf16, a CPU); and, for an encoder, checked at start against the model as loaded, so a
packing that changed its outputs would refuse to start."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.pytorch_utils import Conv1D

from deployments.config import ModelConfig
from deployments.repository.resolve import resolve_model
from deployments.runtime import torch_graph
from deployments.runtime.backends import create_runner
from deployments.runtime.packed_linear import PackedLinear, pack_linears, packs
from deployments.runtime.torch_graph import TraceMismatchError, traced_head
from deployments.runtime.torch_runner import ENCODER_PACKS
from deployments.tools.demo_models import DEMOS, VERSION, build
from preprocess.tokenize import TextTokenizer
from tests.support.vectors import row_cosines
from tests.unit.deployments.runtime.generate_support import (  # noqa: F401 - fixtures
    gpt2,
    llama,
    one_thread,
    packed_copy,
    prompt,
)

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(
    not packs(CPU, torch.float32, (torch.float32,)), reason="this torch has no oneDNN linear op to pack for"
)


@pytest.mark.parametrize("script", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_a_packed_layer_is_a_linear_on_any_leading_shape(
    bias: bool, dtype: torch.dtype, script: bool
) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(48, 96, bias=bias).to(dtype)
    layer = PackedLinear(linear.weight, linear.bias)
    packed = torch.jit.script(layer) if script else layer
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for shape in [(1, 48), (7, 48), (3, 7, 48), (2, 1, 48), (300, 48)]:
        x = torch.randn(*shape).to(dtype)
        with torch.inference_mode():
            want, got = linear(x), packed(x)
        assert got.shape == want.shape and got.dtype == dtype
        torch.testing.assert_close(got.float(), want.float(), atol=tolerance, rtol=tolerance)


def _linears(model: nn.Module) -> int:
    return sum(isinstance(m, nn.Linear | Conv1D) for m in model.modules())


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_every_linear_layer_of_a_causal_lm_is_swapped_and_the_logits_agree(
    arch: str, request: pytest.FixtureRequest
) -> None:
    model: PreTrainedModel = request.getfixturevalue(arch)
    before = _linears(model)
    packed = packed_copy(model)
    assert before > 0 and _linears(packed) == 0
    assert sum(isinstance(m, PackedLinear) for m in packed.modules()) == before
    ids = torch.tensor([prompt(40, seed=5), prompt(40, seed=6)])
    with torch.inference_mode():
        want = model(input_ids=ids).logits
        got = packed(input_ids=ids).logits
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert _linears(model) == before  # the original is untouched


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
    assert pack_linears(model, script=True) == 2
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert torch.equal(model.embed.weight, embedding)
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).float(), want.float(), atol=5e-2, rtol=2e-2)


def test_each_caller_packs_its_precision_on_a_cpu_only() -> None:
    generation = (torch.float32,)
    assert packs(CPU, torch.float32, generation) and not packs(CPU, torch.bfloat16, generation)
    assert packs(CPU, torch.bfloat16, ENCODER_PACKS) and not packs(CPU, torch.float32, ENCODER_PACKS)
    assert not packs(torch.device("cuda"), torch.bfloat16, ENCODER_PACKS)
    assert not packs(torch.device("cuda"), torch.float32, generation)


def test_a_generate_model_in_bf16_loads_unpacked(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Generation packs fp32 only: a bf16 causal LM runs as loaded, whatever packed_weights says."""
    from types import SimpleNamespace

    from deployments.runtime.generate.load import load_causal_lm

    request.getfixturevalue("gpt2").save_pretrained(tmp_path)
    for precision, linears in (("bf16", True), ("fp32", False)):
        model = SimpleNamespace(
            weights_dir=tmp_path, precision=precision, manifest=SimpleNamespace(name="tiny-gpt2")
        )
        lm = load_causal_lm(model, "cpu", packed=True)  # type: ignore[arg-type]
        assert (_linears(lm) > 0) == linears


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

    def corrupting(module: torch.nn.Module, script: bool = False) -> int:
        first = next(m for m in module.modules() if isinstance(m, torch.nn.Linear))
        with torch.no_grad():
            first.weight.mul_(2.0)
        return 1

    monkeypatch.setattr(torch_graph, "pack_linears", corrupting)
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
