"""Response payloads of the retrieval routes: rerank (Cohere v2 / Jina, and TEI's shape), Cohere's embed
with compact types, and sparse embeddings (TEI's ``/embed_sparse``). Plain dicts holding numpy values."""

from __future__ import annotations

from typing import Any

import numpy as np

from contracts.errors import UnsupportedTaskError
from contracts.outputs import ModelOutput, RerankOptions, ResponseOptions, SparseRows
from postprocess.payloads import round_floats, shorten_embeddings, typed_embeddings, usage

# Sparse weights at or below this are left out: SPLADE's relu makes most of the vocabulary exactly 0.
SPARSE_THRESHOLD = 0.0


def rerank_scores(output: ModelOutput, raw: bool = False) -> np.ndarray:
    """One relevance score per document: a cross-encoder's activated logit, or (an embedding model) the
    cosine of the query (row 0) and each document."""
    values = output.values.astype(np.float64)
    if output.task == "rerank":
        logits = values[:, 0]
        if raw or output.activation == "identity":
            return logits
        return 1.0 / (1.0 + np.exp(-logits))
    if output.task == "embed":
        unit = values / np.maximum(np.linalg.norm(values, axis=1, keepdims=True), 1e-12)
        return unit[1:] @ unit[0]
    raise UnsupportedTaskError(f"model {output.model.name!r} is a {output.task} model and cannot rerank")


def ranked(scores: np.ndarray, top_n: int | None) -> list[int]:
    """Document indices by descending score (ties keep their order), cut to ``top_n``."""
    order = np.argsort(-scores, kind="stable").tolist()
    return order if top_n is None else order[:top_n]


def rerank_payload(output: ModelOutput, options: ResponseOptions, decimals: int | None) -> Any:
    """Cohere v2 and Jina (``/v1/rerank``, ``/v2/rerank``): ``results`` of index, relevance_score and, when
    asked, the document; TEI (``/rerank``): a bare list of index, score and, when asked, text."""
    opts = options.rerank or RerankOptions()
    scores = rerank_scores(output, opts.raw_scores)
    rounded = round_floats(scores, decimals).tolist()
    order = ranked(scores, opts.top_n)
    docs = opts.documents
    if options.route == "rerank_tei":
        return [
            {"index": i, "score": rounded[i]} | ({"text": docs[i]} if docs is not None else {}) for i in order
        ]
    results = [
        {"index": i, "relevance_score": rounded[i]}
        | ({"document": {"text": docs[i]}} if docs is not None else {})
        for i in order
    ]
    return {
        "id": options.request_id,
        "model": options.model_id or output.model.name,
        "model_version": output.model.version,
        "results": results,
        "usage": usage(output),
        "meta": {"billed_units": {"search_units": 1}, "tokens": {"input_tokens": output.token_count}},
    }


def cohere_embed_payload(
    output: ModelOutput, options: ResponseOptions, decimals: int | None, ranges: np.ndarray | None
) -> dict[str, Any]:
    """Cohere's ``POST /v2/embed`` answer (``embeddings_by_type``)."""
    values = shorten_embeddings(output.values, options.dimensions)
    types = options.embedding_types or ("float",)
    return {
        "id": options.request_id,
        "response_type": "embeddings_by_type",
        "embeddings": typed_embeddings(values, types, ranges, "float", decimals),
        "meta": {
            "api_version": {"version": "2"},
            "billed_units": {"input_tokens": output.token_count},
            "tokens": {"input_tokens": output.token_count},
        },
        "model": options.model_id or output.model.name,
        "model_version": output.model.version,
    }


def sparse_payload(output: ModelOutput, decimals: int | None) -> list[list[dict[str, Any]]]:
    """TEI's ``/embed_sparse``: per input, the vocabulary entries with a weight above the threshold."""
    if output.task != "sparse_embed":
        raise UnsupportedTaskError(
            f"model {output.model.name!r} is a {output.task} model and returns no sparse embeddings"
        )
    values = output.values
    sparse = values if isinstance(values, SparseRows) else SparseRows.of(values, SPARSE_THRESHOLD)
    rows = []
    for i in range(len(sparse)):
        index, weights = sparse.row(i)
        kept = weights > SPARSE_THRESHOLD
        rounded = round_floats(weights[kept].astype(np.float64), decimals).tolist()
        rows.append([{"index": c, "value": w} for c, w in zip(index[kept].tolist(), rounded, strict=True)])
    return rows
