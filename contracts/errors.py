"""The service's one error taxonomy.

Every error a client can see is one of these classes. Each carries an OpenAI-style ``type`` and a
stable ``code``; the HTTP status for each class is decided in exactly one place, the ingress
(``deployments/ingress/errors.py``). Arguments stay positional so the exceptions pickle across Ray.
"""

from __future__ import annotations

import math
from typing import ClassVar


class ServiceError(Exception):
    """Base of every error the service reports to a client."""

    type: ClassVar[str] = "server_error"
    code: ClassVar[str] = "internal_error"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message, param)
        self.message = message
        self.param = param

    def __str__(self) -> str:
        return self.message

    def headers(self) -> dict[str, str]:
        """HTTP headers this error's answer carries (WWW-Authenticate, Retry-After, rate limits)."""
        return {}


class InvalidRequestError(ServiceError):
    """The request is malformed or violates the API schema."""

    type = "invalid_request_error"
    code = "invalid_request"


class InvalidJSONError(InvalidRequestError):
    code = "invalid_json"


class InputTooLongError(InvalidRequestError):
    """An input has more tokens than the model accepts and the request did not ask to truncate."""

    code = "input_too_long"


class TooManyInputsError(InvalidRequestError):
    code = "too_many_inputs"


class UnsupportedMediaTypeError(InvalidRequestError):
    code = "unsupported_media_type"


class NotAcceptableError(InvalidRequestError):
    code = "not_acceptable"


class PayloadTooLargeError(InvalidRequestError):
    code = "payload_too_large"


class ModelNotFoundError(ServiceError):
    type = "not_found_error"
    code = "model_not_found"


class RouteNotFoundError(ServiceError):
    type = "not_found_error"
    code = "not_found"


class MethodNotAllowedError(InvalidRequestError):
    code = "method_not_allowed"


class UnsupportedTaskError(InvalidRequestError):
    """The route asks for something the served model's task cannot do (e.g. embeddings from a classifier)."""

    code = "unsupported_task"


class OverloadedError(ServiceError):
    """Refused at the door: the service's bounded queues are full. Retry after a moment."""

    type = "service_unavailable"
    code = "overloaded"


class UnavailableError(ServiceError):
    """A stage's replica died or is restarting; Ray Serve replaces it within seconds."""

    type = "service_unavailable"
    code = "unavailable"


class DeadlineExceededError(ServiceError):
    """The request's deadline passed before it could be answered; no model time was spent after that."""

    type = "timeout_error"
    code = "deadline_exceeded"


class NotReadyError(ServiceError):
    type = "service_unavailable"
    code = "not_ready"


class ModelExecutionError(ServiceError):
    """The model failed on this request's input (other requests of its batch were retried apart)."""

    type = "server_error"
    code = "model_error"


class InternalError(ServiceError):
    type = "server_error"
    code = "internal_error"


class AuthenticationError(ServiceError):
    """No API key, or one the service does not know (the answer never says which, nor echoes it)."""

    type = "authentication_error"
    code = "invalid_api_key"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": 'Bearer realm="textserve"'}


class PermissionDeniedError(ServiceError):
    """The key is valid but its tenant may not use this model."""

    type = "permission_error"
    code = "model_not_allowed"


class RateLimitedError(ServiceError):
    """The tenant's requests/s or input tokens/min bucket is empty; ``retry_after_s``: when it refills."""

    type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(
        self, message: str, retry_after_s: float = 1.0, limits: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.args = (message, retry_after_s, limits)  # pickles with its fields
        self.retry_after_s = retry_after_s
        self.limits = dict(limits or {})

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))} | self.limits
