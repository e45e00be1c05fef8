"""Completions and chat completions: strict bodies, generation parameters and prompt token ids."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from contracts.errors import InputTooLongError, InvalidRequestError, UnsupportedTaskError
from preprocess.generation import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerationParams,
    PromptBuilder,
    chat_messages,
    generation_params,
)
from preprocess.parsing import parse_body

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
NO_SYSTEM = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ raise_exception('system messages are not supported') }}{% endif %}"
    "{{ message['content'] }}{% endfor %}"
)
USER = {"role": "user", "content": "hello"}


def completion(**body) -> CompletionRequest:
    return parse_body(orjson.dumps({"prompt": "hi", **body}), "application/json", CompletionRequest)


def chat(**body) -> ChatCompletionRequest:
    body = {"messages": [USER], **body}
    return parse_body(orjson.dumps(body), "application/json", ChatCompletionRequest)


def rejected(make, **body) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        make(**body)
    return info.value


# --- request bodies -----------------------------------------------------------------------------------


def test_defaults():
    req = completion()
    assert (req.temperature, req.top_p, req.stream, req.stop, req.max_tokens) == (1.0, 1.0, False, None, None)
    assert req.prompt_text == "hi" and req.prompt_token_ids is None


@pytest.mark.parametrize(("value", "expected"), [(0, 0.0), (1, 1.0), (0.7, 0.7), (2, 2.0)])
def test_temperature_accepts_json_ints(value, expected):
    req = completion(temperature=value, top_p=1)
    assert req.temperature == expected and isinstance(req.temperature, float)
    assert req.top_p == 1.0


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", "0.5"), ("temperature", True), ("temperature", 2.5), ("temperature", -1)],
)
def test_temperature_rejects_strings_bools_and_out_of_range(field, value):
    assert rejected(completion, **{field: value}).param == field


@pytest.mark.parametrize("value", [0, 0.0, 1.5, -0.1])
def test_top_p_range(value):
    assert rejected(completion, top_p=value).param == "top_p"


def test_n_other_than_one_names_n():
    err = rejected(completion, n=2)
    assert err.param == "n" and "n=1" in err.message
    assert completion(n=1).n == 1
    assert completion(n=None).n is None
    assert rejected(chat, n=3).param == "n"


@pytest.mark.parametrize(
    ("field", "off", "on"),
    [
        ("logit_bias", {}, {"50256": -100}),
        ("presence_penalty", 0, 0.5),
        ("frequency_penalty", 0.0, 1),
        ("logprobs", 0, 5),
        ("echo", False, True),
        ("best_of", 1, 2),
        ("suffix", None, "tail"),
    ],
)
def test_unsupported_openai_fields_only_when_off(field, off, on):
    completion(**{field: off})
    if field != "echo":
        completion(**{field: None})
    assert rejected(completion, **{field: on}).param == field


def test_chat_logprobs_and_user():
    chat(logprobs=False, top_logprobs=0, user="u-1")
    assert rejected(chat, logprobs=True).param == "logprobs"
    assert rejected(chat, top_logprobs=2).param == "top_logprobs"
    assert rejected(chat, echo=False).param == "echo"  # a completions-only field is unknown here


def test_stream_options():
    req = completion(stream=True, stream_options={"include_usage": True})
    assert req.stream_options is not None and req.stream_options.include_usage is True
    assert rejected(completion, stream_options={"include_usage": True}).param == "stream_options"
    assert rejected(completion, stream=True, stream_options={"usage": True}).param == "usage"
    assert completion(stream=False, stream_options=None).stream_options is None


def test_stop():
    assert completion(stop="\n").stop == "\n"
    assert completion(stop=["a", "b", "c", "d"]).stop == ["a", "b", "c", "d"]
    assert rejected(completion, stop=["a", "b", "c", "d", "e"]).param == "stop"
    assert rejected(completion, stop=["a", ""]).param == "stop[1]"
    assert rejected(completion, stop="").param == "stop"


def test_prompt_forms():
    assert completion(prompt=["one"]).prompt_text == "one"
    assert completion(prompt=[5, 6]).prompt_token_ids == [5, 6]
    assert completion(prompt=[[5, 6]]).prompt_token_ids == [5, 6]
    err = rejected(completion, prompt=["a", "b"])
    assert err.param == "prompt" and "one prompt" in err.message
    assert rejected(completion, prompt=[[1], [2]]).param == "prompt"
    for bad in ("", [], [-1], [1.5]):
        assert rejected(completion, prompt=bad).param.startswith("prompt")


def test_max_tokens_must_be_positive():
    assert rejected(completion, max_tokens=0).param == "max_tokens"


def test_unknown_field():
    err = rejected(chat, tools=[])
    assert err.param == "tools" and "unknown field" in err.message


def test_messages():
    req = chat(
        messages=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "ok", "name": "bot"},
        ]
    )
    assert chat_messages(req) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "ok", "name": "bot"},
    ]


def test_messages_rejected():
    assert rejected(chat, messages=[]).param == "messages"
    image = {"type": "image_url", "image_url": {"url": "https://x/y.png"}}
    err = rejected(chat, messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, image]}])
    assert err.param == "messages[0].content[1]" and "image_url" in err.message
    err = rejected(chat, messages=[USER, {"role": "tool", "content": "42", "tool_call_id": "c"}])
    assert err.param == "messages[1].role"
    assert rejected(chat, messages=[{"role": "user"}]).param.startswith("messages")
    assert rejected(chat, messages=[{"role": "user", "content": []}]).param.startswith("messages")


def test_chat_max_tokens_aliases():
    assert chat(max_completion_tokens=5).requested_max_tokens == (5, "max_completion_tokens")
    assert chat(max_tokens=5).requested_max_tokens == (5, "max_tokens")
    assert chat(max_tokens=5, max_completion_tokens=5).requested_max_tokens[0] == 5
    assert rejected(chat, max_tokens=5, max_completion_tokens=6).param == "max_completion_tokens"


# --- generation parameters ----------------------------------------------------------------------------

LIMITS = {"default_max_tokens": 256, "max_tokens_cap": 1024, "context_tokens": 2048}


def test_params():
    req = completion(
        max_tokens=10, temperature=0, top_p=0.5, seed=7, stop="x", stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    params = generation_params(req, prompt_tokens=5, **LIMITS)
    assert params == GenerationParams(10, 0.0, 0.5, 7, ("x",), True, True)
    assert generation_params(completion(stop=["a", "b"]), prompt_tokens=5, **LIMITS).stop == ("a", "b")
    plain = generation_params(completion(), prompt_tokens=5, **LIMITS)
    assert (plain.stop, plain.stream, plain.include_usage, plain.seed) == ((), False, False, None)


def test_default_max_tokens_clipped_to_room():
    assert generation_params(completion(), prompt_tokens=10, **LIMITS).max_new_tokens == 256
    assert generation_params(completion(), prompt_tokens=2000, **LIMITS).max_new_tokens == 48
    assert generation_params(chat(), prompt_tokens=2047, **LIMITS).max_new_tokens == 1


def test_max_tokens_over_cap():
    err = rejected(lambda: generation_params(completion(max_tokens=1025), prompt_tokens=5, **LIMITS))
    assert err.param == "max_tokens" and "1024" in err.message
    assert err.message == "max_tokens: at most 1024 new tokens per request (max_new_tokens), got 1025"
    ok = generation_params(completion(max_tokens=1024), prompt_tokens=5, **LIMITS)
    assert ok.max_new_tokens == 1024


def test_max_tokens_over_context_is_400_like_vllm():
    req = chat(max_completion_tokens=100)
    err = rejected(lambda: generation_params(req, prompt_tokens=1990, **LIMITS))
    assert not isinstance(err, InputTooLongError)
    assert err.param == "max_completion_tokens"
    assert all(str(n) in err.message for n in (1990, 100, 2048, 58))
    assert "context of 2048 tokens (max_context_tokens)" in err.message
    assert generation_params(req, prompt_tokens=1948, **LIMITS).max_new_tokens == 100


def test_prompt_filling_the_context():
    with pytest.raises(InputTooLongError) as info:
        generation_params(chat(), prompt_tokens=2048, **LIMITS)
    assert info.value.param == "messages" and "2048" in info.value.message
    assert "context of 2048 tokens (max_context_tokens)" in info.value.message
    with pytest.raises(InputTooLongError) as info:
        generation_params(completion(max_tokens=1), prompt_tokens=3000, **LIMITS)
    assert info.value.param == "prompt"


# --- prompts: a tiny byte-level BPE with ChatML specials ----------------------------------------------


def _save(directory: Path, tok: Tokenizer, chat_template: str | None, generation: dict | None = None) -> Path:
    directory.mkdir()
    tok.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **dict.fromkeys(("eos_token", "bos_token", "pad_token"), "<|endoftext|>"),
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    if generation is not None:
        (directory / "generation_config.json").write_text(json.dumps(generation))
    return directory


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, PromptBuilder]:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["hello world, the quick brown fox jumps over the lazy dog"] * 20, trainer)
    root = tmp_path_factory.mktemp("tiny")
    chatml = _save(root / "chatml", tok, CHATML)
    strict = _save(root / "strict", tok, NO_SYSTEM)
    tok.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", pair="<|endoftext|> $A $B", special_tokens=[("<|endoftext|>", 0)]
    )
    plain = _save(root / "plain", tok, None, generation={"eos_token_id": [2, 0, 2]})
    return {
        "chatml": PromptBuilder(chatml),
        "plain": PromptBuilder(plain, "tiny-base"),
        "strict": PromptBuilder(strict),
    }


def test_text_ids(tiny):
    chatml = tiny["chatml"]
    ids = chatml.text_ids("hello world")
    assert ids and all(isinstance(i, int) for i in ids)
    assert chatml._tok.decode(ids) == "hello world"  # no BOS: this tokenizer adds none
    assert tiny["plain"].text_ids("hello world") == [0, *ids]  # its post-processor adds one


def test_chat_ids(tiny):
    req = chat(messages=[{"role": "system", "content": "be brief"}, USER])
    ids = tiny["chatml"].prompt_ids(req)
    assert isinstance(ids, list) and all(type(i) is int for i in ids)
    text = tiny["chatml"]._tok.decode(ids)
    assert text == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    )
    assert ids[0] == SPECIALS.index("<|im_start|>")


def test_no_chat_template(tiny):
    assert not tiny["plain"].has_chat_template
    with pytest.raises(UnsupportedTaskError, match=r"tiny-base has no chat template: use /v1/completions"):
        tiny["plain"].prompt_ids(chat())
    assert tiny["plain"].prompt_ids(completion(prompt="hello"))[0] == 0


def test_template_error_is_400(tiny):
    with pytest.raises(InvalidRequestError, match="system messages are not supported") as info:
        tiny["strict"].chat_ids([{"role": "system", "content": "x"}])
    assert info.value.param == "messages"


def test_token_id_prompts(tiny):
    builder = tiny["chatml"]
    last = builder.vocab_size - 1
    assert 280 < builder.vocab_size <= 300
    assert builder.prompt_ids(completion(prompt=[1, 2, last])) == [1, 2, last]
    with pytest.raises(InvalidRequestError, match=f"0 to {last}") as info:
        builder.prompt_ids(completion(prompt=[5, last + 1]))
    assert info.value.param == "prompt"


def test_eos_token_ids(tiny):
    assert tiny["chatml"].eos_token_ids == (0,)  # the tokenizer's eos
    assert tiny["plain"].eos_token_ids == (2, 0)  # generation_config.json's list, deduplicated
