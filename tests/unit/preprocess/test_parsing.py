"""parse_body and the request checks: valid bodies parse, every bad one names its field."""

from __future__ import annotations

import pytest

from contracts.errors import (
    InvalidJSONError,
    InvalidRequestError,
    ModelNotFoundError,
    PayloadTooLargeError,
    ServiceError,
    TooManyInputsError,
    UnsupportedMediaTypeError,
)
from preprocess.limits import MAX_DOCUMENTS
from preprocess.parsing import (
    check_body_size,
    check_content_type,
    check_dimensions,
    check_embedding_types,
    check_input_count,
    parse_body,
    pinned_version,
)
from preprocess.schemas import EmbeddingsRequest, PredictRequest

JSON_CT = "application/json"


def _fail(body: bytes, schema=EmbeddingsRequest, content_type: str | None = JSON_CT) -> ServiceError:
    with pytest.raises(ServiceError) as info:
        parse_body(body, content_type, schema)
    return info.value


# --- valid bodies -------------------------------------------------------------------------------


def test_embeddings_single_string_defaults():
    req = parse_body(b'{"input": "hello"}', JSON_CT, EmbeddingsRequest)
    assert isinstance(req, EmbeddingsRequest)
    assert req.texts == ["hello"]
    assert req.model is None
    assert req.encoding_format == "float"
    assert req.dimensions is None
    assert req.truncate is False
    assert req.user is None


def test_embeddings_all_fields():
    body = (
        b'{"input": ["a", "b c"], "model": "all-MiniLM-L6-v2:1", "encoding_format": "base64",'
        b' "dimensions": 64, "user": "u1", "truncate": true}'
    )
    req = parse_body(body, JSON_CT, EmbeddingsRequest)
    assert req.texts == ["a", "b c"]
    assert req.model == "all-MiniLM-L6-v2:1"
    assert req.encoding_format == "base64"
    assert req.dimensions == 64
    assert req.user == "u1"
    assert req.truncate is True


def test_whitespace_only_text_is_valid():
    assert parse_body(b'{"input": " "}', JSON_CT, EmbeddingsRequest).texts == [" "]


def test_parsed_request_is_frozen():
    req = parse_body(b'{"input": "x"}', JSON_CT, EmbeddingsRequest)
    with pytest.raises(Exception, match="frozen"):
        req.input = "y"  # type: ignore[misc]


def test_predict_text_and_texts():
    one = parse_body(b'{"text": "hi"}', JSON_CT, PredictRequest)
    assert one.inputs == ["hi"]
    assert one.truncate is False
    many = parse_body(b'{"texts": ["a", "b"], "truncate": true, "model": "m"}', JSON_CT, PredictRequest)
    assert many.inputs == ["a", "b"]
    assert many.truncate is True
    assert many.model == "m"


def test_unicode_body_parses():
    body = '{"input": ["héllo wörld", "שלום", "😀", "e\\u0301"]}'.encode()
    assert parse_body(body, JSON_CT, EmbeddingsRequest).texts == ["héllo wörld", "שלום", "😀", "e\u0301"]


# --- content type -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "application/json; charset=utf-8", "APPLICATION/JSON", "application/vnd.api+json"],
)
def test_json_content_types_accepted(content_type):
    assert parse_body(b'{"input": "x"}', content_type, EmbeddingsRequest).texts == ["x"]
    check_content_type(content_type)  # does not raise


def test_missing_content_type():
    err = _fail(b'{"input": "x"}', content_type=None)
    assert type(err) is UnsupportedMediaTypeError
    assert "Content-Type" in err.message
    assert isinstance(err, InvalidRequestError)


@pytest.mark.parametrize(
    "content_type", ["text/plain", "text/plain; charset=utf-8", "application/x-www-form"]
)
def test_non_json_content_type(content_type):
    err = _fail(b'{"input": "x"}', content_type=content_type)
    assert type(err) is UnsupportedMediaTypeError
    assert err.param == "content-type"
    assert content_type.split(";")[0] in err.message


# --- malformed bodies ---------------------------------------------------------------------------


def test_empty_body():
    err = _fail(b"")
    assert type(err) is InvalidJSONError
    assert "empty" in err.message


@pytest.mark.parametrize("body", [b"{", b'{"input": "x",}', b"  ", b"not json", b'{"input": "\xff"}'])
def test_invalid_json(body):
    err = _fail(body)
    assert type(err) is InvalidJSONError
    assert "not valid JSON" in err.message


