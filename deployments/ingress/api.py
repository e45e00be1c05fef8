"""The ingress's FastAPI app: its error handlers and accounting middleware, shared by the route modules
(``server.py``: embeddings, predict, models, health; ``retrieval.py``: rerank, Cohere embed, sparse,
tokenize). Errors become HTTP answers here, through ``errors`` only."""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException

from contracts.errors import ServiceError
from deployments.ingress.access import AccessControl
from deployments.ingress.accounting import RequestAccounting
from deployments.ingress.errors import handle_http_exception, handle_service_error


def body_doc(schema: type) -> dict[str, Any]:
    # The body is parsed by hand (for size limits and one error format) but documented in OpenAPI.
    json_schema = schema.model_json_schema(ref_template="#/components/schemas/{model}")
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": json_schema}}}}


api = FastAPI(
    title="textserve",
    version="0.1.0",
    description="Embeddings (dense, compact, sparse), reranking, text classification and tokenization.",
)
api.add_exception_handler(ServiceError, handle_service_error)
api.add_exception_handler(StarletteHTTPException, handle_http_exception)
api.add_exception_handler(Exception, handle_service_error)
api.add_middleware(AccessControl)  # inside the accounting: refusals at the door are counted too
api.add_middleware(RequestAccounting)
