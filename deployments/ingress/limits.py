"""The sizes a client plans with: what ``GET /v1/models`` lists in each entry's ``limits``, and the count
check every request of the inputs routes passes. No Ray here.

Each limit has one source: the router's ``LimitsConfig`` (inputs and documents per request, body bytes) or
the model's card (its manifest's ``input.max_tokens``). Every error for one of them names it, with its value,
under the same name as in the listing (``preprocess/limits.py``).
"""

from __future__ import annotations

from typing import Any

from contracts.tokenized import TokenizeJob
from deployments.config import LimitsConfig
from deployments.pipeline.card import RERANK_ROUTES, LaneCard
from preprocess.limits import (
    MAX_CONTEXT_TOKENS,
    MAX_DOCUMENTS,
    MAX_INPUTS,
    MAX_NEW_TOKENS,
    MAX_REQUEST_BYTES,
    MAX_TOKENS_PER_INPUT,
    TRUNCATION,
)
from preprocess.parsing import check_input_count

# ``truncation``: an input over max_tokens_per_input is cut at its end (its first tokens kept) when the
# request asks (``truncate: true``; Cohere's ``truncate: "END"``, its default; Cohere rerank always cuts
# documents), else refused with 400 input_too_long. A generate model never cuts a prompt: over the context
# is a 400.
ON_REQUEST = "on_request"
NEVER = "none"


def lane_limits(lane: LaneCard, limits: LimitsConfig) -> dict[str, Any]:
    """One served version's ``limits`` in ``GET /v1/models``."""
    if lane.task == "generate":  # one prompt a request; the card's max_tokens is the model's context
        return {
            MAX_CONTEXT_TOKENS: lane.max_tokens,
            MAX_NEW_TOKENS: lane.max_new_tokens,
            MAX_REQUEST_BYTES: limits.max_body_bytes,
            TRUNCATION: NEVER,
        }
    out: dict[str, Any] = {
        MAX_INPUTS: limits.max_inputs_per_request,
        MAX_TOKENS_PER_INPUT: lane.max_tokens,
        MAX_REQUEST_BYTES: limits.max_body_bytes,
    }
    if any(route in RERANK_ROUTES for route in lane.routes):
        out[MAX_DOCUMENTS] = limits.max_documents_per_rerank
    out[TRUNCATION] = ON_REQUEST
    return out


def check_job_size(job: TokenizeJob, limits: LimitsConfig) -> None:
    """400 ``too_many_inputs`` when a request holds more inputs (a rerank: documents) than the router takes;
    ``param`` is the body's field that holds them."""
    count = len(job.token_ids) if job.token_ids is not None else len(job.texts)
    if job.query is None:
        check_input_count(count, limits.max_inputs_per_request, job.field, MAX_INPUTS)
    else:
        check_input_count(count, limits.max_documents_per_rerank, job.field, MAX_DOCUMENTS)