@pytest.mark.parametrize("body", [b"[]", b'["x"]', b"1", b"3.5", b'"input"', b"null", b"true"])
def test_non_object_json(body):
    err = _fail(body)
    assert type(err) is InvalidRequestError
    assert "JSON object" in err.message


def test_lone_surrogate_escape_is_a_client_error():
    err = _fail(b'{"input": "a\\ud800"}')
    # orjson refuses the unpaired surrogate: the client gets invalid_json (a 4xx), never a 500.
    assert isinstance(err, InvalidRequestError)
    assert type(err) is InvalidJSONError
    assert err.code == "invalid_json"


# --- field errors (EmbeddingsRequest) -----------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        (b"{}", "input", "Field required"),
        (b'{"model": "m"}', "input", "Field required"),
        (b'{"input": null}', "input", "valid string"),
        (b'{"input": 1}', "input", "valid string"),
        (b'{"input": {"a": 1}}', "input", ""),
        (b'{"input": ["a", 1]}', "input[1]", "valid string"),
        (b'{"input": ["a", "b", null]}', "input[2]", "valid string"),
        (b'{"input": ["a", ""]}', "input[1]", "at least 1 character"),
        (b'{"input": ""}', "input", "at least 1 character"),
        (b'{"input": []}', "input", ""),
        (b'{"input": "x", "encoding_format": "hex"}', "encoding_format", "'float' or 'base64'"),
        (b'{"input": "x", "encoding_format": null}', "encoding_format", ""),
        (b'{"input": "x", "dimensions": 0}', "dimensions", "greater than or equal to 1"),
        (b'{"input": "x", "dimensions": -3}', "dimensions", "greater than or equal to 1"),
        (b'{"input": "x", "dimensions": "64"}', "dimensions", "valid integer"),
        (b'{"input": "x", "dimensions": 1.5}', "dimensions", "valid integer"),
        (b'{"input": "x", "dimensions": true}', "dimensions", "valid integer"),
        (b'{"input": "x", "truncate": "true"}', "truncate", "valid boolean"),
        (b'{"input": "x", "truncate": 1}', "truncate", "valid boolean"),
        (b'{"input": "x", "truncate": null}', "truncate", "valid boolean"),
        (b'{"input": "x", "model": 5}', "model", "valid string"),
        (b'{"input": "x", "user": 5}', "user", "valid string"),
    ],
)
def test_embeddings_field_errors(body, param, fragment):
    err = _fail(body)
    assert type(err) is InvalidRequestError
    assert err.param == param
    assert err.message.startswith(f"{param}: ")
    assert fragment in err.message


def test_unknown_field_is_named():
    err = _fail(b'{"input": "x", "temperature": 0.5}')
    assert type(err) is InvalidRequestError
    assert err.param == "temperature"
    assert "'temperature'" in err.message
    assert "unknown field" in err.message
    # and the message lists what is allowed
    for name in ("input", "model", "encoding_format", "dimensions", "user", "truncate"):
        assert name in err.message


def test_empty_input_list_message_says_list_is_empty():
    err = _fail(b'{"input": []}')
    assert "at least 1 item" in err.message


# --- field errors (PredictRequest) --------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [b'{"text": "a", "texts": ["b"]}', b"{}", b'{"text": null}', b'{"text": null, "texts": null}'],
)
def test_predict_exactly_one_of_text_texts(body):
    err = _fail(body, PredictRequest)
    assert type(err) is InvalidRequestError
    assert "exactly one of 'text'" in err.message
    assert "'texts'" in err.message
    assert not err.message.startswith("Value error")


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        (b'{"texts": ["a", 2]}', "texts[1]", "valid string"),
        (b'{"texts": []}', "texts", "at least 1 item"),
        (b'{"text": ""}', "text", "at least 1 character"),
        (b'{"text": 3}', "text", "valid string"),
        (b'{"texts": "a"}', "texts", "valid list"),
        (b'{"text": "a", "truncate": "true"}', "truncate", "valid boolean"),
    ],
)
def test_predict_field_errors(body, param, fragment):
    err = _fail(body, PredictRequest)
    assert type(err) is InvalidRequestError
    assert err.param == param
    assert err.message.startswith(f"{param}: ")
    assert fragment in err.message


def test_predict_unknown_field():
    err = _fail(b'{"text": "a", "input": "b"}', PredictRequest)
    assert err.param == "input"
    assert "unknown field 'input'" in err.message


