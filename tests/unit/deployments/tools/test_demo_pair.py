"""The speculative-decoding pair's builder: its corpus and prompts, a tiny build (2 steps, tiny shapes)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from deployments.repository.manifest import load_manifest
from deployments.repository.weights_check import check_weights
from deployments.tools import demo_pair
from deployments.tools.demo_lm import FILES, LMSpec
from deployments.tools.demo_pair import DRAFT, PAIR, TARGET, Recipe, build, corpus, prompts, stale_reason
from deployments.tools.demo_pair_corpus import KINDS_OF_DOC, chat, documents, world

TINY = (
    dataclasses.replace(TARGET, vocab=384, hidden=32, heads=2, positions=64, layers=2),
    dataclasses.replace(DRAFT, vocab=384, hidden=16, heads=2, positions=64, layers=1),
)
TINY_RECIPE = Recipe(steps=2, draft_steps=2, batch=2, seq=32, documents=300, eval_prompts=2, eval_tokens=8)
MESSAGES = [{"role": "user", "content": "Count from 3 to 9:"}]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, list[str]]:
    repo = tmp_path_factory.mktemp("pair-repo")
    lines: list[str] = []
    result = build(repo, recipe=TINY_RECIPE, specs=TINY, log=lines.append)
    return repo, result, lines


def _dir(repo: Path, spec: LMSpec) -> Path:
    return repo / spec.name / "1"


def test_the_corpus_and_the_prompts_are_deterministic_for_a_seed():
    assert corpus(60, 3) == corpus(60, 3) != corpus(60, 4)
    assert prompts(60, 3) == prompts(60, 3) != prompts(60, 4)
    # A prompt is the user's turn of the chat the same seed draws; the assistant's reply follows it.
    assert all(
        t.startswith(chat(p)) and t.endswith("<|im_end|>\n") and len(t) > len(chat(p)) + len("<|im_end|>\n")
        for t, p in zip(corpus(60, 3), prompts(60, 3), strict=True)
    )
    assert chat("hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert {doc.kind for doc in documents(300, 1)} == {kind for kind, _, _ in KINDS_OF_DOC}
    assert world() == world() and len({e.name for e in world()[0]}) == len(world()[0])


def test_an_answer_follows_from_its_prompt():
    docs = documents(300, 5)
    count = next(d for d in docs if d.kind == "count")
    first, last = (int(n) for n in count.prompt.removeprefix("Count from ").rstrip(".").split(" to "))
    assert count.answer == " ".join(str(i) for i in range(first, last + 1)) + "."
    facts = next(d for d in docs if d.kind == "facts")
    entity = next(e for e in world()[0] if facts.prompt == f"Fact sheet: {e.name}")
    assert facts.answer.startswith(f"{entity.name} is a{'n' * (entity.color[0] in 'aeiou')} {entity.color}")
    motto = next(d for d in docs if d.kind == "motto")
    entity = next(e for e in world()[0] if motto.prompt == f"The motto of {e.name}, three times.")
    assert motto.answer == "\n".join([f"{entity.motto}."] * 3)
    assert facts.text == f"{chat(facts.prompt)}{facts.answer}<|im_end|>\n"


def test_the_default_pair_is_a_deep_target_and_a_small_draft():
    assert (TARGET.name, DRAFT.name) == ("demo-spec-target", "demo-spec-draft") and PAIR == (TARGET, DRAFT)
    assert (TARGET.arch, TARGET.layers, TARGET.hidden, TARGET.positions) == ("gpt2", 8, 512, 512)
    assert (DRAFT.arch, DRAFT.layers, DRAFT.hidden, DRAFT.positions) == ("gpt2", 2, 128, 512)
    assert TARGET.vocab == DRAFT.vocab


def test_a_tiny_build_writes_two_models_whose_manifests_load(built: tuple[Path, dict, list[str]]):
    repo, result, lines = built
    assert result["built"] is True
    for spec, role in zip(TINY, ("target", "draft"), strict=True):
        path = _dir(repo, spec) / "manifest.json"
        manifest = load_manifest(path)
        check_weights(manifest, path.parent, path, hash_files=True)
        assert (manifest.name, manifest.version, manifest.task) == (spec.name, "1", "generate")
        assert manifest.chat_template and manifest.input.max_tokens == 64
        assert sorted(manifest.files) == sorted(FILES)
        assert stale_reason(spec, path.parent, TINY_RECIPE, role) is None
        config = json.loads((path.parent / "config.json").read_text())
        assert config["demo_pair"] == TINY_RECIPE.record(role)
    assert [line.split()[:2] for line in lines if line.startswith("built")] == [
        ["built", s.name] for s in TINY
    ]


def test_the_models_load_with_transformers_and_share_a_tokenizer(built: tuple[Path, dict, list[str]]):
    repo, _, _ = built
    target, draft = (_dir(repo, spec) for spec in TINY)
    assert (target / "tokenizer.json").read_bytes() == (draft / "tokenizer.json").read_bytes()
    tokenizers = [AutoTokenizer.from_pretrained(d) for d in (target, draft)]
    for tokenizer in tokenizers:
        assert len(tokenizer) == 384 and tokenizer.eos_token_id == tokenizer.pad_token_id == 0
        assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]
    text = prompts(1, 9)[0]
    assert tokenizers[0].encode(text) == tokenizers[1].encode(text)
    # The service renders a chat request with the template: exactly the chats the pair was trained on.
    rendered = tokenizers[0].apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert rendered == chat(MESSAGES[0]["content"])
    ids = tokenizers[0].encode(rendered)
    assert ids[0] == 1 and ids.count(1) == 2 and ids.count(2) == 1  # the markers are one token each
    inputs = tokenizers[0](text, return_tensors="pt")
    n = inputs["input_ids"].shape[1]
    for d, spec in zip((target, draft), TINY, strict=True):
        model = AutoModelForCausalLM.from_pretrained(d).eval()
        assert model.dtype == torch.float32 and model.config.model_type == "gpt2"
        assert (model.config.n_layer, model.config.n_embd) == (spec.layers, spec.hidden)
        assert model.generation_config.eos_token_id == [0, 2]  # a reply ends at <|im_end|>
        out = model.generate(**inputs, max_new_tokens=4, do_sample=False)
        assert n < out.shape[1] <= n + 4


def test_the_build_reports_losses_agreement_and_step_times(built: tuple[Path, dict, list[str]]):
    _, result, lines = built
    assert len(result["params"]) == 2 and result["params"][0] > result["params"][1]
    assert all(math.isfinite(loss) for loss in result["loss"])
    assert 0.0 <= result["agreement"] <= 1.0
    assert all(ms > 0 for ms in result["step_ms"])
    assert any(line.startswith("greedy agreement: ") for line in lines)
    assert any(line.startswith("decode step, batch 1, KV cache: target ") for line in lines)


def test_a_current_pair_is_kept_and_a_changed_recipe_is_stale(built: tuple[Path, dict, list[str]]):
    repo, _, _ = built
    lines: list[str] = []
    assert build(repo, recipe=TINY_RECIPE, specs=TINY, log=lines.append) == {"built": False}
    assert [line.split()[:2] for line in lines] == [["kept", s.name] for s in TINY]
    reason = stale_reason(TINY[0], _dir(repo, TINY[0]), dataclasses.replace(TINY_RECIPE, steps=3), "target")
    assert "demo_pair differs" in (reason or "")


def test_the_cli_maps_steps_onto_the_recipe(
    built: tuple[Path, dict, list[str]], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    repo, _, _ = built
    monkeypatch.setattr(demo_pair, "PAIR", TINY)
    monkeypatch.setattr(demo_pair, "DEFAULT", dataclasses.replace(TINY_RECIPE, steps=4, draft_steps=4))
    # --steps 2 scales the draft's steps alike (4 -> 2): the tiny build, which checks out.
    assert demo_pair.main(["--repository", str(repo), "--steps", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [["kept", s.name] for s in TINY]


def test_a_pair_must_share_a_vocabulary(tmp_path: Path):
    with pytest.raises(ValueError, match="one vocabulary"):
        build(tmp_path, recipe=TINY_RECIPE, specs=(TINY[0], dataclasses.replace(TINY[1], vocab=512)))
