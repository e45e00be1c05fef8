"""The generation routes of the ingress: OpenAI's ``/v1/completions`` and ``/v1/chat/completions``.

Each parses its body, routes by ``model`` and sends a ``GenerationJob`` to the model's generator. Without
``stream`` the answer is one JSON body. With it, the first piece is awaited before any byte is sent, so a
refusal (a prompt too long, a full queue) is still an HTTP error; then the pieces go out as server-sent
events, ``data: [DONE]`` last. An error after that is an error event. A client that disconnects cancels
the stream here, and with it the generation in the model's batch.
"""

# No `from __future__ import annotations`: FastAPI must see real annotations (Request) on the methods.
import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import Request
from ray.serve.handle import DeploymentResponseGenerator
from starlette.responses import Response, StreamingResponse

from contracts.errors import DeadlineExceededError, ModelExecutionError, ServiceError
from contracts.outputs import JSON, GenerationDelta
from contracts.tokenized import GenerationJob
from deployments.ingress.access import admission
from deployments.ingress.path import IngressPath
from deployments.ingress.retrieval import REQUEST_ID_HEADER
from deployments.pipeline.card import MODEL
from deployments.pipeline.remote_errors import as_service_error
from postprocess.completions import DONE, CompletionMeta, chunk, completion_body, error_event, usage_chunk
from preprocess.generation import ChatCompletionRequest, CompletionRequest
from preprocess.parsing import TIMEOUT_HEADER, request_timeout

# The generator ends a stream at the deadline itself; this is the backstop for a generator that went quiet.
GRACE_S = 5.0
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def completions(ingress: IngressPath, request: Request, chat: bool) -> Response:
    schema = ChatCompletionRequest if chat else CompletionRequest
    body = await ingress.parse_body(request, schema)
    route = ingress.route_for(body.model, "/v1/chat/completions" if chat else "/v1/completions")
    timeout = request_timeout(request.headers.get(TIMEOUT_HEADER), ingress.config.request_timeout_s)
    deadline = time.time() + timeout
    priority = admission().policy.priority
    job = GenerationJob(body, deadline, request.headers.get(REQUEST_ID_HEADER, ""), priority)
    meta = CompletionMeta.new(route.model, chat)
    headers = {"X-Model-Version": route.lane.version}
    handle = ingress.handle(route.model, MODEL)
    if not body.stream:
        call = handle.complete.remote(job)
        result: GenerationDelta = await _within(call, deadline, call.cancel)
        if result.error is not None:
            raise result.error
        if result.finish_reason is None or result.usage is None:
            raise ModelExecutionError("the generation ended without a finish")
        ingress.charge(result.usage.prompt_tokens)
        payload = completion_body(meta, result.text, result.finish_reason, result.usage)
        return Response(payload, media_type=JSON, headers=headers)
    stream: DeploymentResponseGenerator = handle.options(stream=True).generate.remote(job)
    try:
        first: GenerationDelta = await _within(stream.__anext__(), deadline, stream.cancel)
    except StopAsyncIteration:
        raise ModelExecutionError("the generation ended before it began") from None
    if first.error is not None:
        stream.cancel()
        raise first.error
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    events = _events(meta, first, stream, deadline, include_usage, ingress.charge)
    return StreamingResponse(events, media_type="text/event-stream", headers=headers | SSE_HEADERS)


async def _within(
    awaitable: Awaitable[GenerationDelta], deadline: float, cancel: Callable[[], None]
) -> GenerationDelta:
    """Await a piece until the deadline (plus grace), in the service's error taxonomy."""
    try:
        return await asyncio.wait_for(awaitable, max(0.0, deadline - time.time()) + GRACE_S)
    except asyncio.TimeoutError:
        cancel()
        raise DeadlineExceededError("no answer within the request's deadline") from None
    except asyncio.CancelledError:  # the client disconnected: Serve cancelled this handler
        cancel()
        raise
    except (StopAsyncIteration, ServiceError):
        raise
    except Exception as exc:  # the generator's replica failed as a whole (wrapped by Ray)
        raise as_service_error(exc) from None


async def _events(
    meta: CompletionMeta,
    first: GenerationDelta,
    stream: DeploymentResponseGenerator,
    deadline: float,
    include_usage: bool,
    charge: Callable[[int], None],
) -> AsyncIterator[bytes]:
    delta, opening = first, True
    try:
        while True:
            if delta.error is not None:
                yield error_event(delta.error.code, delta.error.message)
                break
            if delta.text or opening:
                yield chunk(meta, delta.text, None, first=opening)
                opening = False
            if delta.finish_reason is not None:
                if delta.usage is not None:
                    charge(delta.usage.prompt_tokens)
                yield chunk(meta, None, delta.finish_reason, first=False)
                if include_usage and delta.usage is not None:
                    yield usage_chunk(meta, delta.usage)
                break
            try:
                delta = await _within(stream.__anext__(), deadline, stream.cancel)
            except StopAsyncIteration:
                delta = GenerationDelta(error=ModelExecutionError("the generation ended without a finish"))
            except ServiceError as exc:
                delta = GenerationDelta(error=exc)
        yield DONE
    finally:  # done, or the client left (the response's task was cancelled): stop the generation
        stream.cancel()
