"""The input side of text generation (OpenAI ``/v1/completions`` and ``/v1/chat/completions``).

Strict request bodies, the sampling parameters that cross stages (``GenerationParams``) and the prompt's
token ids (``PromptBuilder``: the model's Hugging Face tokenizer and chat template). No Ray, no FastAPI.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from contracts.errors import InputTooLongError, InvalidRequestError, UnsupportedTaskError
from preprocess.limits import MAX_CONTEXT_TOKENS, MAX_NEW_TOKENS
from preprocess.schemas import Text, Texts, TokenIds, _StrictRequest

# Strict floats accept JSON ints (``"temperature": 0``) but not strings or booleans.
Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
Stop = Text | Annotated[list[Text], Field(max_length=4)]
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
_ROLES = ("system", "developer", "user", "assistant")


def _off(value: Any) -> bool:
    return not value  # null, false, 0, "" and {} all mean "not asked for"


class StreamOptions(_StrictRequest):
    include_usage: bool | None = Field(default=None, description="A last chunk with the token usage.")


class TextPart(_StrictRequest):
    type: Literal["text"]
    text: str


class ChatMessage(_StrictRequest):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | Annotated[list[TextPart], Field(min_length=1)]
    name: str | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class _GenerationRequest(_StrictRequest):
    """Fields both routes share. OpenAI's fields this server does not implement are accepted only at their
    "off" value (what clients send by default); any other value is a 400 naming the field."""

    PROMPT_FIELD: ClassVar[str] = "prompt"
    # field -> (accepted?, why not): checked after validation.
    ONLY: ClassVar[dict[str, tuple[Callable[[Any], bool], str]]] = {
        "n": (lambda v: v in (None, 1), "only n=1 is supported"),
        "logit_bias": (_off, "logit_bias is not supported (send null or {})"),
        "presence_penalty": (_off, "presence_penalty is not supported (send 0 or null)"),
        "frequency_penalty": (_off, "frequency_penalty is not supported (send 0 or null)"),
        "logprobs": (_off, "logprobs are not supported"),
    }

    model: str | None = Field(default=None, description="Served model name, optionally `name:version`.")
    max_tokens: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="New tokens at most; default: the server's default, clipped to the context."
    )
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    seed: Seed | None = None
    stop: Stop | None = Field(default=None, description="Up to 4 strings that end the generation.")
    n: int | None = Field(default=None, description="Only 1.")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, description="Accepted for OpenAI compatibility; unused.")
    logit_bias: dict[str, float] | None = Field(default=None, description="Only null or {}.")
    presence_penalty: float | None = Field(default=None, description="Only 0 or null.")
    frequency_penalty: float | None = Field(default=None, description="Only 0 or null.")
    logprobs: bool | int | None = Field(default=None, description="Only null, false or 0.")

    @model_validator(mode="after")
    def _unsupported_off(self) -> _GenerationRequest:
        for name, (accepted, why) in self.ONLY.items():
            if not accepted(getattr(self, name)):
                raise InvalidRequestError(f"{name}: {why}", name)
        if self.stream_options is not None and not self.stream:
            raise InvalidRequestError('stream_options: only allowed with "stream": true', "stream_options")
        return self

    @property
    def requested_max_tokens(self) -> tuple[int | None, str]:
        """The client's limit on new tokens and the field it came in."""
        return self.max_tokens, "max_tokens"


class CompletionRequest(_GenerationRequest):
    """OpenAI-compatible ``POST /v1/completions`` body: one prompt, as text or as token ids."""

    ONLY = {
        **_GenerationRequest.ONLY,
        "echo": (_off, "echo is not supported"),
        "best_of": (lambda v: v in (None, 1), "only best_of=1 is supported"),
        "suffix": (_off, "suffix is not supported"),
    }

    prompt: Text | Texts | TokenIds | Annotated[list[TokenIds], Field(min_length=1)] = Field(
        description="One prompt: a string, a list of one string, token ids or a list of one id list."
    )
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: Any) -> Any:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise InvalidRequestError(
                    f"prompt: only one prompt per request is supported, got {len(prompt)}", "prompt"
                )
            return prompt[0]
        return prompt

    @property
    def prompt_text(self) -> str | None:
        return self.prompt if isinstance(self.prompt, str) else None

    @property
    def prompt_token_ids(self) -> list[int] | None:
        return None if isinstance(self.prompt, str) else list(self.prompt)  # type: ignore[arg-type]


