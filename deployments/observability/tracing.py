"""Sampled OpenTelemetry tracing across the Serve stages, with one sampling decision per request.

The ingress decides (``start_request``) and passes a tiny ``TraceContext`` along with the request;
each stage reports its finished span with explicit times (``record_span``), so no OTel object ever
crosses a process and unsampled requests cost one comparison. Times are epoch nanoseconds
(``time.time_ns()``): spans from different processes must share one clock.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import urllib.parse
from collections.abc import Mapping, Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio, TraceIdRatioBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.util.types import AttributeValue

from contracts.tokenized import TraceContext

STAGES = ("tokenize", "queue_wait", "inference", "serialize")

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
# (trace_id, span_id) the next span started in this context must take: see _PresetIdGenerator.
_preset_ids: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "textserve_preset_ids", default=None
)


class _PresetIdGenerator(RandomIdGenerator):
    """Random ids, except while ``_preset_ids`` is set: then exactly those.

    The root span's id is chosen at the ingress, before any stage runs, because the stages' spans
    (other processes) name it as their parent; the root itself is only emitted when the request ends.
    The SDK has no "start a span with this id" API, but it asks the provider's id generator for both
    ids inside ``start_span``, so a contextvar set around that one call is the least intrusive hook.
    (The alternative, starting the root span at ``start_request`` and ending it later, would keep a
    live span per in-flight request in a table that leaks whenever a request never finishes.)
    """

    def generate_trace_id(self) -> int:
        preset = _preset_ids.get()
        return preset[0] if preset is not None else super().generate_trace_id()

    def generate_span_id(self) -> int:
        preset = _preset_ids.get()
        return preset[1] if preset is not None else super().generate_span_id()


_RANDOM_IDS = RandomIdGenerator()


class LogSpanExporter(SpanExporter):
    """Writes each finished span as one JSON line through a logger (the async pipeline in logs.py).

    Spans log at INFO, so they are shed like other INFO lines when the log queue is full.
    """

    def __init__(self, logger_name: str = "textserve") -> None:
        self._log = logging.getLogger(logger_name)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            ctx = span.get_span_context()
            attributes = dict(span.attributes or {})
            start, end = span.start_time or 0, span.end_time or 0
            record = {
                "name": span.name,
                "trace_id": f"{ctx.trace_id:032x}" if ctx else None,
                "span_id": f"{ctx.span_id:016x}" if ctx else None,
                "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
                "kind": span.kind.name,
                "start_ns": start,
                "end_ns": end,
                "duration_ms": (end - start) / 1e6,
                "status": span.status.status_code.name,
                "attributes": attributes,
            }
            request_id = attributes.get("request_id")
            self._log.info("span %s", span.name, extra={"span": record, "request_id": request_id})
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _traces_url(endpoint: str) -> str:
    """A bare collector address gets the OTLP/HTTP traces path; a full URL is kept as given."""
    if urllib.parse.urlsplit(endpoint).path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint


def _otlp_exporter(endpoint: str) -> SpanExporter:
    # Imported here: the package is only needed when traces go to a collector.
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise ImportError("otlp_endpoint needs the opentelemetry-exporter-otlp-proto-http package") from exc

    return OTLPSpanExporter(endpoint=_traces_url(endpoint))


class Tracing:
    """One replica's tracer provider: sampler, exporter, and the per-request span helpers."""

    def __init__(
        self,
        sample_ratio: float = 0.01,
        otlp_endpoint: str | None = None,
        service_name: str = "textserve",
        to_log: bool = True,
        exporter: SpanExporter | None = None,
    ) -> None:
        if not 0.0 <= sample_ratio <= 1.0:
            raise ValueError(f"sample_ratio must be within [0, 1], got {sample_ratio}")
        if exporter is None and otlp_endpoint:
            exporter = _otlp_exporter(otlp_endpoint)
        elif exporter is None and to_log:
            exporter = LogSpanExporter()
        self.sample_ratio = sample_ratio
        self.exporter = exporter
        self._ids = _PresetIdGenerator()
        # Nowhere to send spans: sample nothing rather than build spans that go nowhere.
        self._bound = TraceIdRatioBased.get_bound_for_rate(sample_ratio) if exporter is not None else 0
        self._provider: TracerProvider | None = None
        self._tracer: trace.Tracer | None = None
        if exporter is not None:
            # ParentBased(TraceIdRatio) applies the same rule to the same trace id as start_request,
            # so the provider agrees with the ingress's decision, and stage spans (remote sampled
            # parent) are always kept whatever this replica's own ratio.
            self._provider = TracerProvider(
                sampler=ParentBasedTraceIdRatio(sample_ratio),
                resource=Resource.create({"service.name": service_name}),
                id_generator=self._ids,
            )
            # Batched: spans are exported by the processor's thread, never on the request path.
            self._provider.add_span_processor(BatchSpanProcessor(exporter))
            self._tracer = self._provider.get_tracer("textserve")

    @property
    def enabled(self) -> bool:
        """Whether any request can be sampled (a ratio above 0 and somewhere to send spans)."""
        return self._bound > 0

    @property
    def provider(self) -> TracerProvider | None:
        """The SDK provider (None when there is no exporter), e.g. to add a span processor."""
        return self._provider

    def start_request(self, request_id: str) -> TraceContext | None:
        """The request's one sampling decision; None when unsampled."""
        if self._bound == 0:
            return None
        # TraceIdRatioBased's rule on a fresh random trace id: about as cheap as random.random(),
        # and the same decision any OTel sampler with this ratio would make for this trace.
        trace_id = _RANDOM_IDS.generate_trace_id()
        if trace_id & TraceIdRatioBased.TRACE_ID_LIMIT >= self._bound:
            return None
        return TraceContext(trace_id, _RANDOM_IDS.generate_span_id(), request_id)

    def record_span(
        self,
        ctx: TraceContext | None,
        name: str,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> None:
        """Emit a finished stage span, a child of the request's root span."""
        if ctx is None or self._tracer is None:
            return
        parent = NonRecordingSpan(
            SpanContext(ctx.trace_id, ctx.span_id, is_remote=True, trace_flags=_SAMPLED)
        )
        span = self._tracer.start_span(
            name,
            context=trace.set_span_in_context(parent),
            start_time=start_ns,
            attributes=_with_request_id(ctx, attributes),
        )
        span.end(end_time=end_ns)

    def finish_request(
        self,
        ctx: TraceContext | None,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> None:
        """Emit the root span "request" under the ids chosen by ``start_request``."""
        if ctx is None or self._tracer is None:
            return
        token = _preset_ids.set((ctx.trace_id, ctx.span_id))
        try:
            # An empty Context: never adopt a span that happens to be current as the parent.
            span = self._tracer.start_span(
                "request",
                context=Context(),
                kind=SpanKind.SERVER,
                start_time=start_ns,
                attributes=_with_request_id(ctx, attributes),
            )
        finally:
            _preset_ids.reset(token)
        span.end(end_time=end_ns)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._provider.force_flush(timeout_millis) if self._provider is not None else True

    def shutdown(self) -> None:
        """Export what is pending and stop the exporter."""
        if self._provider is not None:
            self._provider.shutdown()


def _with_request_id(
    ctx: TraceContext, attributes: Mapping[str, AttributeValue] | None
) -> dict[str, AttributeValue]:
    return {**(attributes or {}), "request_id": ctx.request_id}


_tracing: Tracing | None = None
_lock = threading.Lock()


def configure_tracing(
    sample_ratio: float = 0.01,
    otlp_endpoint: str | None = None,
    service_name: str = "textserve",
    to_log: bool = True,
) -> Tracing:
    """Set this process's tracing (each Ray replica is a process); replaces and flushes any previous one."""
    global _tracing
    with _lock:
        previous, _tracing = _tracing, Tracing(sample_ratio, otlp_endpoint, service_name, to_log)
        current = _tracing
    if previous is not None:
        previous.shutdown()
    return current


def get_tracing() -> Tracing:
    """This process's tracing; a disabled one (samples nothing, exports nothing) until configured."""
    global _tracing
    current = _tracing
    if current is not None:  # the per-request path: no lock once configured
        return current
    with _lock:
        if _tracing is None:
            _tracing = Tracing(sample_ratio=0.0, to_log=False)
        return _tracing


def shutdown_tracing() -> None:
    """Flush and drop this process's tracing; ``get_tracing`` then returns a disabled one."""
    global _tracing
    with _lock:
        previous, _tracing = _tracing, None
    if previous is not None:
        previous.shutdown()
