"""A ``generate`` model's application ingress: prompt → continuous-batching engine → streamed text.

The router sends each completion here (``generate`` streams pieces, ``complete`` answers once). The prompt
is tokenized here with the model's chat template (``preprocess/generation.py``); the engine
(``runtime/generate/engine.py``) batches every running request's decode steps on its own thread; each
token is detokenized and checked for stop strings here (``postprocess/detokenize.py``). Tokenizer and
serializer stay in this replica, unlike an encoder's stages: a hop per token would cost more than the
work it moves. A request's stream ends at its deadline, a stop, ``max_tokens`` or its client leaving;
each of these takes it out of the batch within one decode step.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import torch
from ray import serve
from tokenizers import Tokenizer

from contracts.errors import (
    DeadlineExceededError,
    InputTooLongError,
    ModelExecutionError,
    OverloadedError,
    ServiceError,
)
from contracts.outputs import GenerationDelta, ModelIdentity
from contracts.tokenized import GenerationJob
from deployments.config import GenerationConfig, ObservabilityConfig, RuntimeConfig
from deployments.observability.generation_metrics import GenerationMetrics
from deployments.observability.setup import setup_replica
from deployments.pipeline.card import LaneCard, ModelCard
from deployments.repository.manifest import ManifestError, ResolvedModel
from deployments.runtime.cuda_memory import CacheRelease, apply_alloc_conf
from deployments.runtime.generate.engine import Engine, EngineFullError, TokenEvent
from deployments.runtime.generate.load import load_causal_lm
from deployments.runtime.generate.sampling import Sampling
from deployments.runtime.generate.speculative import DraftProposer, NgramProposer, Proposer
from postprocess.completions import FinishReason, Usage
from postprocess.detokenize import IncrementalDetokenizer, StopMatcher
from preprocess.generation import GenerationParams, PromptBuilder, generation_params

log = logging.getLogger("textserve.generate")
_ids = itertools.count()


@serve.deployment(
    name="Model",
    ray_actor_options={"num_cpus": 1},
    max_ongoing_requests=512,
    max_queued_requests=256,
    max_surge_percent=100,
)
class GeneratorDeployment:
    def __init__(
        self,
        model: ResolvedModel,
        device: str,
        config: GenerationConfig,
        observability: ObservabilityConfig,
        runtime: RuntimeConfig | None = None,
        draft: ResolvedModel | None = None,
    ) -> None:
        runtime = runtime or RuntimeConfig()
        check_generation(model, config, draft)
        apply_alloc_conf(runtime.cuda_alloc_conf)  # before anything here touches CUDA
        setup_replica(observability)
        self._model = model
        self._config = config
        self._prompts = PromptBuilder(model.weights_dir, model.manifest.name)
        self._tokenizer = Tokenizer.from_file(str(model.tokenizer_file))
        if config.intra_op_threads:
            torch.set_num_threads(config.intra_op_threads)
        lm = load_causal_lm(
            model, device, packed=config.packed_weights, row_groups=config.row_group_attention
        )
        self._release = CacheRelease(lm.device, runtime.cuda_cache_release_fraction)
        proposer = _proposer(config, draft, device)
        self._engine = Engine(lm, self._prompts.eos_token_ids, config, self._step, proposer)
        info = {"version": model.manifest.version, "backend": "torch", "device": str(lm.device)}
        self._metrics = GenerationMetrics(model.manifest.name, info, self._engine.stats)
        self._engine.start()
        self._cancelled = 0
        self._max_cancel_lag = 0  # decode steps between a cancel and leaving the batch, the most seen
        log.info("generate model %s v%s ready: %s", model.manifest.name, model.manifest.version, config)

    def _step(self, rows: int, seconds: float) -> None:
        """On the engine's thread, after each decode step."""
        self._metrics.batch_rows.observe(rows)
        self._release()

    def card(self) -> ModelCard:
        manifest = self._model.manifest
        lane = replace(LaneCard.of(manifest, "stable", 1.0), max_new_tokens=self._config.max_tokens_cap)
        return ModelCard(manifest.name, (lane,))

    async def ready(self) -> list[ModelIdentity]:
        self.check_health()
        return [ModelIdentity(self._model.manifest.name, self._model.manifest.version)]

    def check_health(self) -> None:
        if not self._engine.alive:
            raise RuntimeError("the generation engine's thread has stopped")

    async def complete(self, job: GenerationJob) -> GenerationDelta:
        """The whole generation as one piece (a request without ``stream``)."""
        pieces: list[str] = []
        async for delta in self.generate(job):
            if delta.error is not None:
                return delta
            pieces.append(delta.text)
            if delta.finish_reason is not None:
                return GenerationDelta("".join(pieces), delta.finish_reason, delta.usage)
        return GenerationDelta(error=ModelExecutionError("the generation ended without a finish"))

    async def generate(self, job: GenerationJob) -> AsyncIterator[GenerationDelta]:
        """Pieces of text as the engine makes them; the last one has the finish reason and usage."""
        try:
            prompt = self._prompts.prompt_ids(job.request)
            params = self._params(job, len(prompt))
        except ServiceError as exc:
            yield GenerationDelta(error=exc)
            return
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[TokenEvent] = asyncio.Queue()
        request_id = f"{job.request_id or 'gen'}-{next(_ids)}"
        sampling = Sampling(params.temperature, params.top_p, params.seed)
        try:
            self._engine.submit(
                request_id,
                prompt,
                params.max_new_tokens,
                sampling,
                lambda event: loop.call_soon_threadsafe(self._deliver, events, event),
                job.priority,
            )
        except EngineFullError as exc:
            yield GenerationDelta(error=OverloadedError(f"generation queue is full ({exc}); retry shortly"))
            return
        except ValueError as exc:  # more than the KV cache holds (check_generation keeps this from happening)
            yield GenerationDelta(error=InputTooLongError(str(exc)))
            return
        self._metrics.prompt_tokens.inc(len(prompt))
        stream = _Stream(self._tokenizer, prompt, params, self._metrics, time.perf_counter())
        try:
            while stream.finish is None:
                wait = job.deadline - time.time()
                try:
                    first = await asyncio.wait_for(events.get(), wait) if wait > 0 else None
                except asyncio.TimeoutError:
                    first = None
                if first is None:  # the deadline: what was made so far, cut as by max_tokens
                    if stream.tokens == 0:
                        yield GenerationDelta(error=_deadline(job))
                        return
                    yield stream.end("", "length")
                    return
                batch = [first]
                while not events.empty():  # a slow consumer gets the tokens made meanwhile in one piece
                    batch.append(events.get_nowait())
                delta = stream.take(batch)
                if delta is not None:
                    yield delta
        finally:
            if not stream.engine_done:  # a stop string, a deadline, or the client left
                self._engine.cancel(request_id)

    def _deliver(self, events: asyncio.Queue[TokenEvent], event: TokenEvent) -> None:
        """On the event loop: a cancellation is counted here, whether or not anyone still reads."""
        if event.finish == "cancelled":
            self._metrics.requests.inc(tags={"finish": "cancelled"})
            self._metrics.cancel_lag.observe(event.cancel_lag_steps)
            self._cancelled += 1
            self._max_cancel_lag = max(self._max_cancel_lag, event.cancel_lag_steps)
        events.put_nowait(event)

    def _params(self, job: GenerationJob, prompt_tokens: int) -> GenerationParams:
        return generation_params(
            job.request,
            default_max_tokens=self._config.default_max_tokens,
            max_tokens_cap=self._config.max_tokens_cap,
            context_tokens=self._model.manifest.input.max_tokens,
            prompt_tokens=prompt_tokens,
        )

    def stats(self) -> dict[str, Any]:
        """The engine's state now (tests and operators; the metrics carry the same)."""
        s = self._engine.stats()
        return {
            "running": s.running,
            "waiting": s.waiting,
            "kv_slots_used": s.kv_slots_used,
            "kv_slots_allocated": s.kv_slots_allocated,
            "steps": s.steps,
            "prefix_hit_tokens": s.prefix.hit_tokens if s.prefix else None,
            "prefix_prompt_tokens": s.prefix.prompt_tokens if s.prefix else None,
            "spec_proposed": s.spec.proposed if s.spec else None,
            "spec_accepted": s.spec.accepted if s.spec else None,
            "cancelled": self._cancelled,
            "max_cancel_lag_steps": self._max_cancel_lag,
        }


