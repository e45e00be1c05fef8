"""The service's own metrics, exported through ``ray.serve.metrics`` on Ray's Prometheus endpoint.

Ray prefixes every name with ``ray_`` and adds its application/deployment/replica tags. Each
deployment creates only the metrics it records, once, in its replica process. Names are part of the
public contract (dashboard, alert rules, README): change them only together with ``monitoring/``.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from ray.serve import metrics

log = logging.getLogger("ray.serve")

_MS = [0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]
_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
_TOKENS = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]
_RATIOS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0]
GPU_POLL_S = 5.0


class BatchMetrics:
    """Batch shape and timing wherever the model runs (Inference, or a CPU model's pipeline replica for
    small groups): batch sizes, padded tokens, padding, per-sample time and the wait before a batch,
    tagged by Ray with the deployment that ran the batch."""

    def __init__(self) -> None:
        self.batch_size = metrics.Histogram(
            "inference_batch_size", description="Sequences per executed batch.", boundaries=_SIZES
        )
        self.batch_tokens = metrics.Histogram(
            "inference_batch_tokens", description="Padded tokens per executed batch.", boundaries=_TOKENS
        )
        self.padding_efficiency = metrics.Histogram(
            "inference_padding_efficiency",
            description="Real tokens / padded tokens per executed batch.",
            boundaries=_RATIOS,
        )
        self.per_sample_ms = metrics.Histogram(
            "inference_per_sample_ms",
            description="Batch compute time / sequences in the batch.",
            boundaries=_MS,
        )
        # On both paths: with small groups on the pipeline's copy, Inference alone would leave it silent.
        self.queue_wait_ms = metrics.Histogram(
            "inference_queue_wait_ms",
            description="Arrival at the model (Inference, or the pipeline's copy) to the start of its "
            "batch, per call.",
            boundaries=_MS,
        )

    def record_batch(self, sequences: int, padded_tokens: int, real_tokens: int, compute_s: float) -> None:
        self.batch_size.observe(sequences)
        self.batch_tokens.observe(padded_tokens)
        self.padding_efficiency.observe(real_tokens / padded_tokens if padded_tokens else 1.0)
        self.per_sample_ms.observe(compute_s * 1000.0 / sequences)


class InferenceMetrics(BatchMetrics):
    """The inference deployment's: its batches (BatchMetrics), its queue length and which model it
    serves."""

    def __init__(self, info: dict[str, str]) -> None:
        super().__init__()
        self._info = info  # model, version, backend, device
        self.waiting = 0  # requests in groups waiting for a batch; the gauge reads it
        self.queue_length = metrics.Gauge(
            "inference_queue_length", description="Requests waiting for a batch in this replica."
        )
        self.model_info = model_info_gauge()
        self._gauges = GaugeRefresher(self.refresh_gauges)

    def refresh_gauges(self) -> None:
        self.model_info.set(1, tags=self._info)
        self.queue_length.set(self.waiting)

    def queue_changed(self, delta: int) -> None:
        self.waiting += delta
        self.queue_length.set(self.waiting)


def model_info_gauge() -> metrics.Gauge:
    """``model_info``: 1 for the model a replica serves (Inference, or a generate model's Model)."""
    return metrics.Gauge(
        "model_info",
        description="1 for the model this replica serves.",
        tag_keys=("model", "version", "backend", "device"),
    )


class StageMetrics:
    """Per-request time in a CPU stage (``tokenize_ms`` or ``serialize_ms``)."""

    def __init__(self, name: str, description: str) -> None:
        self.ms = metrics.Histogram(name, description=description, boundaries=_MS)


class IngressMetrics:
    def __init__(self) -> None:
        self.requests = metrics.Counter(
            "requests_total",
            description="Answered requests by route and HTTP status code.",
            tag_keys=("route", "status_code"),
        )
        self.rejected = metrics.Counter(
            "rejected_total",
            description="Requests refused without an answer from the model, by reason.",
            tag_keys=("reason",),
        )

        self.tenant_requests = metrics.Counter(
            "tenant_requests_total",
            description="Answered requests by tenant (its name, never a key) and HTTP status code.",
            tag_keys=("tenant", "status_code"),
        )

    def answered(self, route: str, status: int, rejected_reason: str | None, tenant: str) -> None:
        code = str(status)
        self.requests.inc(tags={"route": route, "status_code": code})
        self.tenant_requests.inc(tags={"tenant": tenant, "status_code": code})
        if rejected_reason is not None:
            self.rejected.inc(tags={"reason": rejected_reason})


# The ingress's module-level counters: made on first use (in the replica, where Ray's metrics exist), once.
@functools.cache
def _tenant_tokens() -> metrics.Counter:
    return metrics.Counter(
        "tenant_input_tokens_total",
        description="Input tokens of answered requests, by tenant.",
        tag_keys=("tenant",),
    )


def tenant_input_tokens(tenant: str, tokens: int) -> None:
    """Input tokens a tenant's answered requests used (what its tokens/min limit counts)."""
    counter = _tenant_tokens()
    if tokens > 0:
        counter.inc(tokens, tags={"tenant": tenant})


# Calls between replicas by transport: ``link`` (a Unix socket to a replica on this node) or ``handle``
# (Serve's). Serve's own per-deployment counters see only the second.
@functools.cache
def _calls(callee: str) -> metrics.Counter:
    if callee == "model":
        return metrics.Counter(
            "model_calls_total",
            description="Router calls to a model's pipeline, by transport (link or handle).",
            tag_keys=("transport",),
        )
    return metrics.Counter(
        "inference_calls_total",
        description="A model pipeline's calls to its Inference deployment, by transport (link or handle).",
        tag_keys=("transport",),
    )


def model_call(transport: str) -> None:
    """One router call to a model's pipeline, by how it went (``link`` or ``handle``)."""
    _calls("model").inc(tags={"transport": transport})


def inference_call(transport: str) -> None:
    """One pipeline call (a group) to the model's Inference, by how it went (``link`` or ``handle``)."""
    _calls("inference").inc(tags={"transport": transport})


class GaugeRefresher:
    """Re-sets gauges every few seconds from a daemon thread: Ray exports a gauge only while it is being
    set (a value set once, e.g. model_info at start, disappears from the endpoint), and a periodic
    read keeps the request path free of it."""

    def __init__(self, refresh: Callable[[], None], interval_s: float = GPU_POLL_S) -> None:
        self._refresh = refresh
        self._stop = threading.Event()
        refresh()
        threading.Thread(target=self._loop, args=(interval_s,), name="gauges", daemon=True).start()

    def _loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self._refresh()
            except Exception:  # a failed read must not kill the thread or the replica
                log.warning("gauge refresh failed", exc_info=True)

    def stop(self) -> None:
        self._stop.set()


class GpuMonitor:
    """NVML gauges per visible GPU, polled off the request path. On a machine without NVML or GPUs
    nothing is created, so the gauges are absent rather than reported as zero."""

    def __init__(self, interval_s: float = GPU_POLL_S) -> None:
        self._handles = _nvml_handles()
        if not self._handles:
            return
        self.utilization = metrics.Gauge(
            "gpu_utilization_percent", description="GPU utilization (NVML).", tag_keys=("device",)
        )
        self.memory_used = metrics.Gauge(
            "gpu_memory_used_bytes", description="GPU memory in use (NVML).", tag_keys=("device",)
        )
        self._poller = GaugeRefresher(self.poll, interval_s)

    @property
    def active(self) -> bool:
        return bool(self._handles)

    def poll(self) -> None:
        import pynvml

        for device, handle in self._handles.items():
            tags = {"device": device}
            self.utilization.set(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu, tags=tags)
            self.memory_used.set(pynvml.nvmlDeviceGetMemoryInfo(handle).used, tags=tags)


def _nvml_handles() -> dict[str, Any]:
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception:  # no driver / library: a CPU machine
        return {}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    indexes = range(count)
    if visible is not None:  # Ray sets this to the replica's GPUs
        indexes = [int(v) for v in visible.split(",") if v.strip().isdigit() and int(v) < count]
    return {str(i): pynvml.nvmlDeviceGetHandleByIndex(i) for i in indexes}


def rejected_reason(code: str) -> str | None:
    """Why a request was refused before the model answered it; None for answers and model errors."""
    if code in ("overloaded", "unavailable", "not_ready"):
        return code
    if code == "deadline_exceeded":
        return "deadline"
    if code in ("internal_error", "model_error"):
        return None
    if code in ("invalid_api_key", "model_not_allowed"):
        return "unauthorized"
    if code == "rate_limit_exceeded":
        return "rate_limited"
    if code in ("payload_too_large", "too_many_inputs", "input_too_long"):
        return "too_large"
    return "invalid"  # every other 4xx: bad input, unknown model or route, ...
