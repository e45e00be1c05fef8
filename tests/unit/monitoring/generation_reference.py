"""The generation engine's metrics (task ``generate``: deployments/observability/generation_metrics.py), as
Ray exports them, beside tests/support/monitoring.py's reference of the other service metrics.

They are kept apart from ``SERVICE_METRICS`` because the integration tests (tests/integration/test_metrics.py)
expect every ``SERVICE_METRICS`` series to move under an embedding service's traffic, which never runs the
generation engine. The unit tests of monitoring/ check the dashboard and the alerts against both.
A generate model's application is named after the model, like every model application, so these are model
application series: panels filter them by ``$model``, and no alert joins them with the router's.
"""

from __future__ import annotations

from tests.support.monitoring import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    KNOWN_SERIES,
    MODEL_SERIES,
    REQUIRED_ALERTS,
    SERVICE_METRICS,
    exported_series,
)

# "ray_" + the name given to ray.serve.metrics; every one is tagged `model` (and Ray's application,
# deployment, replica); other tags in the comments.
GENERATION_METRICS: dict[str, str] = {
    "ray_generate_time_to_first_token_ms": HISTOGRAM,  # arrival at the model -> first token
    "ray_generate_inter_token_latency_ms": HISTOGRAM,  # between consecutive tokens of one stream
    "ray_generate_decode_batch_size": HISTOGRAM,  # rows per decode step
    "ray_generate_cancel_lag_steps": HISTOGRAM,  # decode steps from a cancellation to leaving the batch
    "ray_generate_output_tokens": COUNTER,
    "ray_generate_prompt_tokens": COUNTER,
    "ray_generate_requests": COUNTER,  # finish ("stop", "length", "cancelled", "error")
    "ray_generate_preemptions": COUNTER,  # admission reserves the whole generation: stays 0
    "ray_generate_running_sequences": GAUGE,  # rows of the decode batch
    "ray_generate_waiting_sequences": GAUGE,  # queued or prefilling
    # Blocks of 16 token slots reserved by the admitted requests (each one's whole generation, prompt +
    # max_tokens, rows padded to the longest, plus speculative tokens): what admission checks.
    "ray_generate_kv_cache_blocks_used": GAUGE,
    "ray_generate_kv_cache_blocks_free": GAUGE,  # blocks left of kv_cache_tokens
    # Prefix caching (generation.prefix_cache_tokens, on by default; reported only while it is on): blocks
    # of generation.prefix_block_tokens held / left of its own budget; hit rate = hit / prompt tokens.
    "ray_generate_prefix_cache_blocks_used": GAUGE,
    "ray_generate_prefix_cache_blocks_free": GAUGE,
    "ray_generate_prefix_cache_hit_tokens": COUNTER,  # prompt tokens served from the cache, not prefilled
    "ray_generate_prefix_cache_prompt_tokens": COUNTER,  # prompt tokens looked up in the cache
    # Speculative decoding (only when generation.speculative is configured): acceptance rate = accepted /
    # proposed; tokens per model pass = spec_tokens / spec_checks.
    "ray_generate_spec_proposed_tokens": COUNTER,  # tokens proposed and checked
    "ray_generate_spec_accepted_tokens": COUNTER,  # proposed tokens the model kept
    "ray_generate_spec_checks": COUNTER,  # rows checked: one per row per speculative step
    "ray_generate_spec_tokens": COUNTER,  # tokens the checks gave: accepted plus the model's own
}
GENERATION_TAGS: dict[str, frozenset[str]] = {
    name: frozenset({"model", "finish"} if name == "ray_generate_requests" else {"model"})
    for name in GENERATION_METRICS
}
GENERATION_SERIES = frozenset(
    s for name, kind in GENERATION_METRICS.items() for s in exported_series(name, kind)
)
GENERATION_ALERTS = frozenset({"GenerationKVCacheExhausted", "GenerationQueueBacklog"})

# The references the monitoring/ unit tests check against: the support module's, and the generation ones.
ALL_SERVICE_METRICS: dict[str, str] = {**SERVICE_METRICS, **GENERATION_METRICS}
ALL_KNOWN_SERIES = frozenset(KNOWN_SERIES | GENERATION_SERIES)
ALL_MODEL_SERIES = frozenset(MODEL_SERIES | GENERATION_SERIES)
ALL_REQUIRED_ALERTS = REQUIRED_ALERTS | GENERATION_ALERTS
