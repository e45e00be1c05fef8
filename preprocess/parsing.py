"""Turn raw HTTP bodies into validated request objects, raising the service's own errors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from contracts.errors import (
    InvalidJSONError,
    InvalidRequestError,
    ModelNotFoundError,
    PayloadTooLargeError,
    TooManyInputsError,
    UnsupportedMediaTypeError,
)
from preprocess.limits import MAX_DOCUMENTS, MAX_INPUTS, MAX_REQUEST_BYTES

RequestT = TypeVar("RequestT", bound=BaseModel)

_JSON_TYPES = ("application/json",)


def check_content_type(content_type: str | None) -> None:
    """Accept JSON bodies only (``application/json``, any charset parameter, or ``+json`` types)."""
    if content_type is None:
        raise UnsupportedMediaTypeError("Content-Type header is required: use application/json")
    media = content_type.split(";", 1)[0].strip().lower()
    if media not in _JSON_TYPES and not media.endswith("+json"):
        raise UnsupportedMediaTypeError(
            f"unsupported Content-Type {media!r}: use application/json", "content-type"
        )


def _describe(err: ValidationError, fields: set[str]) -> tuple[str, str | None]:
    """One readable message naming the field, e.g. ``input[1]: Input should be a valid string``.

    Of a union's branch errors the deepest is the most specific (a bad list element beats "not a
    string"); branch tags such as ``list[constrained-str]`` are dropped from the path.
    """
    errors = err.errors(include_url=False)
    # Deepest first; on a tie, a constraint violation ("too short") beats a wrong-branch type error.
    first = max(errors, key=lambda e: (len(e["loc"]), not e["type"].endswith("_type")))
    if first["type"] == "extra_forbidden":
        name = str(first["loc"][-1])
        return f"unknown field {name!r}; allowed: {', '.join(sorted(fields))}", name
    path = ""
    for part in first["loc"]:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in fields:
            path += f".{part}" if path else part
    msg = first["msg"].removeprefix("Value error, ")
    return (f"{path}: {msg}" if path else msg), (path or None)


def parse_body(body: bytes, content_type: str | None, schema: type[RequestT]) -> RequestT:
    """Parse ``body`` as JSON and validate it against ``schema``."""
    check_content_type(content_type)
    if not body:
        raise InvalidJSONError("request body is empty: send a JSON object")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSONError(f"request body is not valid JSON (UTF-8): {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequestError("request body must be a JSON object")
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        message, field = _describe(exc, set(schema.model_fields))
        raise InvalidRequestError(message, field) from None


def check_input_count(count: int, max_inputs: int, field: str = "input", limit: str = MAX_INPUTS) -> None:
    """400 ``too_many_inputs`` naming the body's field (``param``), the limit and its value."""
    if count > max_inputs:
        what = "documents" if limit == MAX_DOCUMENTS else "inputs"
        raise TooManyInputsError(
            f"too many {what} in {field!r}: {count} given, over the limit of {max_inputs} per request "
            f"({limit})",
            field,
        )


def check_body_size(size: int, max_bytes: int) -> None:
    """413 ``payload_too_large`` once a body (declared or read so far) is over ``max_bytes``."""
    if size > max_bytes:
        raise PayloadTooLargeError(
            f"request body is over the limit of {max_bytes} bytes ({MAX_REQUEST_BYTES})"
        )


def pinned_version(requested: str | None, name: str, versions: Sequence[str]) -> str | None:
    """The version a request pins with ``name:version``; None when it names no version (or no model).

    Only the served name and the versions served right now are accepted; anything else is a 404.
    """
    if requested is None or requested == name:
        return None
    prefix = f"{name}:"
    if requested.startswith(prefix) and requested[len(prefix) :] in versions:
        return requested[len(prefix) :]
    served = ", ".join(repr(f"{name}:{v}") for v in versions)
    raise ModelNotFoundError(
        f"model {requested!r} is not served here; available: {name!r} or one of {served}", "model"
    )


def check_dimensions(
    dimensions: int | None,
    model_dimension: int,
    matryoshka: Sequence[int] | None,
    field: str = "dimensions",
) -> None:
    """Shorter embeddings only where the model was trained for them (Matryoshka), at one of its sizes, as
    vLLM does; the full size is always accepted."""
    if dimensions is None or dimensions == model_dimension:
        return
    if not matryoshka:
        raise InvalidRequestError(
            f"{field}: this model was not trained for shorter embeddings (its manifest declares no "
            f"matryoshka_dimensions); its embeddings have {model_dimension}",
            field,
        )
    if dimensions not in matryoshka:
        sizes = ", ".join(str(d) for d in sorted({*matryoshka, model_dimension}))
        raise InvalidRequestError(f"{field} must be one of {sizes}, got {dimensions}", field)


TIMEOUT_HEADER = "x-request-timeout"


def request_timeout(header: str | None, default_s: float) -> float:
    """Seconds this request may take: the client's ``X-Request-Timeout`` (capped at the default)."""
    if header is None:
        return default_s
    try:
        value = float(header)
    except ValueError:
        raise InvalidRequestError(
            "X-Request-Timeout must be a number of seconds", "x-request-timeout"
        ) from None
    if not 0 < value < float("inf"):
        raise InvalidRequestError(
            "X-Request-Timeout must be a positive number of seconds", "x-request-timeout"
        )
    return min(value, default_s)


def check_embedding_types(types: Sequence[str], calibrated: bool) -> None:
    """int8 and uint8 need the model's calibrated ranges (its manifest); binary and float never do."""
    if not calibrated and any(t in ("int8", "uint8") for t in types):
        raise InvalidRequestError(
            "embedding_types int8 and uint8 need calibrated ranges, which this model's manifest lacks "
            "(python -m deployments.tools.calibrate); float, binary and ubinary work",
            "embedding_types",
        )
