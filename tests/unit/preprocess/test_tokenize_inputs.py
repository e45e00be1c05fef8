"""Token-id inputs, prompts, per-text limits and cross-encoder pairs, with the default model's tokenizer
(checked against the Hugging Face tokenizer the model's users run)."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoTokenizer

from contracts.errors import InputTooLongError, InvalidRequestError
from contracts.tokenized import TokenizeJob
from preprocess.tokenize import encode_job, sep_token_id
from tests.unit.preprocess.conftest import MAX_TOKENS, TOKENIZER_FILE

CLS, SEP = 101, 102


@pytest.fixture(scope="module")
def hf():
    return AutoTokenizer.from_pretrained(str(TOKENIZER_FILE.parent))


def _rows(encoded) -> list[list[int]]:
    return [s.tolist() for s in encoded.sequences()]


def test_token_ids_embed_exactly_like_their_text(tok, hf):
    ids = hf("hello world", add_special_tokens=False)["input_ids"]
    assert ids == [7592, 2088]
    assert _rows(tok.encode_ids([ids])) == _rows(tok.encode(["hello world"]))


def test_token_ids_outside_the_vocabulary_are_refused_naming_the_input(tok):
    with pytest.raises(InvalidRequestError, match=r"input\[1\]: token id 30522 is outside") as err:
        tok.encode_ids([[1, 2], [30522]])
    assert err.value.param == "input[1]"


def test_token_ids_over_the_limit_fail_or_truncate(tok):
    ids = [1037] * MAX_TOKENS
    with pytest.raises(InputTooLongError):
        tok.encode_ids([ids])
    encoded = tok.encode_ids([ids], truncate=True)
    assert len(encoded.ids) == MAX_TOKENS and encoded.truncated == 1
    assert encoded.ids[0] == CLS and encoded.ids[-1] == SEP


def test_a_prompt_is_prepended_and_counts_against_the_limit(tok, hf):
    with_prompt = _rows(tok.encode(["hello"], prompt="query: "))[0]
    assert with_prompt == hf("query: hello")["input_ids"]
    words = " ".join(["word"] * (MAX_TOKENS - 2))  # exactly at the limit without a prompt
    tok.encode([words])
    with pytest.raises(InputTooLongError):
        tok.encode([words], prompt="query: ")


def test_token_ids_take_the_prompt_too(tok, hf):
    ids = hf("hello", add_special_tokens=False)["input_ids"]
    assert _rows(tok.encode_ids([ids], prompt="query: ")) == _rows(tok.encode(["hello"], prompt="query: "))


def test_a_request_limit_cuts_or_refuses_each_text(tok):
    encoded = tok.encode(["a b c d e f g", "a b"], truncate=True, max_tokens=3)
    assert _rows(encoded) == [[CLS, 1037, 1038, 1039, SEP], [CLS, 1037, 1038, SEP]]
    assert encoded.truncated == 1
    with pytest.raises(InputTooLongError, match="is over the request's max_tokens of 3 tokens;"):
        tok.encode(["a b c d e f g"], max_tokens=3)
    with pytest.raises(InputTooLongError, match="the model's limit of 256 tokens per input"):
        tok.encode([" ".join(["word"] * 300)], max_tokens=1000)  # the model's limit is the lower one


def test_pairs_match_hugging_face_and_cut_only_the_document(tok, hf):
    query, docs = "what is a cat", ["a cat is an animal", "dogs bark"]
    want = [hf(query, d)["input_ids"] for d in docs]
    assert _rows(tok.encode_pairs(query, docs)) == want
    long_doc = "word " * 400
    (row,) = _rows(tok.encode_pairs(query, [long_doc]))
    assert len(row) == MAX_TOKENS and row[: len(want[0][:6])] == want[0][:6]  # the query is whole
    want_cut = hf(query, long_doc, truncation="only_second", max_length=MAX_TOKENS)["input_ids"]
    assert row == want_cut
    with pytest.raises(InputTooLongError):
        tok.encode_pairs(query, [long_doc], truncate=False)
    (short,) = _rows(tok.encode_pairs(query, [long_doc], max_doc_tokens=4))
    assert short[-5:] == [2773] * 4 + [SEP]


def test_a_query_longer_than_the_limit_is_refused(tok):
    with pytest.raises(InputTooLongError) as err:
        tok.encode_pairs("word " * 300, ["doc"])
    assert err.value.param == "query"


def test_rerank_jobs_on_an_embedding_model_put_the_query_first(tok):
    job = TokenizeJob(
        ["doc one", "doc two"], True, query="the query", query_prompt="query: ", prompt="passage: "
    )
    rows = _rows(encode_job(tok, job, pairs=False))
    assert rows == _rows(tok.encode(["query: the query", "passage: doc one", "passage: doc two"]))
    pair_rows = _rows(encode_job(tok, job, pairs=True))
    assert pair_rows == _rows(tok.encode_pairs("the query", ["doc one", "doc two"]))


def test_details_give_offsets_into_prompt_and_text(tok):
    (details,) = tok.details(["hello world"], prompt="q: ")
    text = "q: hello world"
    pieces = [text[s:e] for s, e in details.offsets]
    assert pieces == ["", "q", ":", "hello", "world", ""]
    assert details.ids[0] == CLS and details.ids[-1] == SEP


def test_the_separator_is_read_from_the_tokenizer():
    assert sep_token_id(TOKENIZER_FILE) == SEP
    assert np.int32(sep_token_id(TOKENIZER_FILE)) == SEP


# --- refusals name the body's field, the limit and its value, and how the route asks to truncate ----------

LONG = " ".join(["word"] * 300)  # 302 tokens with [CLS]/[SEP]: over MiniLM's 256


def _refusal(job: TokenizeJob, tok, pairs: bool = False) -> InputTooLongError:
    with pytest.raises(InputTooLongError) as info:
        encode_job(tok, job, pairs)
    assert info.value.code == "input_too_long"
    return info.value


def test_an_input_over_the_model_limit_names_it_its_value_and_the_truncate_field(tok):
    err = _refusal(TokenizeJob(["fine", LONG]), tok)
    assert err.param == "input[1]"
    assert err.message == (
        "input[1] is over the model's limit of 256 tokens per input (max_tokens_per_input, special tokens "
        'and prompt included); shorten it or send "truncate": true'
    )


@pytest.mark.parametrize(
    ("job", "param", "hint"),
    [
        (TokenizeJob(["a", LONG], field="texts", truncate_hint='"truncate": "END"'), "texts[1]", '"END"'),
        (TokenizeJob([LONG], field="inputs"), "inputs", '"truncate": true'),  # TEI's /embed_sparse
        (TokenizeJob(["a", LONG], field="texts"), "texts[1]", '"truncate": true'),  # /predict
        (TokenizeJob(["a", LONG], query="q", field="texts"), "texts[1]", '"truncate": true'),  # TEI rerank
        (TokenizeJob([], token_ids=[[1037] * 300]), "input", '"truncate": true'),  # token ids
    ],
)
def test_each_route_gets_its_own_field_and_truncate_hint(tok, job, param, hint):
    err = _refusal(job, tok)
    assert err.param == param and err.message.startswith(f"{param} is over ")
    assert "256" in err.message and "max_tokens_per_input" in err.message
    assert err.message.endswith(hint)


def test_a_cross_encoder_document_names_the_pair_limit(tok):
    err = _refusal(TokenizeJob(["doc", LONG], query="what", field="texts"), tok, pairs=True)
    assert err.param == "texts[1]"
    assert "limit of 256 tokens per input (max_tokens_per_input, query, document and special" in err.message
    assert err.message.endswith('send "truncate": true')


def test_a_query_is_never_truncated_so_its_refusal_does_not_offer_it(tok):
    for pairs in (False, True):
        err = _refusal(TokenizeJob(["doc"], True, query=LONG), tok, pairs)
        assert err.param == "query" and "256" in err.message and "max_tokens_per_input" in err.message
        assert err.message.endswith("shorten it") and "truncate" not in err.message


def test_a_document_over_the_request_limit_names_max_tokens_per_doc(tok):
    job = TokenizeJob(["a b c d e f g"], query="q", max_tokens=3)
    assert "the request's max_tokens_per_doc of 3 tokens" in _refusal(job, tok).message
    assert "the request's max_tokens_per_doc of 3 tokens" in _refusal(job, tok, pairs=True).message
