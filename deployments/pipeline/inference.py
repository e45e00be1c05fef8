"""The batched inference deployment: ``@serve.batch`` over a backend runner (torch or ONNX Runtime).

The one place a model's batches form. Batches are bounded by sequences and by padded tokens; inside a
batch the runner sorts by length and cuts micro-batches. The wait window adapts to load, within configured
bounds, and applies only while a batch is on the model: a group that finds the model idle goes at once, so
the window is a maximum wait, never a minimum. A priority gate sits in front of the batch queue:
interactive groups enter at once, bulk ones a few at a time (``pipeline/priority.py``), so interactive work
never queues behind a backlog of bulk batches.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import ray
from ray import serve

from contracts.errors import ServiceError, UnavailableError
from contracts.outputs import ModelIdentity
from contracts.tokenized import EncodedTexts, Priority
from deployments.config import ObservabilityConfig, RuntimeConfig
from deployments.link.autoscaling import LINK_ONGOING
from deployments.link.server import LINK_DRAIN_S, LinkServer
from deployments.observability.metrics import GpuMonitor, InferenceMetrics
from deployments.observability.profiling import BatchProfiler
from deployments.observability.setup import setup_replica
from deployments.pipeline.batch_queue import QueuedGroup, ReplicaLimits, batch_size
from deployments.pipeline.group_runner import (
    Answers,
    Group,
    GroupRun,
    OutputMaker,
    device_gone,
    run_groups,
)
from deployments.pipeline.priority import PriorityGate, PriorityPolicy
from deployments.repository.manifest import ResolvedModel
from deployments.repository.resolve import recheck_on_replica
from deployments.runtime.backends import ready_runner
from deployments.runtime.batching import AdaptiveWaitWindow, BatchLimits
from deployments.runtime.cuda_memory import apply_alloc_conf
from deployments.user_config import BatchingConfig, PipelineConfig

log = logging.getLogger("textserve.inference")

_DEFAULTS = BatchingConfig()
_BULK_SHARE = PipelineConfig().batch_min_share  # until the pipeline's first call says otherwise
FAULT_INJECTION_ENV = "TEXTSERVE_FAULT_INJECTION"


# Each call is a group of requests from the model's pipeline; its batch queue holds up to
# max_ongoing_requests groups, Serve's queue the rest.
# max_surge_percent: blue-green (deployments/pipeline/model.py says why). The replacement needs room for a
# second replica while the old one drains: num_cpus 0.5 leaves it on a 2-core machine (on a cluster, a GPU).
@serve.deployment(
    name="Inference",
    ray_actor_options={"num_cpus": 0.5},
    max_ongoing_requests=128,
    max_queued_requests=256,
    max_surge_percent=100,
)
class InferenceDeployment:
    def __init__(
        self, model: ResolvedModel, device: str, runtime: RuntimeConfig, observability: ObservabilityConfig
    ) -> None:
        self._tracing = setup_replica(observability)
        profile = runtime.torch_profiler
        self._profiler = BatchProfiler(profile.enabled, profile.out_dir, profile.batches)
        apply_alloc_conf(runtime.cuda_alloc_conf)  # before the model touches CUDA
        recheck_on_replica(model, runtime.verify_checksums)
        manifest = model.manifest
        self._output = OutputMaker.of(model)
        self._identity = self._output.identity
        self._tokenizer_id = model.tokenizer_id
        self._runner = ready_runner(
            model,
            device,
            _DEFAULTS.max_batch_size,
            threads=runtime.intra_op_threads,
            cache_release_fraction=runtime.cuda_cache_release_fraction,
            parallel_passes=runtime.parallel_passes,
            graph=runtime.torch_graph,
        )
        # One thread runs the model so the event loop keeps admitting requests into the next batch.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")
        # Bulk groups one at a time, as the pipeline's groups; their guaranteed share comes with each call.
        self._gate = PriorityGate(PriorityPolicy(batch_slots=1, batch_min_share=_BULK_SHARE))
        self._apply(_DEFAULTS)
        self._metrics = InferenceMetrics(
            {
                "model": manifest.name,
                "version": manifest.version,
                "backend": self._runner.backend,
                "device": self._runner.device_name,
            }
        )
        self._gpu = GpuMonitor()
        self._running = 0  # sequences in the batch on the model now
        self._batches = 0  # batches in the handler now (on the model, or handing it their results)
        self._stats = {
            "batches": 0,
            "sequences": 0,
            "real_tokens": 0,
            "padded_tokens": 0,
            "isolated_failures": 0,
        }
        # The pipeline's groups from this node come over a Unix socket (pipeline/inference_calls.py).
        self._link = LinkServer.for_replica(self._from_link, by_deployment=True)
        if self._link is not None:
            self._link.start()  # Serve runs the constructor on the replica's event loop
        log.info(
            "model %s v%s ready: %s %s %s on %s",
            manifest.name,
            manifest.version,
            self._runner.backend,
            model.precision,
            self._runner.graph,
            self._runner.device_name,
        )

    def __del__(self) -> Coroutine[Any, Any, None] | None:
        # As the pipeline's (model.py): Serve awaits what this returns, once its own requests have drained.
        link, self._link = getattr(self, "_link", None), None
        return link.close(LINK_DRAIN_S) if link is not None else None

    def link_name(self) -> str | None:
        """This replica's socket (the pipeline uses it while this card keeps coming by Serve's handle)."""
        if self._link is None:
            return None
        self._link.start()
        return self._link.path.name

    def record_autoscaling_stats(self) -> dict[str, float]:
        """The groups in this replica that came over the link, which Serve's own count misses; the
        autoscaling policy adds them (deployments/link/autoscaling.py)."""
        return {LINK_ONGOING: float(self._link.in_flight if self._link is not None else 0)}

    async def _from_link(self, request: tuple[Group, Priority, float]) -> Answers:
        group, priority, batch_min_share = request
        return await self.infer(group, priority, batch_min_share)

    def _apply(self, config: BatchingConfig) -> None:
        self._batching = config
        self._limits = BatchLimits(config.micro_batch_size, config.micro_batch_tokens)
        ReplicaLimits.limits = BatchLimits(config.max_batch_size, config.max_batch_tokens)
        self._window = AdaptiveWaitWindow(config.batch_wait_timeout_s, config.min_wait_s, config.max_wait_s)
        self._infer_batch.set_max_batch_size(config.max_batch_size)
        self._infer_batch.set_batch_wait_timeout_s(0.0)  # idle: set per call (_wait_for_company)

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        self._apply(BatchingConfig.model_validate(user_config))

    async def infer(
        self, group: Group, priority: Priority = "interactive", batch_min_share: float = _BULK_SHARE
    ) -> Answers:
        """A group of requests' sequences, batched with whatever else is queued; errors pass through.
        ``priority``: the group's class (a group holds one), at the gate in front of the batch queue;
        ``batch_min_share``: the pipeline's setting in force (its user_config), so both places follow it."""
        if batch_min_share != self._gate.scheduler.policy.batch_min_share:
            policy = self._gate.scheduler.policy
            self._gate.scheduler.policy = replace(policy, batch_min_share=batch_min_share)
        group = [self._same_tokenizer(member) for member in group]
        queued = QueuedGroup(group, time.perf_counter(), time.time_ns())
        self._metrics.queue_changed(queued.requests)
        try:
            await self._gate.enter(priority)
            try:
                self._infer_batch.set_batch_wait_timeout_s(self._wait_for_company())
                return await self._infer_batch(queued)
            finally:
                self._gate.leave(priority, queued.busy_s)
        finally:
            if not queued.started:  # cancelled (its client left) before its batch started
                self._metrics.queue_changed(-queued.requests)

    def _wait_for_company(self) -> float:
        """The batch queue's window for the batch this call may start. ``@serve.batch`` waits out its
        window for a batch under the cap, even alone: on an idle model that is pure delay, so the window is
        0 there; with a batch on the model, a new one would wait for it anyway, so it may gather company
        meanwhile, for at most the window. (Serve reads the window when a batch's first item is taken.)"""
        if not self._batches:
            return 0.0
        return self._window.current_s if self._batching.adaptive_wait else self._batching.batch_wait_timeout_s

    def _same_tokenizer(self, member: EncodedTexts | ServiceError) -> EncodedTexts | ServiceError:
        if (
            isinstance(member, EncodedTexts)
            and member.tokenizer_id
            and member.tokenizer_id != self._tokenizer_id
        ):
            # A rolling update met two versions' stages: never run another tokenizer's ids; a retry meets one.
            return UnavailableError("the model is changing versions; retry shortly")
        return member

    @serve.batch(
        max_batch_size=_DEFAULTS.max_batch_size,
        batch_wait_timeout_s=_DEFAULTS.batch_wait_timeout_s,
        batch_size_fn=batch_size,
    )
    async def _infer_batch(self, queued: list[QueuedGroup]) -> list[Answers]:
        # Errors are answers here: a failing batch is retried request by request (run_groups), and an
        # exception that still escapes fails every future of this batch (Serve sets it on each).
        start = time.perf_counter()
        for q in queued:
            q.started = True
            self._metrics.queue_wait_ms.observe((start - q.arrived_s) * 1000.0)
        self._metrics.queue_changed(-sum(q.requests for q in queued))
        start_ns = time.time_ns()
        groups = [q.group for q in queued]
        if self._runner.fatal_error is not None:  # the device is gone: refuse (retryable) until replaced
            gone = device_gone()
            return [[m if isinstance(m, ServiceError) else gone for m in group] for group in groups]
        loop = asyncio.get_running_loop()
        running = sum(len(e) for g in groups for e in g if isinstance(e, EncodedTexts))
        self._running += running
        self._batches += 1
        try:
            run = await loop.run_in_executor(self._executor, self._run_on_model_thread, groups)
        finally:
            self._running -= running
            self._batches -= 1
        busy_s = time.perf_counter() - start
        for q in queued:
            q.busy_s = busy_s
        if any(e.trace is not None for q in queued for e in q.group if isinstance(e, EncodedTexts)):
            self._trace_batch(queued, start_ns, time.time_ns(), run.sequences)
        if run.sequences:
            self._metrics.record_batch(
                run.sequences, run.padded_tokens, run.real_tokens, time.perf_counter() - start
            )
            self._after_batch(run.sequences, run.real_tokens, run.padded_tokens)
        self._stats["isolated_failures"] += run.isolated_failures
        return run.answers

    def _run_on_model_thread(self, groups: list[Group]) -> GroupRun:
        with self._profiler.batch():  # a no-op unless runtime.torch_profiler.enabled
            return run_groups(self._runner, groups, self._limits, self._output)

    def _trace_batch(self, queued: list[QueuedGroup], start_ns: int, end_ns: int, sequences: int) -> None:
        for q in queued:
            for e in q.group:
                if isinstance(e, EncodedTexts) and e.trace is not None:
                    self._tracing.record_span(e.trace, "queue_wait", q.arrived_ns, start_ns)
                    self._tracing.record_span(
                        e.trace, "inference", start_ns, end_ns, {"batch_sequences": sequences}
                    )

    def _after_batch(self, sequences: int, real_tokens: int, padded_tokens: int) -> None:
        stats = self._stats
        stats["batches"] += 1
        stats["sequences"] += sequences
        stats["real_tokens"] += real_tokens
        stats["padded_tokens"] += padded_tokens
        if self._batching.adaptive_wait:
            self._window.observe(sequences, ReplicaLimits.limits.max_sequences)

    def batching(self) -> dict[str, Any]:
        """Settings in force, live state and counters; the pid shows reconfigure needs no restart."""
        padded = self._stats["padded_tokens"]
        return {
            **self._batching.model_dump(),
            "current_wait_s": self._window.current_s,
            "current_cap": self._runner.cap.current,
            "batch_queue_limits": [ReplicaLimits.limits.max_sequences, ReplicaLimits.limits.max_tokens],
            "padding_efficiency": self._stats["real_tokens"] / padded if padded else 1.0,
            **self._stats,
            "backend": self._runner.backend,
            "device": self._runner.device_name,
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "waiting": self._metrics.waiting,
            "held_at_gate": self._gate.waiting,
            "running": self._running,
        }

    def inject_device_error(self, message: str) -> int:
        """Fault injection for drills and tests: the next forward pass raises ``message`` as a device
        error would. Refused unless the replica runs with TEXTSERVE_FAULT_INJECTION=1. Returns the pid."""
        if os.environ.get(FAULT_INJECTION_ENV) != "1":
            raise PermissionError(
                f"fault injection is off (set {FAULT_INJECTION_ENV}=1 in the replica's env)"
            )
        self._runner.injected_error = RuntimeError(message)
        log.warning("fault injected: the next batch raises %r", message)
        return os.getpid()

    def check_health(self) -> None:
        """Ray Serve calls this periodically; raising marks the replica unhealthy and replaces it."""
        if self._runner.fatal_error is not None:
            raise RuntimeError(
                f"unrecoverable device error, replica must be replaced: {self._runner.fatal_error}"
            )

    def device(self) -> str:
        """Where this replica runs its model ("cpu", "cuda", "cuda:0"): the pipeline keeps a copy on a CPU."""
        return self._runner.device_name

    def ready(self) -> ModelIdentity:
        """Answered only once __init__ (load + warm-up) has finished."""
        return self._identity