class ChatCompletionRequest(_GenerationRequest):
    """OpenAI-compatible ``POST /v1/chat/completions`` body: text messages only (no tools, no images)."""

    PROMPT_FIELD = "messages"
    ONLY = {**_GenerationRequest.ONLY, "top_logprobs": (_off, "logprobs are not supported")}

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="OpenAI's newer name for max_tokens."
    )
    top_logprobs: int | None = Field(default=None, description="Only null or 0.")

    @field_validator("messages", mode="before")
    @classmethod
    def _text_messages_only(cls, messages: Any) -> Any:
        """Clear 400s for what OpenAI allows and this server does not: tool messages and non-text parts."""
        if not isinstance(messages, list):
            return messages
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                continue
            role = message.get("role")
            if isinstance(role, str) and role not in _ROLES:
                raise InvalidRequestError(
                    f"messages[{i}].role: {role!r} is not supported; use {', '.join(_ROLES)}",
                    f"messages[{i}].role",
                )
            content = message.get("content")
            for j, part in enumerate(content if isinstance(content, list) else ()):
                kind = part.get("type") if isinstance(part, dict) else None
                if isinstance(kind, str) and kind != "text":
                    raise InvalidRequestError(
                        f"messages[{i}].content[{j}]: only text parts are supported, got {kind!r}",
                        f"messages[{i}].content[{j}]",
                    )
        return messages

    @model_validator(mode="after")
    def _one_max_tokens(self) -> ChatCompletionRequest:
        given = (self.max_tokens, self.max_completion_tokens)
        if None not in given and given[0] != given[1]:
            raise InvalidRequestError(
                "max_completion_tokens: differs from max_tokens; send one of them", "max_completion_tokens"
            )
        return self

    @property
    def requested_max_tokens(self) -> tuple[int | None, str]:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"


GenerationRequest = CompletionRequest | ChatCompletionRequest


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """What the engine needs besides the prompt's ids."""

    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool


def generation_params(
    request: GenerationRequest,
    *,
    default_max_tokens: int,
    max_tokens_cap: int,
    context_tokens: int,
    prompt_tokens: int,
) -> GenerationParams:
    """The request's sampling parameters, with its token budget checked as vLLM does.

    A prompt that alone fills the context is an ``InputTooLongError``. A ``max_tokens`` over the server's
    cap, or one that does not fit in the context after the prompt, is a 400 naming the numbers (vLLM
    does not clip a limit the client chose). Without ``max_tokens``, the default is clipped to the room
    the prompt leaves.
    """
    room = context_tokens - prompt_tokens
    if room < 1:
        field = request.PROMPT_FIELD
        raise InputTooLongError(
            f"{field}: {prompt_tokens} tokens leave no room to generate in the model's context of "
            f"{context_tokens} tokens ({MAX_CONTEXT_TOKENS}); shorten it",
            field,
        )
    asked, field = request.requested_max_tokens
    if asked is None:
        max_new = min(default_max_tokens, max_tokens_cap, room)
    elif asked > max_tokens_cap:
        raise InvalidRequestError(
            f"{field}: at most {max_tokens_cap} new tokens per request ({MAX_NEW_TOKENS}), got {asked}", field
        )
    elif asked > room:
        raise InvalidRequestError(
            f"{field}: the prompt's {prompt_tokens} tokens plus {field}={asked} exceed the model's context "
            f"of {context_tokens} tokens ({MAX_CONTEXT_TOKENS}); at most {room} new tokens fit",
            field,
        )
    else:
        max_new = asked
    stop = request.stop
    options = request.stream_options
    return GenerationParams(
        max_new_tokens=max_new,
        temperature=float(request.temperature),
        top_p=float(request.top_p),
        seed=request.seed,
        stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
        stream=request.stream,
        include_usage=bool(request.stream and options is not None and options.include_usage),
    )


