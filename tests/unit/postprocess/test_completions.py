"""OpenAI completion bodies and stream chunks, checked against the official ``openai`` client's types."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import orjson
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from postprocess.completions import (
    DONE,
    CompletionMeta,
    Usage,
    chunk,
    completion_body,
    error_event,
    sse,
    usage_chunk,
)

CHAT = CompletionMeta(id="chatcmpl-abc", model="tiny-gpt", created=1_700_000_000, chat=True)
TEXT = CompletionMeta(id="cmpl-abc", model="tiny-gpt", created=1_700_000_000, chat=False)
USAGE = Usage(prompt_tokens=7, completion_tokens=3)


def _frames(stream: bytes) -> list[bytes]:
    """The ``data:`` payloads of an SSE stream, each event a single data line ended by a blank line."""
    assert stream.endswith(b"\n\n")
    frames = []
    for event in stream[:-2].split(b"\n\n"):
        assert event.startswith(b"data: ") and b"\n" not in event
        frames.append(event[len(b"data: ") :])
    return frames


def _client(body: bytes, content_type: str = "text/event-stream") -> openai.OpenAI:
    """An ``openai`` client whose every request gets ``body`` back, no network."""

    def answer(_: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": content_type})

    return openai.OpenAI(
        api_key="unused",
        base_url="http://test/v1",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(answer)),
    )


def _chat_stream(pieces: list[str], finish: str = "stop", usage: bool = False) -> bytes:
    out = [chunk(CHAT, None, None, first=True)]
    out += [chunk(CHAT, p, None, first=False) for p in pieces]
    out.append(chunk(CHAT, None, finish, first=False))  # type: ignore[arg-type]
    if usage:
        out.append(usage_chunk(CHAT, USAGE))
    out.append(DONE)
    return b"".join(out)


def _text_stream(pieces: list[str], finish: str = "length", usage: bool = False) -> bytes:
    out = [chunk(TEXT, p, None, first=i == 0) for i, p in enumerate(pieces)]
    out.append(chunk(TEXT, "", finish, first=False))  # type: ignore[arg-type]
    if usage:
        out.append(usage_chunk(TEXT, USAGE))
    out.append(DONE)
    return b"".join(out)


def test_usage() -> None:
    assert USAGE.total_tokens == 10
    assert USAGE.as_dict() == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


def test_meta_new() -> None:
    chat = CompletionMeta.new("m", chat=True)
    text = CompletionMeta.new("m", chat=False, created=5)
    assert chat.id.startswith("chatcmpl-") and text.id.startswith("cmpl-") and chat.id[9:] != text.id[5:]
    assert text.created == 5 and chat.created > 1_600_000_000
    assert (chat.object, chat.chunk_object) == ("chat.completion", "chat.completion.chunk")
    assert (text.object, text.chunk_object) == ("text_completion", "text_completion")


def test_text_completion_body() -> None:
    raw = orjson.loads(completion_body(TEXT, "Hello there", "length", USAGE))
    parsed = Completion.model_validate(raw)
    assert parsed.id == "cmpl-abc" and parsed.object == "text_completion" and parsed.model == "tiny-gpt"
    assert parsed.created == 1_700_000_000
    (choice,) = parsed.choices
    assert (choice.index, choice.text, choice.finish_reason) == (0, "Hello there", "length")
    assert raw["choices"][0]["logprobs"] is None
    assert parsed.usage is not None and parsed.usage.model_dump(exclude_none=True) == USAGE.as_dict()


def test_chat_completion_body() -> None:
    parsed = ChatCompletion.model_validate(orjson.loads(completion_body(CHAT, "Hi! 🎉", "stop", USAGE)))
    assert parsed.object == "chat.completion" and parsed.id == "chatcmpl-abc"
    (choice,) = parsed.choices
    assert (choice.index, choice.finish_reason) == (0, "stop")
    assert (choice.message.role, choice.message.content) == ("assistant", "Hi! 🎉")
    assert parsed.usage is not None and parsed.usage.total_tokens == 10


def test_bodies_through_the_client() -> None:
    client = _client(completion_body(CHAT, "Hi", "stop", USAGE), "application/json")
    answer = client.chat.completions.create(model="tiny-gpt", messages=[{"role": "user", "content": "x"}])
    assert answer.choices[0].message.content == "Hi" and answer.usage and answer.usage.prompt_tokens == 7
    client = _client(completion_body(TEXT, "Hello", "length", USAGE), "application/json")
    text = client.completions.create(model="tiny-gpt", prompt="x")
    assert text.choices[0].text == "Hello" and text.choices[0].finish_reason == "length"


def test_sse_frame() -> None:
    frame = sse({"a": "line\nbreak", "b": None})
    assert frame == b'data: {"a":"line\\nbreak","b":null}\n\n'
    assert DONE == b"data: [DONE]\n\n"


def test_chat_chunks_parse() -> None:
    frames = _frames(_chat_stream(["Hel", "lo ✓"], usage=True))
    assert frames[-1] == b"[DONE]"
    chunks = [ChatCompletionChunk.model_validate(orjson.loads(f)) for f in frames[:-1]]
    first, *middle, last, usage = chunks
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    assert [c.choices[0].delta.content for c in middle] == ["Hel", "lo ✓"]
    assert all(c.choices[0].finish_reason is None for c in (first, *middle))
    assert last.choices[0].finish_reason == "stop"
    assert orjson.loads(frames[-3])["choices"][0]["delta"] == {}
    assert usage.choices == [] and usage.usage is not None and usage.usage.completion_tokens == 3
    assert {c.id for c in chunks} == {"chatcmpl-abc"} and {c.created for c in chunks} == {1_700_000_000}
    assert {c.object for c in chunks} == {"chat.completion.chunk"}


def test_first_chat_chunk_may_carry_text() -> None:
    raw = orjson.loads(_frames(chunk(CHAT, "Hi", None, first=True))[0])
    assert raw["choices"][0]["delta"] == {"role": "assistant", "content": "Hi"}


def test_text_chunks_parse() -> None:
    frames = _frames(_text_stream(["Hel", "lo"], usage=True))[:-1]
    raws = [orjson.loads(f) for f in frames]
    assert [r["choices"][0]["text"] for r in raws[:-1]] == ["Hel", "lo", ""]
    assert [r["choices"][0]["finish_reason"] for r in raws[:-1]] == [None, None, "length"]
    # Intermediate chunks hold finish_reason null, which the client reads without strict validation;
    # the final chunk and the usage chunk are valid ``Completion`` objects.
    for raw in raws[-2:]:
        parsed = Completion.model_validate(raw)
        assert parsed.object == "text_completion" and parsed.id == "cmpl-abc"
    assert Completion.model_validate(raws[-1]).usage.total_tokens == 10  # type: ignore[union-attr]


def test_chat_stream_through_the_client() -> None:
    client = _client(_chat_stream(["Bon", "jour ", "🎉"], finish="length", usage=True))
    stream = client.chat.completions.create(
        model="tiny-gpt",
        messages=[{"role": "user", "content": "x"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Bonjour 🎉"
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 10


def test_chat_stream_helper_accumulates() -> None:
    client = _client(_chat_stream(["Bon", "jour"], usage=True))
    with client.chat.completions.stream(model="tiny-gpt", messages=[{"role": "user", "content": "x"}]) as s:
        final = s.get_final_completion()
    assert final.choices[0].message.content == "Bonjour" and final.choices[0].finish_reason == "stop"
    assert final.usage is not None and final.usage.prompt_tokens == 7


def test_text_stream_through_the_client() -> None:
    client = _client(_text_stream(["Once", " upon"], usage=True))
    chunks = list(client.completions.create(model="tiny-gpt", prompt="x", stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "Once upon"
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None


def test_error_event() -> None:
    event = error_event("internal_error", "the model replica went away")
    (frame,) = _frames(event)
    assert orjson.loads(frame) == {
        "error": {"message": "the model replica went away", "type": "server_error", "code": "internal_error"}
    }
    typed: dict[str, Any] = orjson.loads(
        _frames(error_event("x", "y", error_type="invalid_request_error"))[0]
    )
    assert typed["error"]["type"] == "invalid_request_error"


def test_error_event_raises_in_the_client() -> None:
    body = chunk(CHAT, None, None, first=True) + chunk(CHAT, "partial", None, first=False)
    client = _client(body + error_event("unavailable", "replica died mid-stream"))
    stream = client.chat.completions.create(
        model="tiny-gpt", messages=[{"role": "user", "content": "x"}], stream=True
    )
    seen = []
    with pytest.raises(openai.APIError, match="replica died mid-stream") as info:
        for c in stream:
            seen.append(c.choices[0].delta.content)
    assert seen == ["", "partial"]
    assert isinstance(info.value.body, dict) and info.value.body["code"] == "unavailable"