# --- checks -------------------------------------------------------------------------------------


def test_check_input_count():
    check_input_count(3, 3)
    check_input_count(0, 1)
    with pytest.raises(TooManyInputsError) as info:
        check_input_count(4, 3)
    assert info.value.param == "input"
    assert info.value.message == (
        "too many inputs in 'input': 4 given, over the limit of 3 per request (max_inputs_per_request)"
    )


def test_too_many_documents_names_the_field_and_the_rerank_limit():
    check_input_count(3, 3, "texts", MAX_DOCUMENTS)
    with pytest.raises(TooManyInputsError) as info:
        check_input_count(1001, 1000, "texts", MAX_DOCUMENTS)
    assert info.value.param == "texts" and info.value.code == "too_many_inputs"
    assert "too many documents in 'texts': 1001 given" in info.value.message
    assert "limit of 1000 per request (max_documents_per_rerank)" in info.value.message


def test_a_body_over_the_byte_limit_names_the_limit():
    check_body_size(2048, 2048)
    with pytest.raises(PayloadTooLargeError) as info:
        check_body_size(2049, 2048)
    assert info.value.code == "payload_too_large" and info.value.param is None
    assert info.value.message == "request body is over the limit of 2048 bytes (max_request_bytes)"


@pytest.mark.parametrize(
    ("requested", "pinned"),
    [(None, None), ("all-MiniLM-L6-v2", None), ("all-MiniLM-L6-v2:1", "1"), ("all-MiniLM-L6-v2:2", "2")],
)
def test_pinned_version_accepts_the_name_or_a_served_version(requested, pinned):
    assert pinned_version(requested, "all-MiniLM-L6-v2", ["1", "2"]) == pinned


@pytest.mark.parametrize(
    "requested", ["all-MiniLM-L6-v2:3", "text-embedding-3-small", "", "ALL-MINILM-L6-V2", "all-MiniLM-L6-v2:"]
)
def test_pinned_version_rejects_unknown_models_and_versions(requested):
    with pytest.raises(ModelNotFoundError) as info:
        pinned_version(requested, "all-MiniLM-L6-v2", ["1", "2"])
    assert info.value.param == "model"
    assert repr(requested) in info.value.message
    assert "'all-MiniLM-L6-v2:2'" in info.value.message


@pytest.mark.parametrize("dimensions", [None, 64, 128, 384])
def test_check_dimensions_accepts_matryoshka_sizes_and_the_full_size(dimensions):
    check_dimensions(dimensions, 384, (64, 128))
    if dimensions in (None, 384):
        check_dimensions(dimensions, 384, None)  # a model without them: only the full size


@pytest.mark.parametrize("dimensions", [0, 1, 100, 385, 10_000])
def test_check_dimensions_rejects_other_sizes_listing_the_known_ones(dimensions):
    with pytest.raises(InvalidRequestError) as info:
        check_dimensions(dimensions, 384, (64, 128))
    assert info.value.param == "dimensions"
    assert "64, 128, 384" in info.value.message
    assert str(dimensions) in info.value.message


def test_check_dimensions_refuses_any_cut_of_a_model_not_trained_for_it():
    with pytest.raises(InvalidRequestError, match="not trained for shorter embeddings") as info:
        check_dimensions(128, 384, None, "output_dimension")
    assert info.value.param == "output_dimension"


def test_check_embedding_types_needs_calibration_for_int8_only():
    check_embedding_types(("float", "binary", "ubinary"), calibrated=False)
    check_embedding_types(("int8", "uint8"), calibrated=True)
    with pytest.raises(InvalidRequestError, match="calibrated ranges") as info:
        check_embedding_types(("float", "uint8"), calibrated=False)
    assert info.value.param == "embedding_types"


@pytest.mark.parametrize(("header", "expected"), [(None, 30.0), ("5", 5.0), ("0.25", 0.25), ("99", 30.0)])
def test_request_timeout_is_capped_by_the_default(header, expected):
    from preprocess.parsing import request_timeout

    assert request_timeout(header, 30.0) == expected


@pytest.mark.parametrize("header", ["soon", "0", "-2", "nan", "inf"])
def test_request_timeout_rejects_nonsense(header):
    from preprocess.parsing import request_timeout

    with pytest.raises(InvalidRequestError) as info:
        request_timeout(header, 30.0)
    assert info.value.param == "x-request-timeout"
