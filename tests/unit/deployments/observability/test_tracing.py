"""Sampled tracing: one decision per request, stage spans under the request's root, cheap contexts."""

from __future__ import annotations

import dataclasses
import io
import pickle
import random
from collections.abc import Iterator
from unittest import mock

import orjson
import pytest
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from deployments.observability import tracing as tracing_mod
from deployments.observability.logs import configure_logging
from deployments.observability.tracing import (
    STAGES,
    LogSpanExporter,
    TraceContext,
    Tracing,
    configure_tracing,
    get_tracing,
    shutdown_tracing,
)

T0 = 1_750_000_000_000_000_000  # epoch ns


@pytest.fixture
def memory() -> Iterator[InMemorySpanExporter]:
    yield InMemorySpanExporter()


@pytest.fixture(autouse=True)
def _no_process_tracing() -> Iterator[None]:
    yield
    shutdown_tracing()


def _spans(t: Tracing, exporter: InMemorySpanExporter):
    assert t.force_flush()
    return exporter.get_finished_spans()


def _trace_request(t: Tracing, request_id: str) -> TraceContext | None:
    """What the ingress and the stages do for one request: decide, record the 4 stages, finish."""
    ctx = t.start_request(request_id)
    for i, stage in enumerate(STAGES):
        t.record_span(ctx, stage, T0 + 1000 * (i + 1), T0 + 1000 * (i + 2), {"stage.index": i})
    t.finish_request(ctx, T0, T0 + 10_000, {"http.route": "/v1/embeddings"})
    return ctx


def test_sampled_request_makes_a_root_and_four_children_in_one_trace(memory):
    t = Tracing(sample_ratio=1.0, exporter=memory)
    ctx = _trace_request(t, "req-1")
    assert ctx is not None
    spans = _spans(t, memory)
    assert sorted(s.name for s in spans) == sorted([*STAGES, "request"])
    assert {s.context.trace_id for s in spans} == {ctx.trace_id}
    (root,) = [s for s in spans if s.name == "request"]
    assert root.context.span_id == ctx.span_id and root.parent is None and root.kind is SpanKind.SERVER
    assert (root.start_time, root.end_time) == (T0, T0 + 10_000)
    assert root.attributes["request_id"] == "req-1" and root.attributes["http.route"] == "/v1/embeddings"
    for i, stage in enumerate(STAGES):
        (span,) = [s for s in spans if s.name == stage]
        assert span.parent is not None and span.parent.span_id == ctx.span_id
        assert span.context.span_id != ctx.span_id
        assert (span.start_time, span.end_time) == (T0 + 1000 * (i + 1), T0 + 1000 * (i + 2))
        assert span.attributes["request_id"] == "req-1" and span.attributes["stage.index"] == i
    t.shutdown()


def test_stage_in_another_process_links_whatever_its_own_ratio(memory):
    ingress = Tracing(sample_ratio=1.0, exporter=memory)
    other = InMemorySpanExporter()
    replica = Tracing(sample_ratio=0.0, exporter=other)  # the decision was the ingress's, not its own
    ctx = ingress.start_request("req-2")
    assert ctx is not None
    shipped = pickle.loads(pickle.dumps(ctx))  # what crossing a Ray process boundary does
    replica.record_span(shipped, "inference", T0, T0 + 5)
    (span,) = _spans(replica, other)
    assert span.context.trace_id == ctx.trace_id and span.parent.span_id == ctx.span_id
    assert span.parent.is_remote
    ingress.shutdown()
    replica.shutdown()


def test_ratio_zero_samples_nothing_and_exports_nothing(memory, monkeypatch):
    t = Tracing(sample_ratio=0.0, exporter=memory)
    # Disabled means not even a random id per request.
    monkeypatch.setattr(random, "getrandbits", mock.Mock(side_effect=AssertionError("drew an id")))
    assert all(_trace_request(t, f"r{i}") is None for i in range(1000))
    assert _spans(t, memory) == () and not t.enabled
    t.shutdown()


def test_ratio_matches_its_rate_within_statistical_tolerance():
    state = random.getstate()
    random.seed(20240611)
    try:
        t = Tracing(sample_ratio=0.01, exporter=InMemorySpanExporter())
        sampled = sum(t.start_request("r") is not None for _ in range(20_000))
        always = Tracing(sample_ratio=1.0, exporter=InMemorySpanExporter())
        assert all(always.start_request("r") is not None for _ in range(2_000))
    finally:
        random.setstate(state)
    # Binomial(20000, 0.01): mean 200, sd ~14.1; +-5 sd.
    assert 130 <= sampled <= 270
    t.shutdown()
    always.shutdown()


