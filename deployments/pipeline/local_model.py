"""A CPU model's own copy in its pipeline replica, for small groups: one Ray hop fewer at light load.

A group of at most ``inline_chars`` characters is tokenized, run and serialized in the ``Model`` replica
itself. On a CPU the model costs only memory to load twice, while the round trip to the Inference replica
costs about 2.5 ms of the ~24 ms a short text takes from one client (docs/architecture.md measures it).
Larger groups still go to Inference, whose batches span the pipeline's groups. The copy is loaded only once
the version's Inference replica says it runs its model on a CPU: on a GPU the model runs in Inference
alone (the pipeline replica holds no GPU). Until the copy is loaded, small groups go to Inference too.
At light load groups take both cores, one after another, where that was measured (runtime/lone_pass.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from contracts.tokenized import EncodedTexts
from deployments.config import RuntimeConfig
from deployments.observability.metrics import BatchMetrics
from deployments.observability.tracing import Tracing
from deployments.pipeline.batching import BatchLimits
from deployments.pipeline.detached import start_detached
from deployments.pipeline.group_runner import Answers, Group, GroupRun, OutputMaker, run_groups
from deployments.repository.manifest import ResolvedModel
from deployments.repository.resolve import recheck_on_replica
from deployments.runtime.backends import ready_runner
from deployments.runtime.heap import freeze_loaded_heap
from deployments.runtime.lone_pass import LonePass
from deployments.user_config import BatchingConfig

log = logging.getLogger("textserve.pipeline")

# Small groups only: a few micro-batches of Inference's default shape, and a short warm-up.
_MICRO = BatchingConfig()
_WARM_UP_BATCH = 4


DEVICE_TIMEOUT_S = 10.0
DEVICE_RETRY_S = 2.0


class LocalModel:
    """One version's model in the pipeline replica, on ``workers`` threads of its own (the event loop
    stays free): one per group the pipeline keeps in flight, so a group that forms while another runs
    starts at once on the other core instead of queuing behind it. Measured on 2 cores, A/B in one run
    (docs/architecture.md): open-loop p99 at 10-30 req/s 35-107 ms against 49-125 with one thread, single
    texts at concurrency 8 +21-25 %."""

    def __init__(
        self,
        model: ResolvedModel,
        runtime: RuntimeConfig,
        metrics: BatchMetrics,
        tracing: Tracing,
        workers: int,
    ) -> None:
        recheck_on_replica(model, runtime.verify_checksums)

        self._runner = ready_runner(
            model,
            "cpu",
            _WARM_UP_BATCH,
            threads=runtime.intra_op_threads,
            parallel_passes=runtime.parallel_passes,
            graph=runtime.torch_graph,
        )
        self._output = OutputMaker.of(model)
        self._limits = BatchLimits(_MICRO.micro_batch_size, _MICRO.micro_batch_tokens)
        self._metrics = metrics
        self._tracing = tracing
        # Each worker runs its group's passes with intra_op_threads (one by default): two groups at once
        # use both cores, where one group on a single thread would leave the other core idle.
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="local-model")
        self._lone = (
            LonePass.for_copy(
                model,
                self._runner,
                runtime.verify_checksums,
                runtime.lone_pass_max_overlap,
                copy_threads=runtime.intra_op_threads,
                torch_lengths=runtime.lone_pass == "auto",
            )
            if runtime.lone_pass != "off"
            else None
        )
        self._running = 0  # groups in the copy now, on either runner
        self._beside = 0  # of them, on the one-thread copy: a lone pass never queues behind those
        log.info("small groups run in the pipeline replica: %s on CPU", self._runner.backend)

    async def infer(self, group: Group) -> Answers:
        """The group's answers, one per member; members that failed upstream pass through untouched."""
        arrived_ns = time.time_ns()
        started: list[int] = []

        lone = self._lone
        if lone is not None and not lone.overlaps.takes(self._running, self._beside):
            lone = None
        runner, executor = (
            (lone.runner_for(_longest(group)), lone.executor)
            if lone is not None
            else (self._runner, self._executor)
        )
        beside = lone is None
        self._beside += beside

        def run() -> GroupRun:
            started.append(time.time_ns())  # the wait for this replica's model thread ends here
            return run_groups(runner, [group], self._limits, self._output)

        self._running += 1
        try:
            result = await asyncio.get_running_loop().run_in_executor(executor, run)
        finally:
            self._running -= 1
            self._beside -= beside
        end_ns = time.time_ns()
        self._metrics.queue_wait_ms.observe((started[0] - arrived_ns) / 1e6)
        if result.sequences:
            elapsed = (end_ns - started[0]) / 1e9
            self._metrics.record_batch(result.sequences, result.padded_tokens, result.real_tokens, elapsed)
        for member in group:  # the same spans as Inference's, so a trace reads alike on either path
            if isinstance(member, EncodedTexts) and member.trace is not None:
                self._tracing.record_span(member.trace, "queue_wait", arrived_ns, started[0])
                attributes = {"batch_sequences": result.sequences, "in_pipeline": True}
                self._tracing.record_span(member.trace, "inference", started[0], end_ns, attributes)
        return result.answers[0]


