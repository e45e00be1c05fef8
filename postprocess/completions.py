"""OpenAI ``/v1/completions`` and ``/v1/chat/completions`` bodies, whole and streamed (server-sent events).

Shapes follow what the official ``openai`` client parses (``Completion``, ``ChatCompletion``,
``ChatCompletionChunk``); a streamed text completion's chunks are ``Completion`` objects too.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from contracts.outputs import FinishReason, Usage

DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True, slots=True)
class CompletionMeta:
    """What every body and chunk of one completion repeats. ``chat``: a chat completion."""

    id: str
    model: str
    created: int  # unix seconds, the same in every chunk
    chat: bool

    @classmethod
    def new(cls, model: str, chat: bool, created: int | None = None) -> CompletionMeta:
        """A fresh id (``chatcmpl-…`` / ``cmpl-…``, as OpenAI names them), created now unless given."""
        prefix = "chatcmpl-" if chat else "cmpl-"
        return cls(
            id=prefix + uuid.uuid4().hex,
            model=model,
            created=int(time.time()) if created is None else created,
            chat=chat,
        )

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    @property
    def chunk_object(self) -> str:
        # A streamed text completion's chunks are whole ``text_completion`` objects; chat has its own.
        return "chat.completion.chunk" if self.chat else "text_completion"


def _envelope(meta: CompletionMeta, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": meta.id,
        "object": obj,
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": None,
        "choices": choices,
    }


def completion_payload(
    meta: CompletionMeta, text: str, finish_reason: FinishReason, usage: Usage
) -> dict[str, Any]:
    """The whole (non-streamed) response as a dict, one choice."""
    choice: dict[str, Any] = {"index": 0}
    if meta.chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    choice["logprobs"] = None
    choice["finish_reason"] = finish_reason
    body = _envelope(meta, meta.object, [choice])
    body["usage"] = usage.as_dict()
    return body


def completion_body(meta: CompletionMeta, text: str, finish_reason: FinishReason, usage: Usage) -> bytes:
    """The whole (non-streamed) response body."""
    return orjson.dumps(completion_payload(meta, text, finish_reason, usage))


def sse(payload: dict[str, Any]) -> bytes:
    """One server-sent event: a ``data:`` line of compact JSON (never holds a newline) and a blank line."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def chunk_payload(
    meta: CompletionMeta, text: str | None, finish_reason: FinishReason | None, first: bool
) -> dict[str, Any]:
    """One streamed chunk as a dict. Chat: the first chunk's delta names the role (content ``text`` or
    ""), later ones carry ``{"content": text}``, and the last, with ``finish_reason``, ``{}`` when
    ``text`` is None. Text completions: ``text`` ("" when None); ``first`` is ignored."""
    choice: dict[str, Any] = {"index": 0}
    if meta.chat:
        delta: dict[str, str] = {}
        if first:
            delta["role"] = "assistant"
            delta["content"] = text or ""
        elif text is not None:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    choice["logprobs"] = None
    choice["finish_reason"] = finish_reason
    return _envelope(meta, meta.chunk_object, [choice])


def chunk(meta: CompletionMeta, text: str | None, finish_reason: FinishReason | None, first: bool) -> bytes:
    """One streamed chunk as an SSE frame."""
    return sse(chunk_payload(meta, text, finish_reason, first))


def usage_chunk(meta: CompletionMeta, usage: Usage) -> bytes:
    """The last chunk before ``DONE`` when ``stream_options.include_usage``: no choices, the usage."""
    payload = _envelope(meta, meta.chunk_object, [])
    payload["usage"] = usage.as_dict()
    return sse(payload)


def error_event(code: str, message: str, error_type: str = "server_error") -> bytes:
    """An error inside a stream that already started (its HTTP status is sent): the body an error
    response would hold, as an event. The ``openai`` client raises ``APIError`` with ``message``."""
    return sse({"error": {"message": message, "type": error_type, "code": code}})