def test_unsampled_calls_do_no_work(memory):
    t = Tracing(sample_ratio=1.0, exporter=memory)
    processor = mock.Mock(spec=SpanProcessor)
    assert t.provider is not None
    t.provider.add_span_processor(processor)
    for stage in STAGES:
        t.record_span(None, stage, T0, T0 + 1)
    t.finish_request(None, T0, T0 + 1, {"k": "v"})
    processor.on_start.assert_not_called()
    processor.on_end.assert_not_called()
    assert _spans(t, memory) == ()
    t.record_span(t.start_request("r"), "tokenize", T0, T0 + 1)  # the same mock does see a sampled span
    assert processor.on_end.call_count == 1
    t.shutdown()


def test_trace_context_is_small_frozen_and_pickles():
    ctx = TraceContext(trace_id=(1 << 127) + 5, span_id=(1 << 63) + 7, request_id="a" * 32)
    raw = pickle.dumps(ctx, protocol=pickle.HIGHEST_PROTOCOL)
    assert pickle.loads(raw) == ctx and len(raw) < 200
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.span_id = 1  # type: ignore[misc]
    assert not hasattr(ctx, "__dict__")


def test_log_exporter_writes_json_lines_through_the_log_pipeline():
    stream = io.StringIO()
    pipeline = configure_logging(stream=stream)
    t = Tracing(sample_ratio=1.0, to_log=True)
    assert isinstance(t.exporter, LogSpanExporter)
    ctx = t.start_request("req-log")
    assert ctx is not None
    t.record_span(ctx, "tokenize", T0, T0 + 2_000_000)
    t.finish_request(ctx, T0, T0 + 3_000_000)
    t.shutdown()
    pipeline.stop()
    lines = [orjson.loads(line) for line in stream.getvalue().splitlines()]
    by_name = {line["span"]["name"]: line for line in lines}
    assert set(by_name) == {"tokenize", "request"}
    tokenize, root = by_name["tokenize"], by_name["request"]
    assert tokenize["request_id"] == "req-log" and tokenize["logger"] == "textserve"
    assert tokenize["span"]["trace_id"] == f"{ctx.trace_id:032x}" == root["span"]["trace_id"]
    assert tokenize["span"]["parent_id"] == f"{ctx.span_id:016x}" == root["span"]["span_id"]
    assert tokenize["span"]["duration_ms"] == 2.0 and tokenize["span"]["start_ns"] == T0
    assert root["span"]["parent_id"] is None and root["span"]["kind"] == "SERVER"


def test_otlp_endpoint_selects_the_http_exporter():
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    t = Tracing(sample_ratio=0.5, otlp_endpoint="http://127.0.0.1:4318")
    assert isinstance(t.exporter, OTLPSpanExporter)
    t.shutdown()  # nothing pending: no connection is made
    assert tracing_mod._traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert tracing_mod._traces_url("http://c:4318/") == "http://c:4318/v1/traces"
    assert tracing_mod._traces_url("https://c/custom/traces") == "https://c/custom/traces"


def test_nowhere_to_export_means_nothing_sampled():
    t = Tracing(sample_ratio=1.0, to_log=False)
    assert t.exporter is None and t.provider is None and not t.enabled
    assert t.start_request("r") is None
    t.record_span(TraceContext(1, 2, "r"), "tokenize", T0, T0 + 1)  # a context from elsewhere: ignored


@pytest.mark.parametrize("ratio", [-0.1, 1.5])
def test_ratio_out_of_range_is_refused(ratio):
    with pytest.raises(ValueError):
        Tracing(sample_ratio=ratio, exporter=InMemorySpanExporter())


def test_process_accessor_is_disabled_until_configured_and_replaces_cleanly():
    assert not get_tracing().enabled
    assert get_tracing() is get_tracing()
    first = configure_tracing(sample_ratio=1.0, to_log=True)
    assert get_tracing() is first and first.enabled
    with mock.patch.object(first, "shutdown", wraps=first.shutdown) as first_shutdown:
        second = configure_tracing(sample_ratio=0.5, to_log=True)
    first_shutdown.assert_called_once()
    assert get_tracing() is second and second.sample_ratio == 0.5
    shutdown_tracing()
    assert get_tracing() is not second and not get_tracing().enabled
