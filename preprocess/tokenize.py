"""Fast (Rust) Hugging Face tokenization with the model's token limit enforced."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from preprocess.contracts import EncodedTexts
from preprocess.errors import InputTooLongError


class TextTokenizer:
    """Wraps a ``tokenizers.Tokenizer`` loaded from a ``tokenizer.json`` file.

    Inputs over ``max_tokens`` (special tokens included) are rejected with a message naming the
    limit, unless the caller asks to truncate them.
    """

    def __init__(self, tokenizer_file: str | Path, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._tok = Tokenizer.from_file(str(tokenizer_file))
        self.pad_id = _pad_id(self._tok)
        self._tok.no_padding()  # the inference stage pads each micro-batch to its own longest
        # Truncating in Rust keeps the cost of a huge input bounded; the overflow tells us it happened.
        self._tok.enable_truncation(max_length=max_tokens)

    def encode(self, texts: list[str], truncate: bool = False) -> EncodedTexts:
        encodings = self._tok.encode_batch(texts, add_special_tokens=True)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(texts))
        truncated = 0
        for i, enc in enumerate(encodings):
            if enc.overflowing:
                if not truncate:
                    where = "input" if len(texts) == 1 else f"input[{i}]"
                    raise InputTooLongError(
                        f"{where} is longer than the model's limit of {self.max_tokens} tokens; "
                        'shorten it or send "truncate": true',
                        where,
                    )
                truncated += 1
        offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids = (
            np.concatenate([np.asarray(e.ids, dtype=np.int32) for e in encodings])
            if encodings
            else np.zeros(0, dtype=np.int32)
        )
        return EncodedTexts(ids=ids, offsets=offsets, truncated=truncated)


def pad_token_id(tokenizer_file: str | Path) -> int:
    return _pad_id(Tokenizer.from_file(str(tokenizer_file)))


def _pad_id(tok: Tokenizer) -> int:
    if tok.padding:
        return int(tok.padding["pad_id"])
    for token in ("[PAD]", "<pad>", "<|padding|>"):
        token_id = tok.token_to_id(token)
        if token_id is not None:
            return token_id
    return 0  # padded positions are masked out, so any id is safe
