"""Serialize payloads to bytes: orjson for JSON, ormsgpack for MessagePack (both handle numpy natively)."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import ormsgpack

from contracts.outputs import (
    JSON,
    MSGPACK,
    MediaType,
    ModelOutput,
    ResponseOptions,
    SerializedResponse,
)
from postprocess.payloads import embeddings_payload, predict_payload
from postprocess.retrieval import cohere_embed_payload, rerank_payload, sparse_payload

_ORJSON_OPTS = orjson.OPT_SERIALIZE_NUMPY
_MSGPACK_OPTS = ormsgpack.OPT_SERIALIZE_NUMPY


def render(payload: Any, media_type: MediaType) -> bytes:
    if media_type == MSGPACK:
        return ormsgpack.packb(payload, option=_MSGPACK_OPTS)
    return orjson.dumps(payload, option=_ORJSON_OPTS)


def serialize(
    output: ModelOutput, options: ResponseOptions, decimals: int | None, ranges: np.ndarray | None = None
) -> SerializedResponse:
    """The serializer stage: model output + client options -> response bytes. ``ranges``: the model's
    calibrated int8 ranges (its manifest), for compact embedding types."""
    route = options.route
    payload: Any
    if route == "embeddings":
        payload = embeddings_payload(output, options, decimals, ranges)
    elif route == "cohere_embed":
        payload = cohere_embed_payload(output, options, decimals, ranges)
    elif route in ("rerank", "rerank_tei"):
        payload = rerank_payload(output, options, decimals)
    elif route == "embed_sparse":
        payload = sparse_payload(output, decimals)
    else:
        payload = predict_payload(output, options, decimals)
    return SerializedResponse(
        body=render(payload, options.media_type),
        media_type=options.media_type,
        model_version=output.model.version,
        input_tokens=output.token_count,
    )


def _quality(params: list[str]) -> float:
    for param in params:
        key, _, value = param.partition("=")
        if key.strip() == "q":
            try:
                return float(value)
            except ValueError:
                return 0.0
    return 1.0


def negotiate_media_type(accept: str | None) -> MediaType:
    """MessagePack when the client asks for it at least as strongly as for JSON; JSON otherwise."""
    if not accept or MSGPACK not in accept.lower():
        return JSON
    best = {JSON: 0.0, MSGPACK: 0.0}
    for media_range in accept.lower().split(","):
        media, *params = (part.strip() for part in media_range.split(";"))
        q = _quality(params)
        if media == MSGPACK:
            best[MSGPACK] = max(best[MSGPACK], q)
        elif media in (JSON, "application/*", "*/*"):
            best[JSON] = max(best[JSON], q)
    return MSGPACK if best[MSGPACK] > 0 and best[MSGPACK] >= best[JSON] else JSON
