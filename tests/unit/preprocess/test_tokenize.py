"""TextTokenizer with the default model's real tokenizer.json (all-MiniLM-L6-v2, 256 tokens)."""

from __future__ import annotations

import numpy as np
import pytest

from contracts.errors import InputTooLongError, InvalidRequestError
from contracts.tokenized import EncodedTexts
from preprocess.tokenize import TextTokenizer, pad_token_id
from tests.unit.preprocess.conftest import MAX_TOKENS, TOKENIZER_FILE

CLS, SEP = 101, 102


def _words(n: int) -> str:
    # "word" is one token in this vocabulary: n words -> n + 2 tokens with [CLS]/[SEP].
    return " ".join(["word"] * n)


def test_shapes_and_dtypes(tok):
    enc = tok.encode(["hello world", "a", "the quick brown fox"])
    assert isinstance(enc, EncodedTexts)
    assert len(enc) == 3
    assert enc.ids.dtype == np.int32
    assert enc.ids.ndim == 1
    assert enc.offsets.dtype == np.int64
    assert enc.offsets.shape == (4,)
    assert enc.offsets[0] == 0
    assert enc.offsets[-1] == enc.ids.shape[0]
    assert np.all(np.diff(enc.offsets) > 0)
    assert enc.truncated == 0


def test_token_counts_include_special_tokens(tok):
    enc = tok.encode(["hello world", "", "a"])
    # hello, world + [CLS] [SEP]; the empty string is just [CLS] [SEP]
    assert enc.lengths.tolist() == [4, 2, 3]
    assert enc.token_count == 9
    for seq in enc.sequences():
        assert seq[0] == CLS
        assert seq[-1] == SEP


@pytest.mark.parametrize(
    "texts",
    [
        ["hello world"],
        ["Hello, World!", "Ray Serve batches requests.", "x"],
        ["same", "same"],
    ],
)
def test_sequences_match_reference_tokenizer(tok, reference, texts):
    enc = tok.encode(texts)
    seqs = list(enc.sequences())
    assert len(seqs) == len(texts)
    for text, seq in zip(texts, seqs, strict=True):
        assert seq.tolist() == reference.encode(text).ids


def test_encode_empty_list(tok):
    enc = tok.encode([])
    assert len(enc) == 0
    assert enc.ids.shape == (0,)
    assert enc.ids.dtype == np.int32
    assert enc.offsets.tolist() == [0]
    assert enc.token_count == 0


def test_file_padding_and_128_truncation_are_not_applied(tok):
    # tokenizer.json asks for fixed padding to 128 and truncation at 128: neither may leak through.
    enc = tok.encode(["a", _words(200)])
    assert enc.lengths.tolist() == [3, 202]
    assert enc.truncated == 0
    assert 0 not in enc.ids.tolist()


def test_exactly_max_tokens_is_accepted(tok):
    enc = tok.encode([_words(MAX_TOKENS - 2)])
    assert enc.lengths.tolist() == [MAX_TOKENS]
    assert enc.truncated == 0


def test_single_input_too_long(tok):
    with pytest.raises(InputTooLongError) as info:
        tok.encode([_words(MAX_TOKENS - 1)])  # 257 tokens with specials
    err = info.value
    assert isinstance(err, InvalidRequestError)
    assert err.param == "input"
    assert "256" in err.message
    assert "truncate" in err.message


def test_too_long_input_in_list_is_named_by_index(tok):
    with pytest.raises(InputTooLongError) as info:
        tok.encode(["short", "also short", _words(1000), _words(1000)])
    assert info.value.param == "input[2]"
    assert info.value.message.startswith("input[2] ")
    assert "256" in info.value.message


def test_truncate_cuts_to_limit_and_counts(tok, reference):
    long_text = _words(1000)
    enc = tok.encode([long_text, "hi", _words(MAX_TOKENS - 1)], truncate=True)
    assert enc.lengths.tolist() == [MAX_TOKENS, 3, MAX_TOKENS]
    assert enc.truncated == 2
    first = next(iter(enc.sequences()))
    assert first[0] == CLS
    assert first[-1] == SEP
    # the kept tokens are the start of the text
    assert first[1:-1].tolist() == reference.encode(long_text).ids[1 : MAX_TOKENS - 1]


def test_truncate_flag_without_long_inputs_counts_zero(tok):
    assert tok.encode(["a", "b"], truncate=True).truncated == 0


@pytest.mark.parametrize(
    "text",
    [
        "naïve café déjà vu",
        "😀🎉👍🏽 emoji",
        "שלום עולם",  # Hebrew (RTL)
        "مرحبا بالعالم",  # Arabic (RTL)
        "e\u0301 a\u0308 combining marks",
        "zero\u200bwidth",
        "nul\x00byte",
        "\x00",
        "日本語のテキスト",
        "\ufeffbom",
    ],
)
def test_unusual_unicode_tokenizes(tok, reference, text):
    enc = tok.encode([text])
    seq = next(iter(enc.sequences()))
    assert seq[0] == CLS
    assert seq[-1] == SEP
    assert enc.token_count >= 2
    assert seq.tolist() == reference.encode(text).ids


def test_huge_input_is_bounded(tok):
    enc = tok.encode(["x " * 200_000], truncate=True)
    assert enc.token_count == MAX_TOKENS
    assert enc.truncated == 1


def test_pad_token_id(tok):
    assert pad_token_id(TOKENIZER_FILE) == 0
    assert tok.pad_id == 0
    assert tok.max_tokens == MAX_TOKENS


def test_smaller_limit_is_enforced():
    small = TextTokenizer(TOKENIZER_FILE, 8)
    assert small.encode([_words(6)]).token_count == 8
    with pytest.raises(InputTooLongError, match=r"limit of 8 tokens"):
        small.encode([_words(7)])
