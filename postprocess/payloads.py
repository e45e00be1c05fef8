"""Build response payloads (plain dicts holding numpy rows) from model outputs."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from contracts.errors import InvalidRequestError, UnsupportedTaskError
from contracts.outputs import ModelOutput, ResponseOptions
from postprocess.quantize import quantize
from preprocess.tokenize import TokenDetails


def shorten_embeddings(values: np.ndarray, dimensions: int | None) -> np.ndarray:
    """Keep the first ``dimensions`` components and L2-normalize again (OpenAI's ``dimensions``)."""
    if dimensions is None or dimensions == values.shape[1]:
        return values
    if not 1 <= dimensions <= values.shape[1]:
        raise InvalidRequestError(
            f"dimensions must be between 1 and {values.shape[1]}, got {dimensions}", "dimensions"
        )
    cut = values[:, :dimensions]
    norms = np.linalg.norm(cut, axis=1, keepdims=True)
    return (cut / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


def round_floats(values: np.ndarray, decimals: int | None) -> np.ndarray:
    return values if decimals is None else np.round(values, decimals)


def encode_rows(values: np.ndarray, encoding_format: str, decimals: int | None) -> list[Any]:
    """One entry per row: a float32 row (serialized natively) or base64 of little-endian float32."""
    if encoding_format == "base64":
        raw = np.ascontiguousarray(values, dtype="<f4")
        return [base64.b64encode(row.tobytes()).decode("ascii") for row in raw]
    return list(round_floats(values, decimals))


def typed_embeddings(
    values: np.ndarray,
    types: tuple[str, ...],
    ranges: np.ndarray | None,
    encoding_format: str,
    decimals: int | None,
) -> dict[str, list[Any]]:
    """Each asked-for type, one entry per text (float rows follow ``encoding_format`` and rounding)."""
    out: dict[str, list[Any]] = {}
    for kind in types:
        if kind == "float":
            out[kind] = encode_rows(values, encoding_format, decimals)
        else:
            out[kind] = list(quantize(values, kind, ranges))
    return out


def usage(output: ModelOutput) -> dict[str, int]:
    return {"prompt_tokens": output.token_count, "total_tokens": output.token_count}


def embeddings_payload(
    output: ModelOutput, options: ResponseOptions, decimals: int | None, ranges: np.ndarray | None = None
) -> dict[str, Any]:
    """OpenAI ``/v1/embeddings`` response body. With ``embedding_types`` (an extension), each item also
    holds ``embeddings``: every asked-for type, and ``embedding`` is the first of them."""
    if output.task != "embed":
        raise UnsupportedTaskError(
            f"model {output.model.name!r} is a {output.task} model and returns no embeddings; "
            "use POST /predict"
        )
    values = shorten_embeddings(output.values, options.dimensions)
    if options.embedding_types:
        typed = typed_embeddings(values, options.embedding_types, ranges, options.encoding_format, decimals)
        first = typed[options.embedding_types[0]]
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": first[i],
                "embeddings": {k: v[i] for k, v in typed.items()},
            }
            for i in range(len(values))
        ]
    else:
        rows = encode_rows(values, options.encoding_format, decimals)
        data = [{"object": "embedding", "index": i, "embedding": r} for i, r in enumerate(rows)]
    return {
        "object": "list",
        "data": data,
        "model": options.model_id or output.model.name,
        "model_version": output.model.version,
        "usage": usage(output),
    }


def classification_rows(
    probs: np.ndarray, labels: tuple[str, ...], decimals: int | None
) -> list[list[dict[str, Any]]]:
    """Per input, every label with its probability, most likely first."""
    order = np.argsort(-probs, axis=1, kind="stable")
    # Round in float64: float32 values widened by tolist() would print as 0.8765000104904175.
    scores = round_floats(probs.astype(np.float64), decimals).tolist()
    return [
        [{"label": labels[j], "score": row_scores[j]} for j in row_order]
        for row_order, row_scores in zip(order.tolist(), scores, strict=True)
    ]


def predict_payload(output: ModelOutput, options: ResponseOptions, decimals: int | None) -> dict[str, Any]:
    """``/predict`` response body: embeddings or label lists, always with the model version."""
    body: dict[str, Any] = {
        "model": options.model_id or output.model.name,
        "version": output.model.version,
        "task": output.task,
    }
    if output.task == "embed":
        body["embeddings"] = encode_rows(output.values, options.encoding_format, decimals)
    else:
        body["predictions"] = classification_rows(output.values, output.labels, decimals)
    body["usage"] = usage(output)
    if output.truncated:
        body["truncated_inputs"] = output.truncated
    return body


def tokenize_payload(
    model_id: str, version: str, prompt: str, details: list[TokenDetails], offsets: bool
) -> dict[str, Any]:
    """``/tokenize``: per input its ids (special tokens and prompt included), their count and, when asked,
    each token's character offsets into ``prompt + text`` (special tokens: [0, 0])."""
    data = []
    for i, d in enumerate(details):
        item: dict[str, Any] = {"index": i, "ids": d.ids, "count": len(d.ids)}
        if offsets:
            item["offsets"] = [list(o) for o in d.offsets]
        data.append(item)
    total = sum(len(d.ids) for d in details)
    return {
        "model": model_id,
        "model_version": version,
        "prompt": prompt,
        "data": data,
        "usage": {"total_tokens": total},
    }
