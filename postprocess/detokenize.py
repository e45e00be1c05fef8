"""Streamed text out of generated token ids: incremental detokenization and stop strings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

# Prompt tokens decoded ahead of the first generated one, so it gets its left context (a SentencePiece
# "▁word" decoded alone loses its space) and a character split across the prompt's end comes out whole.
PROMPT_CONTEXT = 5
REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Text of the generated ids, one token at a time (the prefix / read-offset method of vLLM and TGI).

    ``ids[prefix_offset:read_offset]`` is already emitted; each push decodes it and ``ids[prefix_offset:]``
    and emits the difference. While the decoded text ends in U+FFFD, a byte-level BPE token has left a
    UTF-8 sequence incomplete: nothing is emitted until a later token completes it (or ``flush``).
    """

    __slots__ = ("_ids", "_prefix_offset", "_read_offset", "_skip_special", "_text", "_tokenizer")

    def __init__(
        self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (), skip_special_tokens: bool = True
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        # Only the prompt's tail is ever decoded again; the rest is dead weight.
        self._ids: list[int] = list(prompt_ids[-PROMPT_CONTEXT:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._text = ""

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        return self._text

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)

    def _advance(self, final: bool) -> str:
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        # A shorter or equal decode: a skipped special token or a byte still waiting for its character.
        if len(new_text) <= len(prefix_text) or (not final and new_text.endswith(REPLACEMENT)):
            return ""
        delta = new_text[len(prefix_text) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        # Drop ids no later decode reads, so a long generation does not keep the whole sequence.
        if self._prefix_offset:
            del self._ids[: self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0
        self._text += delta
        return delta

    def push(self, token_id: int) -> str:
        """The text ``token_id`` adds (may be empty while a multi-byte character is incomplete)."""
        self._ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end of a generation: the text held back (an incomplete character decodes to U+FFFD)."""
        if self._read_offset == len(self._ids):
            return ""
        return self._advance(final=True)


@dataclass(frozen=True, slots=True)
class StopResult:
    """What a push releases; ``stopped``: a stop string matched and ``text`` ends right before it."""

    text: str
    stopped: bool


_NOTHING = StopResult("", False)
_STOPPED = StopResult("", True)


class StopMatcher:
    """Cuts streamed text at the first stop string (excluded from the output, as OpenAI does).

    Text that could still be the start of a stop string is held back until the next push decides it;
    everything else is released at once. After a match every push returns nothing.
    """

    __slots__ = ("_held", "_stopped", "_stops")

    def __init__(self, stops: Sequence[str]) -> None:
        # An empty stop string would match before any text; OpenAI ignores it too.
        self._stops: tuple[str, ...] = tuple(dict.fromkeys(s for s in stops if s))
        self._held = ""
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    def _held_length(self, text: str) -> int:
        """The longest suffix of ``text`` that is a proper prefix of a stop string."""
        best = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:k]):
                    best = k
                    break
        return best

    def push(self, text: str) -> StopResult:
        if self._stopped:
            return _STOPPED
        if not self._stops:
            return StopResult(text, False) if text else _NOTHING
        buffer = self._held + text
        # Held text holds no whole stop, so any match ends in ``text``; the earliest start wins.
        found = [i for i in (buffer.find(stop) for stop in self._stops) if i >= 0]
        if found:
            self._stopped = True
            self._held = ""
            return StopResult(buffer[: min(found)], True)
        keep = self._held_length(buffer)
        self._held = buffer[len(buffer) - keep :]
        released = buffer[: len(buffer) - keep]
        return StopResult(released, False) if released else _NOTHING

    def flush(self) -> str:
        """At the end of a generation with no stop matched: the held-back text."""
        held, self._held = self._held, ""
        return held
