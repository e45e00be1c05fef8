"""What logging and tracing cost on the request path, per request, measured in isolation.

    python -m bench.observability_cost [--requests 20000] [--req-per-s 60]

Times the calls a request makes on its own thread with the default observability settings (one
access-log line through the async queue, one sampling decision at ratio 0.01, the spans of the
sampled ones) against the same calls with both off, and prints the cost per request and as a share
of one core at the given request rate. Complements the side-by-side service benchmark, whose
run-to-run noise (about 10 % on 2 shared cores) is larger than the effect.
"""

from __future__ import annotations

import argparse
import io
import logging
import time

from deployments.config import ObservabilityConfig
from deployments.observability.logs import configure_logging, set_request_id
from deployments.observability.tracing import Tracing


def per_request_us(config: ObservabilityConfig, requests: int) -> tuple[float, float]:
    """(time on the request's own thread, all CPU including the log thread's drain), per request."""
    pipeline = configure_logging(
        "textserve.costbench", config.log_level, config.log_queue_size, io.StringIO()
    )
    log = logging.getLogger("textserve.costbench.access")
    tracing = Tracing(config.trace_sample_ratio, None, to_log=False) if config.trace_sample_ratio else None
    start, cpu_start = time.perf_counter(), time.process_time()
    for i in range(requests):
        request_id = f"{i:032x}"
        set_request_id(request_id)
        ctx = tracing.start_request(request_id) if tracing is not None else None
        if config.access_log:
            log.info("%s %s %d", "POST", "/v1/embeddings", 200, extra={"route": "embeddings", "ms": 1.0})
        if tracing is not None and ctx is not None:
            now = time.time_ns()
            for stage in ("tokenize", "queue_wait", "inference", "serialize"):
                tracing.record_span(ctx, stage, now - 1000, now)
            tracing.finish_request(ctx, now - 5000, now)
    elapsed = time.perf_counter() - start
    pipeline.stop()  # drains the queue: the log thread's formatting and writing is counted below
    if pipeline.dropped:
        raise RuntimeError(f"{pipeline.dropped} log lines dropped: the measurement would be too low")
    if tracing is not None:
        tracing.shutdown()
    cpu = time.process_time() - cpu_start
    return elapsed / requests * 1e6, cpu / requests * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--req-per-s", type=float, default=60.0, help="request rate to express the share at")
    ns = parser.parse_args(argv)
    # A queue as long as the run, so that no line is dropped: every one is formatted and written.
    on = ObservabilityConfig(log_queue_size=ns.requests + 1)
    off = ObservabilityConfig(access_log=False, trace_sample_ratio=0.0)
    per_request_us(on, 2000)  # warm-up
    on_thread, on_cpu = min(per_request_us(on, ns.requests) for _ in range(3))
    off_thread, off_cpu = min(per_request_us(off, ns.requests) for _ in range(3))
    print(f"defaults (access log + {on.trace_sample_ratio:g} sampling): {on_thread:.1f} us on the request's")
    print(f"  thread, {on_cpu:.1f} us of CPU in all (log thread included), per request")
    print(f"both off: {off_thread:.1f} us on the thread, {off_cpu:.1f} us of CPU")
    extra = on_cpu - off_cpu
    print(
        f"cost: {on_thread - off_thread:.1f} us of request latency and {extra:.1f} us of CPU per request; "
        f"at {ns.req_per_s:g} req/s that is {extra * ns.req_per_s / 1e4:.2f} % of one core"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
