"""oneDNN packed linear layers (deployments/runtime/generate/packed.py): what is swapped, and that the
model computes the same numbers (to fp32 rounding) through them."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.pytorch_utils import Conv1D

from deployments.runtime.generate.packed import PackedLinear, pack_linears, packable
from tests.unit.deployments.runtime.generate_support import (  # noqa: F401 - fixtures
    gpt2,
    llama,
    one_thread,
    packed_copy,
    prompt,
)


def _linears(model: nn.Module) -> int:
    return sum(isinstance(m, nn.Linear | Conv1D) for m in model.modules())


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_every_linear_layer_is_swapped_and_the_logits_agree(
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


def test_a_packed_layer_is_a_linear_on_any_leading_shape() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(24, 40)
    layer = PackedLinear(linear.weight, linear.bias)
    for shape in [(1, 24), (7, 24), (2, 3, 24), (300, 24)]:
        x = torch.randn(shape)
        with torch.inference_mode():
            torch.testing.assert_close(layer(x), linear(x), rtol=1e-5, atol=1e-5)
    no_bias = nn.Linear(24, 8, bias=False)
    x = torch.randn(5, 24)
    with torch.inference_mode():
        torch.testing.assert_close(PackedLinear(no_bias.weight, None)(x), no_bias(x), rtol=1e-5, atol=1e-5)


def test_other_precisions_are_left_as_loaded() -> None:
    model = nn.Sequential(nn.Linear(8, 8)).to(torch.bfloat16)
    assert not packable(model)
    assert pack_linears(model) == 0
    assert isinstance(model[0], nn.Linear)
