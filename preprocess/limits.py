"""The names of the sizes a client plans with.

``GET /v1/models`` lists them in each model entry's ``limits`` (``deployments/ingress/limits.py``), and every
error for one of them names it with its value, so a 4xx points at the number to plan with.
"""

from __future__ import annotations

from typing import Final

MAX_INPUTS: Final = "max_inputs_per_request"  # texts (or token-id lists) per request
MAX_DOCUMENTS: Final = "max_documents_per_rerank"  # a rerank's documents
MAX_REQUEST_BYTES: Final = "max_request_bytes"  # the request body
MAX_TOKENS_PER_INPUT: Final = "max_tokens_per_input"  # the model's, special tokens and prompt included
MAX_CONTEXT_TOKENS: Final = "max_context_tokens"  # generate models: prompt plus generated tokens
MAX_NEW_TOKENS: Final = "max_new_tokens"  # generate models: the largest max_tokens a request may ask
TRUNCATION: Final = "truncation"  # what happens to an input over max_tokens_per_input
