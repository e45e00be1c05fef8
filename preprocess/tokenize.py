"""Fast (Rust) Hugging Face tokenization with the model's token limit enforced.

Texts (with a prompt prepended), token ids a client tokenized itself (the model's special tokens are added
here), query-document pairs for a cross-encoder (only the document is cut to fit), and the details
``/tokenize`` returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer

from contracts.errors import InputTooLongError, InvalidRequestError
from contracts.tokenized import EncodedTexts, TokenizeJob
from preprocess.limits import MAX_TOKENS_PER_INPUT

_PROBE = ("a", "b")  # one token each in every vocabulary we serve: used to find the special-token template
TRUNCATE_HINT = '"truncate": true'  # how most routes ask for truncation (Cohere's /v2/embed: "END")


@dataclass(frozen=True, slots=True)
class Template:
    """Where a model's special tokens go around one text (``prefix text suffix``) and around a pair
    (``prefix a middle b suffix``), read off the tokenizer's own post-processor."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    middle: tuple[int, ...]

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> Template:
        tok = Tokenizer.from_str(tokenizer.to_str())  # a copy without the file's padding and truncation
        tok.no_padding()
        tok.no_truncation()
        a, b = (tok.encode(t, add_special_tokens=False).ids for t in _PROBE)
        single = tok.encode(_PROBE[0], add_special_tokens=True).ids
        pair = tok.encode(*_PROBE, add_special_tokens=True).ids
        i = _find(single, a)
        j, k = _find(pair, a), _find(pair, b)
        return cls(tuple(single[:i]), tuple(single[i + len(a) :]), tuple(pair[j + len(a) : k]))

    @property
    def single_extra(self) -> int:
        return len(self.prefix) + len(self.suffix)


def _find(seq: list[int], sub: list[int]) -> int:
    for i in range(len(seq) - len(sub) + 1):
        if seq[i : i + len(sub)] == sub:
            return i
    raise ValueError("the tokenizer's template does not contain its own input")


@dataclass(frozen=True, slots=True)
class TokenDetails:
    """One input as ``/tokenize`` returns it: ids with special tokens, and character offsets into
    ``prompt + text`` (special tokens: (0, 0))."""

    ids: list[int]
    offsets: list[tuple[int, int]]