def _longest(group: Group) -> int:
    return max((m.longest for m in group if isinstance(m, EncodedTexts)), default=0)


class LocalModels:
    """The served versions' local copies: each loaded in the background (``start``), on a thread, once its
    Inference replica answers that it runs on a CPU. ``inference``: each version's Inference handle;
    ``workers``: the groups a copy runs at once."""

    def __init__(
        self,
        models: dict[str, ResolvedModel],
        inference: dict[str, Any],
        runtime: RuntimeConfig,
        tracing: Tracing,
        workers: int,
    ) -> None:
        self._models = models
        self._workers = workers
        self._tracing = tracing
        self._inference = inference
        self._runtime = runtime
        self._loaded: dict[str, LocalModel] = {}
        self._loading: asyncio.Task[None] | None = None

    def get(self, version: str) -> LocalModel | None:
        return self._loaded.get(version)

    def start(self) -> None:
        """Begin loading (once; needs the replica's running event loop)."""
        if self._loading is None and self._runtime.small_groups_in_pipeline:
            # Detached from the request that starts it: a first health probe that timed out while Inference
            # was still loading used to cancel the load with it, and small groups then never ran here.
            self._loading = start_detached(self._load_all())

    async def _load_all(self) -> None:
        try:
            await self._load_each()
        except asyncio.CancelledError:  # the replica is stopping; never a silent end
            log.warning("loading the pipeline's model copies stopped: small groups go to Inference")
            raise

    async def _load_each(self) -> None:
        metrics = BatchMetrics()
        for version, model in self._models.items():
            device = await self._device(version)
            if device != "cpu":
                log.info("version %s runs on %s: small groups go to Inference", version, device)
                continue
            loop = asyncio.get_running_loop()
            try:
                local = await loop.run_in_executor(
                    None, LocalModel, model, self._runtime, metrics, self._tracing, self._workers
                )
            except Exception:  # small groups keep going to Inference; the service is no worse off
                log.exception("could not load version %s in the pipeline replica", version)
                continue
            # Before the copy takes requests: the one full collection this costs runs while small groups
            # still go to Inference, and later ones no longer scan the copy's heap (runtime/heap.py).
            await loop.run_in_executor(None, freeze_loaded_heap)
            self._loaded[version] = local

    async def _device(self, version: str) -> str:
        """Where the version's Inference replica runs its model; asked until it answers (it may load)."""
        while True:
            call = self._inference[version].device.remote()
            try:
                return str(await asyncio.wait_for(call, DEVICE_TIMEOUT_S))
            except Exception as exc:
                call.cancel()
                log.debug("no device from version %s's Inference yet: %r", version, exc)
            await asyncio.sleep(DEVICE_RETRY_S)
