"""Property tests (hypothesis) on parsing and tokenization: arbitrary input never escapes the error taxonomy.

``parse_body`` either returns a validated request or raises an ``InvalidRequestError`` subclass (a 4xx), for
any bytes, any JSON value and any Content-Type. ``TextTokenizer.encode`` on any (surrogate-free) text either
returns ``EncodedTexts`` whose offsets describe its ids exactly, or raises ``InputTooLongError``, and only
when a text really is over the limit; with ``truncate=True`` it never raises and never exceeds the limit.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from contracts.errors import InputTooLongError, InvalidJSONError, InvalidRequestError
from contracts.tokenized import EncodedTexts
from preprocess.parsing import parse_body
from preprocess.schemas import EmbeddingsRequest, PredictRequest
from tests.unit.preprocess.conftest import MAX_TOKENS

CLS, SEP = 101, 102
JSON_CT = "application/json"
SCHEMAS = (EmbeddingsRequest, PredictRequest)

# Bounded so the whole file runs in a few seconds; deadline=None because the first calls warm caches.
FAST = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOWER = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Characters that have broken text pipelines before: NUL and other controls, combining marks, RTL text and
# bidi overrides, zero-width (non-)joiners, BOM, emoji with ZWJ sequences and skin tones, CJK, noncharacters.
ODD = [
    "\x00",
    "\x01",
    "\x7f",
    "\t",
    "\r\n",
    "\u0301",  # combining acute accent
    "e\u0301\u0302\u0303",
    "\u05d0\u05d1\u05d2",  # Hebrew
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629",  # Arabic
    "\u202e",  # right-to-left override
    "\u200b",  # zero-width space
    "\u200c",
    "\u200d",  # zero-width joiner
    "\ufeff",  # BOM / zero-width no-break space
    "\U0001f469\u200d\U0001f469\u200d\U0001f467",  # family emoji (ZWJ sequence)
    "\U0001f44d\U0001f3fd",  # thumbs up, skin tone
    "\U0001f1eb\U0001f1f7",  # flag (regional indicators)
    "\u4e2d\u6587",
    "\uffff",
    "\U0010ffff",
    "\u00a0",
    "\u2028",
]
# No surrogates: exactly the texts a valid JSON body can carry, since lone surrogates are refused at parsing.
surrogate_free = st.characters(codec="utf-8")  # everything UTF-8 can carry: all but surrogates
pieces = st.one_of(surrogate_free, st.sampled_from(ODD))
odd_text = st.lists(pieces, max_size=40).map("".join)
# Long texts, so the token limit is actually reached: a short piece repeated up to a few hundred times.
long_text = st.builds(
    lambda piece, n: piece * n,
    st.lists(pieces, min_size=1, max_size=6).map("".join),
    st.integers(min_value=1, max_value=400),
)
any_text = st.one_of(odd_text, odd_text, long_text)

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),  # includes ints past 64 bits, which orjson refuses
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=20,
)
# Objects that look like real requests, so validation (not just JSON parsing) is exercised deeply.
field_names = st.sampled_from(
    ["input", "model", "encoding_format", "dimensions", "user", "truncate", "text", "texts", "extra"]
)
field_values = st.one_of(
    json_values,
    odd_text,
    st.lists(odd_text, max_size=4),
    st.sampled_from(["float", "base64", "all-MiniLM-L6-v2", "", 0, 1, 384, -1, True, [], [""], {}]),
)
request_like = st.dictionaries(field_names, field_values, max_size=5)


def _check_parsed(result: object, schema: type) -> None:
    assert isinstance(result, schema)
    if isinstance(result, EmbeddingsRequest) and result.token_ids is not None:
        # OpenAI's input may be token ids (one list, or a list per input) instead of texts.
        ids = result.token_ids
        assert ids and all(row and all(isinstance(i, int) for i in row) for row in ids)
        return
    texts = result.texts if isinstance(result, EmbeddingsRequest) else result.inputs
    assert isinstance(texts, list) and texts
    assert all(isinstance(t, str) and t for t in texts)


def _parse(body: bytes, schema: type, content_type: str | None = JSON_CT) -> object | InvalidRequestError:
    """Only a model or an InvalidRequestError may come out; anything else propagates and fails the test."""
    try:
        result = parse_body(body, content_type, schema)
    except InvalidRequestError as exc:
        assert isinstance(exc.message, str) and exc.message
        assert exc.param is None or isinstance(exc.param, str)
        assert exc.code and exc.type == "invalid_request_error"
        return exc
    _check_parsed(result, schema)
    return result


@FAST
@given(body=st.binary(max_size=200), schema=st.sampled_from(SCHEMAS))
@example(body=b'{"input": "\\ud800"}', schema=EmbeddingsRequest)
@example(body=b'{"input": "\xed\xa0\x80"}', schema=EmbeddingsRequest)  # CESU-8 surrogate bytes
@example(body=b'{"input": "\xff\xfe"}', schema=EmbeddingsRequest)
@example(body=b"\xef\xbb\xbf{}", schema=PredictRequest)  # BOM before the object
@example(body=b"[" * 5000, schema=EmbeddingsRequest)  # past orjson's nesting limit
@example(body=b"1e999999", schema=PredictRequest)
@example(body=b"\x00", schema=PredictRequest)
def test_parse_body_on_arbitrary_bytes(body, schema):
    _parse(body, schema)


@FAST
@given(value=json_values, schema=st.sampled_from(SCHEMAS))
@example(value=2**70, schema=EmbeddingsRequest)
@example(value={"input": 2**70}, schema=EmbeddingsRequest)
@example(value={"input": "x", "dimensions": 2**70}, schema=EmbeddingsRequest)
@example(value={"input": "x", "dimensions": 1.0}, schema=EmbeddingsRequest)
@example(value={"input": float("nan")}, schema=EmbeddingsRequest)
def test_parse_body_on_arbitrary_json_values(value, schema):
    # json (not orjson) so values orjson would refuse to write (huge ints, NaN) still reach the parser.
    out = _parse(json.dumps(value).encode(), schema)
    if not isinstance(value, dict):
        assert isinstance(out, InvalidRequestError)


@FAST
@given(value=request_like, schema=st.sampled_from(SCHEMAS), ensure_ascii=st.booleans())
@example(value={"input": ["ok", 7]}, schema=EmbeddingsRequest, ensure_ascii=False)
@example(value={"input": [0]}, schema=EmbeddingsRequest, ensure_ascii=False)  # token ids: no texts, and valid
@example(value={"text": "a", "texts": ["b"]}, schema=PredictRequest, ensure_ascii=False)
@example(value={}, schema=PredictRequest, ensure_ascii=False)
def test_parse_body_on_request_like_objects(value, schema, ensure_ascii):
    out = _parse(json.dumps(value, ensure_ascii=ensure_ascii).encode(), schema)
    if isinstance(out, InvalidRequestError) and out.param is not None:
        # A named field is a field of the schema (optionally indexed, e.g. input[3]) or the unknown key sent.
        assert out.param.split("[", 1)[0] in set(schema.model_fields) | set(value), out.param


@FAST
@given(content_type=st.one_of(st.none(), st.text(max_size=40)), schema=st.sampled_from(SCHEMAS))
@example(content_type="application/json; charset=utf-8", schema=EmbeddingsRequest)
@example(content_type="APPLICATION/VND.API+JSON", schema=EmbeddingsRequest)
@example(content_type="\x00", schema=EmbeddingsRequest)
def test_parse_body_on_arbitrary_content_types(content_type, schema):
    body = b'{"input": "hello"}' if schema is EmbeddingsRequest else b'{"text": "hello"}'
    _parse(body, schema, content_type)


@FAST
@given(text=st.text(min_size=1, max_size=20))
def test_lone_surrogates_are_invalid_json(text):
    # A "\ud800"-style escape anywhere in a string is refused as invalid JSON, never passed on.
    body = json.dumps({"input": text + "\ud800"}).encode()  # json writes the lone surrogate as an escape
    assert b"\\ud800" in body
    with pytest.raises(InvalidJSONError):
        parse_body(body, JSON_CT, EmbeddingsRequest)


def _ref_lengths(reference: Tokenizer, texts: list[str]) -> list[int]:
    return [len(e.ids) for e in reference.encode_batch(texts, add_special_tokens=True)]


def _check_encoded(enc: EncodedTexts, texts: list[str]) -> None:
    assert isinstance(enc, EncodedTexts)
    assert len(enc) == len(texts)
    assert enc.ids.dtype == np.int32 and enc.offsets.dtype == np.int64
    assert enc.offsets.shape == (len(texts) + 1,) and enc.offsets[0] == 0
    assert enc.token_count == len(enc.ids)
    lengths = enc.lengths
    assert np.all(lengths >= 2) and np.all(lengths <= MAX_TOKENS)  # [CLS] ... [SEP], never over the limit
    for seq in enc.sequences():
        assert seq[0] == CLS and seq[-1] == SEP
    assert np.all(enc.ids >= 0)
    assert sum(len(s) for s in enc.sequences()) == len(enc.ids)


@SLOWER
@given(texts=st.lists(any_text, max_size=6))
@example(texts=["word " * 254])  # exactly 256 tokens with [CLS]/[SEP]: allowed
@example(texts=["word " * 255])  # 257: over
@example(texts=["\x00", "\u200d", "\ufeff", ""])
def test_encode_without_truncation(tok, reference, texts):
    full = _ref_lengths(reference, texts)
    over = [i for i, n in enumerate(full) if n > MAX_TOKENS]
    try:
        enc = tok.encode(texts, truncate=False)
    except InputTooLongError as exc:
        assert over, f"refused although every text fits: {full}"
        assert str(MAX_TOKENS) in exc.message
        where = "input" if len(texts) == 1 else f"input[{over[0]}]"
        assert exc.param == where
        return
    assert not over, f"accepted texts over the limit: {full}"
    _check_encoded(enc, texts)
    assert enc.truncated == 0
    assert enc.lengths.tolist() == full
    for seq, ref in zip(enc.sequences(), reference.encode_batch(texts), strict=True):
        assert seq.tolist() == ref.ids


@SLOWER
@given(texts=st.lists(any_text, max_size=6))
@example(texts=["word " * 5000, "short"])
@example(texts=["\U0001f469\u200d\U0001f469\u200d\U0001f467" * 300])
def test_encode_with_truncation_never_raises_nor_exceeds_the_limit(tok, reference, texts):
    enc = tok.encode(texts, truncate=True)
    _check_encoded(enc, texts)
    full = _ref_lengths(reference, texts)
    assert enc.truncated == sum(n > MAX_TOKENS for n in full)
    assert enc.lengths.tolist() == [min(n, MAX_TOKENS) for n in full]