def chat_messages(request: ChatCompletionRequest) -> list[dict[str, str]]:
    """The messages as chat templates expect them: text parts joined with newlines; ``developer`` (OpenAI's
    new name for ``system``) becomes ``system``, which every template knows."""
    out = []
    for message in request.messages:
        item = {"role": "system" if message.role == "developer" else message.role, "content": message.text}
        if message.name is not None:
            item["name"] = message.name
        out.append(item)
    return out


class PromptBuilder:
    """A model's Hugging Face tokenizer (loaded once) turning prompts and chat messages into token ids."""

    def __init__(self, weights_dir: str | Path, model_name: str | None = None) -> None:
        from transformers import AutoTokenizer  # heavy: imported only where prompts are built

        self.weights_dir = Path(weights_dir)
        self.model_name = model_name or self.weights_dir.name
        self._tok = AutoTokenizer.from_pretrained(str(self.weights_dir))
        self.vocab_size: int = len(self._tok)
        self.has_chat_template: bool = bool(getattr(self._tok, "chat_template", None))
        self.eos_token_ids: tuple[int, ...] = _eos_ids(self.weights_dir, self._tok.eos_token_id)

    def text_ids(self, prompt: str) -> list[int]:
        """A plain text prompt: the tokenizer's own special tokens (a BOS where its post-processor adds one),
        but never a trailing EOS, which would end the generation before it starts."""
        ids = list(self._tok.encode(prompt, add_special_tokens=True))
        eos = self._tok.eos_token_id
        if ids and ids[-1] == eos and not prompt.endswith(str(self._tok.eos_token)):
            ids.pop()
        return ids

    def chat_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        if not self.has_chat_template:
            raise UnsupportedTaskError(
                f"model {self.model_name} has no chat template: use /v1/completions", "messages"
            )
        from jinja2 import TemplateError

        try:
            out = self._tok.apply_chat_template(
                [dict(m) for m in messages], add_generation_prompt=True, tokenize=True
            )
        except TemplateError as exc:  # e.g. raise_exception("roles must alternate") in the template
            raise InvalidRequestError(
                f"messages: the model's chat template rejects them: {exc}", "messages"
            ) from None
        if isinstance(out, Mapping):  # transformers 5 returns a BatchEncoding by default
            out = out["input_ids"]
        if out and isinstance(out[0], list):
            out = out[0]
        return [int(i) for i in out]

    def token_ids(self, ids: Sequence[int], field: str = "prompt") -> list[int]:
        """Token ids a client sent, used as they are once each is inside the vocabulary."""
        bad = next((i for i in ids if not 0 <= i < self.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(
                f"{field}: token id {bad} is outside the model's vocabulary (0 to {self.vocab_size - 1})",
                field,
            )
        return list(ids)

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        """The prompt of either route as token ids."""
        if isinstance(request, ChatCompletionRequest):
            return self.chat_ids(chat_messages(request))
        ids = request.prompt_token_ids
        return self.token_ids(ids) if ids is not None else self.text_ids(request.prompt)  # type: ignore[arg-type]


def _eos_ids(weights_dir: Path, tokenizer_eos: int | None) -> tuple[int, ...]:
    """generation_config.json's ``eos_token_id`` (an int or a list), else the tokenizer's EOS."""
    path = weights_dir / "generation_config.json"
    eos: Any = None
    if path.is_file():
        eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    if eos is None:
        eos = tokenizer_eos
    if eos is None:
        return ()
    ids = [eos] if isinstance(eos, int) else list(eos)
    return tuple(dict.fromkeys(int(i) for i in ids))


__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "GenerationParams",
    "GenerationRequest",
    "PromptBuilder",
    "StreamOptions",
    "TextPart",
    "chat_messages",
    "generation_params",
]