def check_generation(model: ResolvedModel, config: GenerationConfig, draft: ResolvedModel | None) -> None:
    """Refuse to start a generate model the engine could not serve: a KV budget below one request of the
    model's whole context (its requests would wait forever or fail), or a draft with another tokenizer."""
    context = model.manifest.input.max_tokens
    spare = config.speculative.tokens if config.speculative is not None else 0
    if config.kv_cache_tokens < context + spare:
        raise ValueError(
            f"{model.manifest.name}: generation.kv_cache_tokens ({config.kv_cache_tokens}) cannot hold one "
            f"request of the model's whole context (manifest input.max_tokens: {context}"
            + (f", plus generation.speculative.tokens: {spare}" if spare else "")
            + "): raise kv_cache_tokens"
        )
    if draft is not None and draft.tokenizer_id != model.tokenizer_id:
        raise ManifestError(
            "input.tokenizer",
            f"draft model {draft.manifest.name} v{draft.manifest.version} has another tokenizer than "
            f"{model.manifest.name}: a draft must propose the target's own token ids",
            draft.manifest_path,
        )


def _proposer(config: GenerationConfig, draft: ResolvedModel | None, device: str) -> Proposer | None:
    spec = config.speculative
    if spec is None:
        return None
    if spec.method == "ngram":
        return NgramProposer(spec.tokens, spec.ngram_max, spec.ngram_min)
    if draft is None:
        raise ValueError("generation.speculative.method draft: the draft model was not resolved")
    lm = load_causal_lm(draft, device, packed=config.packed_weights, row_groups=config.row_group_attention)
    log.info(
        "speculative decoding: draft %s v%s, %d tokens",
        draft.manifest.name,
        draft.manifest.version,
        spec.tokens,
    )
    return DraftProposer(lm, spec.tokens, config.kv_cache_tokens)


