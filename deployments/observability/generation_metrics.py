"""The generation engine's metrics (task ``generate``), exported through ``ray.serve.metrics``.

Ray prefixes each name with ``ray_`` and tags it with the deployment and replica. Names are part of the
public contract (monitoring/grafana, monitoring/alerts.yml, README).
"""

from __future__ import annotations

from collections.abc import Callable

from ray.serve import metrics

from deployments.observability.metrics import GaugeRefresher, model_info_gauge
from deployments.runtime.generate.engine import EngineStats

STATS_PERIOD_S = 1.0

_MS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000]
_ROWS = [1, 2, 4, 8, 16, 32, 64, 128]
_STEPS = [0.5, 1, 2, 3, 5, 10]  # Ray needs positive boundaries: 0 lands in the first bucket
BLOCK_TOKENS = 16  # KV slots are reported in blocks of this many tokens (a paged cache's usual block)


class GenerationMetrics:
    """``stats``: the engine's state, read every second by a thread (gauges), off the request path."""

    def __init__(self, model: str, info: dict[str, str], stats: Callable[[], EngineStats]) -> None:
        self.ttft_ms = metrics.Histogram(
            "generate_time_to_first_token_ms",
            description="From the request's arrival at the model to its first token.",
            boundaries=_MS,
            tag_keys=("model",),
        )
        self.itl_ms = metrics.Histogram(
            "generate_inter_token_latency_ms",
            description="Between consecutive tokens of one stream.",
            boundaries=_MS,
            tag_keys=("model",),
        )
        self.output_tokens = metrics.Counter(
            "generate_output_tokens", description="Tokens generated.", tag_keys=("model",)
        )
        self.prompt_tokens = metrics.Counter(
            "generate_prompt_tokens", description="Prompt tokens prefilled.", tag_keys=("model",)
        )
        self.requests = metrics.Counter(
            "generate_requests",
            description="Finished generations by finish reason (stop, length, cancelled, error).",
            tag_keys=("model", "finish"),
        )
        self.running = metrics.Gauge(
            "generate_running_sequences", description="Rows of the decode batch.", tag_keys=("model",)
        )
        self.waiting = metrics.Gauge(
            "generate_waiting_sequences",
            description="Requests queued or prefilling.",
            tag_keys=("model",),
        )
        self.kv_used = metrics.Gauge(
            "generate_kv_cache_blocks_used",
            description=f"KV cache blocks ({BLOCK_TOKENS} token slots per layer) reserved by the admitted "
            "requests: what admission checks (each request's whole generation, rows padded to the longest).",
            tag_keys=("model",),
        )
        self.kv_free = metrics.Gauge(
            "generate_kv_cache_blocks_free",
            description="KV cache blocks left of the configured kv_cache_tokens.",
            tag_keys=("model",),
        )
        self.prefix_blocks_used = metrics.Gauge(
            "generate_prefix_cache_blocks_used",
            description="Prefix cache blocks (generation.prefix_block_tokens each) held.",
            tag_keys=("model",),
        )
        self.prefix_blocks_free = metrics.Gauge(
            "generate_prefix_cache_blocks_free",
            description="Prefix cache blocks left of generation.prefix_cache_tokens.",
            tag_keys=("model",),
        )
        self.prefix_hit_tokens = metrics.Counter(
            "generate_prefix_cache_hit_tokens",
            description="Prompt tokens served from the prefix cache (not prefilled). Hit rate: this over "
            "generate_prefix_cache_prompt_tokens.",
            tag_keys=("model",),
        )
        self.prefix_prompt_tokens = metrics.Counter(
            "generate_prefix_cache_prompt_tokens",
            description="Prompt tokens looked up in the prefix cache.",
            tag_keys=("model",),
        )
        self.spec_proposed = metrics.Counter(
            "generate_spec_proposed_tokens",
            description="Speculative decoding: tokens proposed and checked.",
            tag_keys=("model",),
        )
        self.spec_accepted = metrics.Counter(
            "generate_spec_accepted_tokens",
            description="Speculative decoding: proposed tokens the model kept. Acceptance rate: this over "
            "generate_spec_proposed_tokens.",
            tag_keys=("model",),
        )
        self.spec_checks = metrics.Counter(
            "generate_spec_checks",
            description="Speculative decoding: rows checked (one per row per speculative step).",
            tag_keys=("model",),
        )
        self.spec_tokens = metrics.Counter(
            "generate_spec_tokens",
            description="Speculative decoding: tokens the checks gave (accepted plus the model's own). "
            "Tokens per model pass: this over generate_spec_checks.",
            tag_keys=("model",),
        )
        self.preemptions = metrics.Counter(
            "generate_preemptions",
            description="Sequences evicted from the batch to free cache (admission reserves: stays 0).",
            tag_keys=("model",),
        )
        self.batch_rows = metrics.Histogram(
            "generate_decode_batch_size",
            description="Rows per decode step.",
            boundaries=_ROWS,
            tag_keys=("model",),
        )
        self.cancel_lag = metrics.Histogram(
            "generate_cancel_lag_steps",
            description="Decode steps between a cancellation (client gone, deadline, stop string) and "
            "the sequence leaving the batch.",
            boundaries=_STEPS,
            tag_keys=("model",),
        )
        for metric in (
            self.ttft_ms,
            self.itl_ms,
            self.output_tokens,
            self.prompt_tokens,
            self.requests,
            self.running,
            self.waiting,
            self.kv_used,
            self.kv_free,
            self.prefix_blocks_used,
            self.prefix_blocks_free,
            self.prefix_hit_tokens,
            self.prefix_prompt_tokens,
            self.spec_proposed,
            self.spec_accepted,
            self.spec_checks,
            self.spec_tokens,
            self.preemptions,
            self.batch_rows,
            self.cancel_lag,
        ):
            metric.set_default_tags({"model": model})  # a new dict each: Ray adds its own tags to it
        self.model_info = model_info_gauge()
        self._info = dict(info, model=model)
        self._stats = stats
        self._counted: dict[str, int] = {}  # the engine's cumulative counts already added to the counters
        self._gauges = GaugeRefresher(self.refresh_gauges, STATS_PERIOD_S)

    def refresh_gauges(self) -> None:
        self.model_info.set(1, tags=dict(self._info))
        self.record_stats(self._stats())

    def record_stats(self, stats: EngineStats) -> None:
        self.running.set(stats.running)
        self.waiting.set(stats.waiting)
        used = -(-stats.kv_slots_used // BLOCK_TOKENS)
        self.kv_used.set(used)
        self.kv_free.set(stats.kv_slots_total // BLOCK_TOKENS - used)
        if stats.prefix is not None:
            self.prefix_blocks_used.set(stats.prefix.blocks_used)
            self.prefix_blocks_free.set(stats.prefix.blocks_total - stats.prefix.blocks_used)
            self._add(self.prefix_hit_tokens, "hit", stats.prefix.hit_tokens)
            self._add(self.prefix_prompt_tokens, "prompt", stats.prefix.prompt_tokens)
        if stats.spec is not None:
            self._add(self.spec_proposed, "proposed", stats.spec.proposed)
            self._add(self.spec_accepted, "accepted", stats.spec.accepted)
            self._add(self.spec_checks, "checks", stats.spec.checks)
            self._add(self.spec_tokens, "tokens", stats.spec.tokens)

    def _add(self, counter: metrics.Counter, name: str, total: int) -> None:
        """A counter from the engine's running total (read once a second, off the engine's thread)."""
        delta = total - self._counted.get(name, 0)
        if delta > 0:
            counter.inc(delta)
            self._counted[name] = total
