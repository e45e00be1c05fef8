"""Per-replica setup of logs and traces (each Ray Serve replica is its own process)."""

from __future__ import annotations

from deployments.config import ObservabilityConfig
from deployments.observability.logs import configure_logging
from deployments.observability.tracing import Tracing, configure_tracing

LOGGER = "textserve"  # every module logs under textserve.*; Ray's own loggers are left alone


def setup_replica(config: ObservabilityConfig) -> Tracing:
    """Start the async JSON log pipeline and this process's tracer; idempotent per process."""
    configure_logging(LOGGER, config.log_level, config.log_queue_size)
    return configure_tracing(
        sample_ratio=config.trace_sample_ratio,
        otlp_endpoint=config.otlp_endpoint,
        service_name=LOGGER,
        to_log=config.trace_to_log,
    )