def _deadline(job: GenerationJob) -> ServiceError:
    return DeadlineExceededError("no token within the request's deadline")


class _Stream:
    """One request's text so far: detokenized, cut at stop strings, timed for the metrics."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt: list[int],
        params: GenerationParams,
        metrics: GenerationMetrics,
        start: float,
    ) -> None:
        self.detok = IncrementalDetokenizer(tokenizer, prompt)
        self.stops = StopMatcher(params.stop)
        self.prompt_tokens = len(prompt)
        self.metrics = metrics
        self.start = start
        self.last = 0.0
        self.tokens = 0
        self.finish: FinishReason | None = None
        self.engine_done = False  # the engine ended it (eos, max_tokens, error): nothing to cancel

    def take(self, events: list[TokenEvent]) -> GenerationDelta | None:
        text: list[str] = []
        for event in events:
            if event.finish == "cancelled":
                continue  # only after we asked for it (stop string, deadline): answered already
            if event.finish == "error":
                self.engine_done = True
                self.metrics.requests.inc(tags={"finish": "error"})
                return GenerationDelta(error=ModelExecutionError(event.error or "generation failed"))
            if event.token_id is not None:
                self._timed(event.at)
                cut = self.stops.push(self.detok.push(event.token_id))
                text.append(cut.text)
                if cut.stopped:
                    return self.end("".join(text), "stop")
            if event.finish is not None:
                self.engine_done = True
                cut = self.stops.push(self.detok.flush())
                text.append(cut.text)
                if not cut.stopped:
                    text.append(self.stops.flush())
                return self.end("".join(text), "stop" if event.finish == "stop" or cut.stopped else "length")
        joined = "".join(text)
        return GenerationDelta(joined) if joined else None

    def _timed(self, at: float) -> None:
        if self.tokens == 0:
            self.metrics.ttft_ms.observe((at - self.start) * 1000.0)
        else:
            self.metrics.itl_ms.observe((at - self.last) * 1000.0)
        self.last = at
        self.tokens += 1
        self.metrics.output_tokens.inc()

    def end(self, text: str, finish: FinishReason) -> GenerationDelta:
        self.finish = finish
        self.metrics.requests.inc(tags={"finish": finish})
        return GenerationDelta(text, finish, Usage(self.prompt_tokens, self.tokens))