class TextTokenizer:
    """Wraps a ``tokenizers.Tokenizer`` loaded from a ``tokenizer.json`` file.

    Inputs over ``max_tokens`` (special tokens included) are rejected with a message naming the
    limit, unless the caller asks to truncate them.
    """

    def __init__(self, tokenizer_file: str | Path, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._tok = Tokenizer.from_file(str(tokenizer_file))
        self.pad_id = _pad_id(self._tok)
        self.vocab_size = self._tok.get_vocab_size()
        self._tok.no_padding()  # the inference stage pads each micro-batch to its own longest
        # Truncating in Rust keeps the cost of a huge input bounded; the overflow tells us it happened.
        self._tok.enable_truncation(max_length=max_tokens)
        self.template = Template.of(self._tok)

    def encode(
        self,
        texts: list[str],
        truncate: bool = False,
        prompt: str = "",
        max_tokens: int | None = None,
        field: str = "input",
        hint: str | None = TRUNCATE_HINT,
        max_tokens_field: str = "max_tokens",
    ) -> EncodedTexts:
        """``prompt`` is prepended to each text (its tokens count against the limit); ``max_tokens`` is a
        lower limit of the request's own (its field ``max_tokens_field``), on each text's tokens without the
        special ones. ``field`` and ``hint`` name, in a refusal, the body's field and how the route asks for
        truncation (None: it cannot)."""
        inputs = [prompt + t for t in texts] if prompt else texts
        encodings = self._tok.encode_batch(inputs, add_special_tokens=True)
        limit = (
            self.max_tokens
            if max_tokens is None
            else min(self.max_tokens, max_tokens + self.template.single_extra)
        )
        rows, truncated = [], 0
        for i, enc in enumerate(encodings):
            if enc.overflowing or len(enc.ids) > limit:
                if not truncate:
                    where = field if len(texts) == 1 else f"{field}[{i}]"
                    requested = None if limit == self.max_tokens else (max_tokens_field, max_tokens)
                    raise self._too_long(where, hint, requested)
                truncated += 1
            rows.append(self._cut(np.asarray(enc.ids, dtype=np.int32), limit))
        return _pack(rows, truncated)

    def encode_ids(
        self,
        token_ids: Sequence[Sequence[int]],
        truncate: bool = False,
        prompt: str = "",
        hint: str | None = TRUNCATE_HINT,
    ) -> EncodedTexts:
        """Token ids a client made with this tokenizer (``add_special_tokens=False``): the model's special
        tokens (and the prompt's tokens) are added here, so ``[7592, 2088]`` is exactly "hello world"."""
        t = self.template
        lead = list(t.prefix) + (self._tok.encode(prompt, add_special_tokens=False).ids if prompt else [])
        room = self.max_tokens - len(lead) - len(t.suffix)
        rows, truncated = [], 0
        for i, ids in enumerate(token_ids):
            where = "input" if len(token_ids) == 1 else f"input[{i}]"
            bad = next((x for x in ids if not 0 <= x < self.vocab_size), None)
            if bad is not None:
                raise InvalidRequestError(
                    f"{where}: token id {bad} is outside the model's vocabulary (0 to {self.vocab_size - 1})",
                    where,
                )
            if len(ids) > room:
                if not truncate:
                    raise self._too_long(where, hint)
                truncated += 1
            rows.append(np.asarray([*lead, *ids[:room], *t.suffix], dtype=np.int32))
        return _pack(rows, truncated)

    def encode_pairs(
        self,
        query: str,
        documents: list[str],
        truncate: bool = True,
        max_doc_tokens: int | None = None,
        field: str = "documents",
        hint: str | None = TRUNCATE_HINT,
    ) -> EncodedTexts:
        """(query, document) pairs for a cross-encoder: only the document side is cut, to the model's limit
        (the pair's, special tokens included) and to ``max_doc_tokens``; a query that leaves no room for a
        document is refused."""
        t = self.template
        q = self._tok.encode(query, add_special_tokens=False).ids
        room = self.max_tokens - len(q) - len(t.prefix) - len(t.middle) - len(t.suffix)
        if room < 1:
            raise InputTooLongError(
                f"query leaves no room for a document within the model's limit of {self.max_tokens} tokens "
                f"per (query, document) pair ({MAX_TOKENS_PER_INPUT}); shorten it",
                "query",
            )
        requested = None
        if max_doc_tokens is not None and max_doc_tokens < room:
            room, requested = max_doc_tokens, ("max_tokens_per_doc", max_doc_tokens)
        docs = self._tok.encode_batch(documents, add_special_tokens=False)
        head = [*t.prefix, *q, *t.middle]
        rows, truncated = [], 0
        for i, enc in enumerate(docs):
            if len(enc.ids) > room or enc.overflowing:
                if not truncate:
                    where = field if len(documents) == 1 else f"{field}[{i}]"
                    raise self._too_long(where, hint, requested, pair=True)
                truncated += 1
            rows.append(np.asarray([*head, *enc.ids[:room], *t.suffix], dtype=np.int32))
        return _pack(rows, truncated)

    def details(self, texts: list[str], prompt: str = "", truncate: bool = False) -> list[TokenDetails]:
        encodings = self._tok.encode_batch([prompt + t for t in texts], add_special_tokens=True)
        for i, enc in enumerate(encodings):
            if enc.overflowing and not truncate:
                raise self._too_long("input" if len(texts) == 1 else f"input[{i}]", TRUNCATE_HINT)
        return [_details(e) for e in encodings]

    def _cut(self, row: np.ndarray, limit: int) -> np.ndarray:
        if len(row) <= limit:
            return row
        t = self.template
        keep = row[len(t.prefix) : len(t.prefix) + limit - t.single_extra]
        return np.concatenate([np.asarray(t.prefix, np.int32), keep, np.asarray(t.suffix, np.int32)])

    def _too_long(
        self,
        where: str,
        hint: str | None,
        requested: tuple[str, int | None] | None = None,
        pair: bool = False,
    ) -> InputTooLongError:
        """400 ``input_too_long`` naming the input (``param``), the limit it is over and its value: the
        model's ``max_tokens_per_input``, or the request's own (``requested``: its field and value)."""
        if requested is not None:
            limit = f"the request's {requested[0]} of {requested[1]} tokens"
        else:
            counted = (
                "query, document and special tokens together"
                if pair
                else "special tokens and prompt included"
            )
            limit = (
                f"the model's limit of {self.max_tokens} tokens per input ({MAX_TOKENS_PER_INPUT}, {counted})"
            )
        fix = f"shorten it or send {hint}" if hint else "shorten it"
        return InputTooLongError(f"{where} is over {limit}; {fix}", where)


def encode_job(tokenizer: TextTokenizer, job: TokenizeJob, pairs: bool) -> EncodedTexts:
    """A request's inputs as token ids. A rerank (``job.query``) becomes (query, document) pairs for a
    cross-encoder (``pairs``), or, for an embedding model, the query followed by the documents."""
    field, hint = job.field, job.truncate_hint
    if job.query is not None:
        if pairs:
            return tokenizer.encode_pairs(job.query, job.texts, job.truncate, job.max_tokens, field, hint)
        query = tokenizer.encode([job.query], prompt=job.query_prompt, field="query", hint=None)
        docs = tokenizer.encode(
            job.texts, job.truncate, job.prompt, job.max_tokens, field, hint, "max_tokens_per_doc"
        )
        return concat(query, docs)
    if job.token_ids is not None:
        return tokenizer.encode_ids(job.token_ids, job.truncate, job.prompt, hint)
    return tokenizer.encode(job.texts, job.truncate, job.prompt, job.max_tokens, field, hint)


def concat(first: EncodedTexts, second: EncodedTexts) -> EncodedTexts:
    ids = np.concatenate([first.ids, second.ids])
    offsets = np.concatenate([first.offsets, second.offsets[1:] + first.offsets[-1]])
    return EncodedTexts(ids=ids, offsets=offsets, truncated=first.truncated + second.truncated)


def _details(enc: Encoding) -> TokenDetails:
    offsets = [
        (0, 0) if special else (int(s), int(e))
        for (s, e), special in zip(enc.offsets, enc.special_tokens_mask, strict=True)
    ]
    return TokenDetails(ids=list(enc.ids), offsets=offsets)


def _pack(rows: list[np.ndarray], truncated: int) -> EncodedTexts:
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    ids = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int32)
    return EncodedTexts(ids=ids.astype(np.int32, copy=False), offsets=offsets, truncated=truncated)


def pad_token_id(tokenizer_file: str | Path) -> int:
    return _pad_id(Tokenizer.from_file(str(tokenizer_file)))


def sep_token_id(tokenizer_file: str | Path) -> int | None:
    """The separator between a pair's two texts ([SEP], </s>), if the tokenizer has one."""
    tok = Tokenizer.from_file(str(tokenizer_file))
    middle = Template.of(tok).middle
    return middle[0] if middle else None


def _pad_id(tok: Tokenizer) -> int:
    if tok.padding:
        return int(tok.padding["pad_id"])
    for token in ("[PAD]", "<pad>", "<|padding|>"):
        token_id = tok.token_to_id(token)
        if token_id is not None:
            return token_id
    return 0  # padded positions are masked out, so any id is safe
