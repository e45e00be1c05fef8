"""The causal-LM builder: tokenizer and models built offline (tiny sizes here), checked, tamper-checked."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from deployments.repository.manifest import ManifestError, load_manifest
from deployments.repository.weights_check import check_weights
from deployments.tools import demo_lm
from deployments.tools.demo_lm import DEMOS, FILES, GPT2_SMALL, VERSION, LMSpec, build, stale_reason
from deployments.tools.demo_models import NOTICE

# The demos' architectures at a fraction of their size: the same code paths in well under a second.
TINY = tuple(
    dataclasses.replace(spec, vocab=384, hidden=32, positions=64, intermediate=spec.intermediate and 64)
    for spec in DEMOS
)
TEXTS = ["Hello, world! The quick brown fox.", "naïve café 東京", "tabs\tand\nnewlines  twice", "🚀 ok"]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
CHATML = (
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("lm-repo")
    for spec in TINY:
        assert build(spec, repo).startswith(f"built {spec.name} v1 (new): {spec.arch}")
    return repo


def _dir(repo: Path, spec: LMSpec) -> Path:
    return repo / spec.name / VERSION


def _copy(repository: Path, spec: LMSpec, tmp_path: Path) -> Path:
    shutil.copytree(_dir(repository, spec), _dir(tmp_path, spec))
    return _dir(tmp_path, spec)


def test_the_demos_and_the_bench_preset_have_the_asked_shapes():
    names = [(s.name, s.arch) for s in DEMOS]
    assert names == [("demo-gpt2-lm", "gpt2"), ("demo-llama-lm", "llama")]
    assert all((s.layers, s.hidden, s.heads, s.positions, s.vocab) == (2, 128, 4, 512, 4096) for s in DEMOS)
    llama = DEMOS[1]
    assert llama.config_fields()["num_key_value_heads"] == 2 and llama.intermediate == 256
    small = GPT2_SMALL.config_fields()
    assert (small["n_layer"], small["n_embd"], small["n_head"], small["n_positions"]) == (12, 768, 12, 1024)
    assert GPT2_SMALL not in demo_lm.PRESETS["demos"]


@pytest.mark.parametrize("spec", TINY, ids=lambda s: s.name)
def test_a_built_model_passes_the_manifest_and_weights_check(repository: Path, spec: LMSpec):
    path = _dir(repository, spec) / "manifest.json"
    manifest = load_manifest(path)
    check_weights(manifest, path.parent, path, hash_files=True)
    assert (manifest.task, manifest.chat_template, manifest.input.max_tokens) == ("generate", True, 64)
    assert manifest.output.dimension is None and manifest.output.labels is None
    assert sorted(manifest.files) == sorted(FILES)
    assert NOTICE in (path.parent / "README.md").read_text().lower()
    generation = json.loads((path.parent / "generation_config.json").read_text())
    assert (generation["eos_token_id"], generation["pad_token_id"], generation["do_sample"]) == (0, 0, False)
    assert stale_reason(spec, path.parent) is None
    assert build(spec, repository).startswith(f"kept  {spec.name} v1")


@pytest.mark.parametrize("file", ["model.safetensors", "tokenizer.json"])
def test_a_tampered_file_is_rebuilt_to_the_same_bytes(repository: Path, tmp_path: Path, file: str):
    spec = TINY[0]
    target = _copy(repository, spec, tmp_path)
    before = (target / "manifest.json").read_text()
    with (target / file).open("ab") as fh:
        fh.write(b" ")
    assert f"files.{file}" in (stale_reason(spec, target) or "")
    assert build(spec, tmp_path).startswith(f"built {spec.name} v1 (rebuilt: ")
    assert (target / "manifest.json").read_text() == before  # deterministic: same seed, same text


def test_a_changed_spec_makes_the_build_stale(repository: Path):
    spec = TINY[1]
    reason = stale_reason(dataclasses.replace(spec, kv_heads=4), _dir(repository, spec))
    assert "num_key_value_heads differs" in (reason or "")


def test_a_manifest_that_denies_the_chat_template_is_refused(repository: Path, tmp_path: Path):
    target = _copy(repository, TINY[0], tmp_path)
    path = target / "manifest.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"chat_template": False}))
    with pytest.raises(ManifestError) as info:
        check_weights(load_manifest(path), target, path, hash_files=True)
    assert info.value.field == "chat_template"
    assert "manifest field 'chat_template'" in (stale_reason(TINY[0], target) or "")


def test_the_tokenizer_round_trips_text_and_renders_chatml(repository: Path):
    tokenizer = AutoTokenizer.from_pretrained(_dir(repository, TINY[0]))
    assert len(tokenizer) == 384
    assert tokenizer.eos_token == tokenizer.pad_token == tokenizer.bos_token == "<|endoftext|>"
    assert (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])) == (
        0,
        [1, 2],
    )
    for text in TEXTS:
        assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False) == CHATML
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)["input_ids"]
    assert ids == tokenizer.encode(CHATML) and ids.count(1) == 3 and ids.count(2) == 2
    # Both demos share one tokenizer, trained once.
    assert (_dir(repository, TINY[0]) / "tokenizer.json").read_bytes() == (
        _dir(repository, TINY[1]) / "tokenizer.json"
    ).read_bytes()


@pytest.mark.parametrize("spec", TINY, ids=lambda s: s.name)
def test_each_model_loads_and_generates_greedily(repository: Path, spec: LMSpec):
    target = _dir(repository, spec)
    model = AutoModelForCausalLM.from_pretrained(target).eval()
    tokenizer = AutoTokenizer.from_pretrained(target)
    assert model.dtype == torch.float32 and model.config.model_type == spec.arch
    assert demo_lm.parameter_count(target / "model.safetensors") == sum(p.numel() for p in model.parameters())
    if spec.arch == "llama":
        assert model.config.num_key_value_heads == 2 < model.config.num_attention_heads
    inputs = tokenizer(["The quick brown fox"], return_tensors="pt")
    n = inputs["input_ids"].shape[1]
    first = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert n < first.shape[1] <= n + 5
    assert torch.equal(first, model.generate(**inputs, max_new_tokens=5, do_sample=False))


def test_a_vocabulary_the_text_cannot_reach_is_an_error():
    with pytest.raises(ValueError, match="reaches a vocabulary of"):
        demo_lm.train_tokenizer(100_000, "pydoc")


def test_the_cli_builds_the_preset_and_keeps_it(
    repository: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.setitem(demo_lm.PRESETS, "demos", TINY)
    assert demo_lm.main(["--repository", str(repository)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [["kept", s.name] for s in TINY]
    assert all("parameters" in line for line in lines)
