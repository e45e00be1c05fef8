"""Continuous batching: requests join the running batch between decode steps and leave as they finish.

One loop, on its own thread, owns the model. Each iteration it
1. drops cancelled requests (a client gone, a deadline, a stop string): they leave within one step;
2. admits waiting requests while the batch has rows and KV slots for their whole generation;
3. prefills prompts in chunks, at most ``prefill_chunk_tokens`` per iteration, so a long prompt does
   not stall the running streams; short prompts waiting together share one pass (``prefill_pack_tokens``),
   so a burst costs one pass; a prompt whose first blocks were computed before (``prefix_cache.py``)
   prefills only the rest; a prompt done gives its first token and joins the batch (a prefix that rows
   share is held there once: ``shared_prefix.py``);
4. runs one decode step of the batch: one new token per running request, or, with speculative decoding
   (``speculative.py``) and a small batch, a check of each row's proposed tokens: one or more each.

Tokens go out through each request's ``sink`` as ``TokenEvent``s; every request ends with exactly one
event carrying its ``finish`` reason, whatever happens (a failed forward pass fails the requests it held,
and the loop goes on). Admission reserves a request's longest possible cache, so nothing is preempted.
No Ray here: the ``Generator`` deployment wraps it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import torch
from transformers import DynamicCache, PreTrainedModel

from contracts.tokenized import Priority
from deployments.config import GenerationConfig
from deployments.runtime.generate.kv_batch import KVBatch, check_cache, prompt_cache
from deployments.runtime.generate.passes import can_pack, decode_step, prefill_pack, prefill_piece
from deployments.runtime.generate.prefix_cache import PrefixCache
from deployments.runtime.generate.sampling import NON_FINITE, Sampler, Sampling, next_tokens
from deployments.runtime.generate.sequence import (
    EngineFullError,
    EngineStats,
    Finish,
    Sequence,
    Sink,
    SpecCounts,
    TokenEvent,
)
from deployments.runtime.generate.speculative import Proposer, speculative_step
from deployments.runtime.generate.waiting import BATCH_TURN, Waiting

log = logging.getLogger("textserve.generate")
__all__ = ["BATCH_TURN", "Engine", "EngineFullError", "EngineStats", "Finish", "Sink", "TokenEvent"]

_DEFAULTS = GenerationConfig()  # the engine's bounds: serve_config.yaml's generation section


class Engine:
    def __init__(
        self,
        model: PreTrainedModel,
        eos_token_ids: tuple[int, ...],
        limits: GenerationConfig = _DEFAULTS,
        on_step: Callable[[int, float], None] | None = None,
        proposer: Proposer | None = None,
    ) -> None:
        self.model = model.eval()
        self.device = model.device
        check_cache(DynamicCache(config=model.config))  # refuse sliding-window / linear-attention models
        self.limits = limits
        self.eos = frozenset(eos_token_ids)
        self._on_step = on_step  # (rows, seconds) of each decode step: metrics
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._waiting = Waiting()  # by the tenant's class: interactive first, bulk never starved
        self._prefilling: list[Sequence] = []
        self._in_pass = 1  # prompts in the prefill pass under way: the ones a failure of it fails
        self._packs = can_pack(model) and limits.prefill_pack_tokens > limits.prefill_chunk_tokens
        self._shares = can_pack(model)  # a shared prefix needs the row-group attention (shared_prefix.py)
        self._running: list[Sequence] = []
        self._batch = KVBatch(self.device, limits.kv_cache_tokens)
        self._prefixes = (
            PrefixCache(limits.prefix_block_tokens, limits.prefix_cache_tokens)
            if limits.prefix_cache_tokens
            else None
        )
        self._proposer = proposer if limits.speculative is not None else None
        # A speculative check writes this many columns past a row's next token: each request reserves them.
        self._spare = limits.speculative.tokens if self._proposer is not None and limits.speculative else 0
        self._spec = SpecCounts()
        self._context = context_tokens(model)
        self._cancelled: dict[str, int] = {}  # request id -> the step count when cancel() was called
        self._steps = 0
        self._thread: threading.Thread | None = None
        self._stopping = False

    # ---- called from any thread ----
    def submit(
        self,
        request_id: str,
        prompt: list[int],
        max_new_tokens: int,
        sampling: Sampling,
        sink: Sink,
        priority: Priority = "interactive",
    ) -> None:
        if not prompt or max_new_tokens < 1:
            raise ValueError("a request needs a prompt and max_new_tokens >= 1")
        seq = Sequence(request_id, list(prompt), max_new_tokens, Sampler(sampling), sink, self.eos)
        if seq.reserve + self._spare > self.limits.kv_cache_tokens:
            raise ValueError(
                f"{seq.reserve + self._spare} tokens do not fit the KV cache ({self.limits.kv_cache_tokens})"
            )
        with self._lock:
            if len(self._waiting) >= self.limits.max_waiting:
                raise EngineFullError(f"{self.limits.max_waiting} requests already wait")
            self._waiting.push(seq, priority)
        self._wake.set()

    def cancel(self, request_id: str) -> None:
        with self._lock:
            self._cancelled.setdefault(request_id, self._steps)
        self._wake.set()

    def stats(self) -> EngineStats:
        with self._lock:
            waiting = len(self._waiting) + len(self._prefilling)
        active = self._running + self._prefilling
        return EngineStats(
            len(self._running),
            waiting,
            self._reservation(active),
            self.limits.kv_cache_tokens,
            self._steps,
            kv_slots_allocated=self._batch.allocated,
            kv_slots_filled=self._batch.slots,
            prefix=self._prefixes.stats() if self._prefixes is not None else None,
            spec=SpecCounts(**{f: getattr(self._spec, f) for f in SpecCounts.__slots__})
            if self._proposer is not None
            else None,
        )

    def _reservation(self, active: list[Sequence]) -> int:
        """Token slots the batch may need for ``active``: every row padded to the longest whole generation,
        and the shared prefix."""
        if not active:
            return 0
        return len(active) * (max(s.reserve for s in active) + self._spare) + self._batch.shared_slots

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="generate", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        with torch.inference_mode():
            while not self._stopping:
                if not self.step():
                    self._wake.wait(timeout=1.0)
                    self._wake.clear()

    # ---- the loop's own thread ----
    @torch.inference_mode()
    def step(self) -> bool:
        """One iteration; False when there was nothing to do."""
        self._drop_cancelled()
        self._admit()
        if not self._prefilling and not self._running:
            return False
        if self._prefilling:
            self._guarded(self._prefilling, self._prefill)
        if self._running:
            self._guarded(self._running, self._decode)
        return True

    def _guarded(self, seqs: list[Sequence], work: Callable[[], None]) -> None:
        try:
            work()
        except Exception as exc:  # one failed pass fails the requests in it; the loop goes on
            log.exception("generation step failed")
            if seqs is self._running:
                self._batch = KVBatch(self.device, self.limits.kv_cache_tokens)
                if self._proposer is not None:
                    self._proposer.reset()
                failed = list(seqs)
            elif self._in_pass > 1:  # a pack: its prompts go again one by one, so only a bad one fails
                for seq in seqs[: self._in_pass]:
                    seq.solo = True
                self._in_pass = 1
                return
            else:  # a prefill pass holds the head's prompt: the ones queued behind it wait on
                failed = seqs[:1]
            del seqs[: len(failed)]
            for seq in failed:
                error = f"{type(exc).__name__}: {exc}"
                _send(seq, TokenEvent(seq.request_id, None, "error", error, at=time.perf_counter()))

    def _drop_cancelled(self) -> None:
        with self._lock:
            if not self._cancelled:
                return
            gone, self._cancelled = self._cancelled, {}
            dropped = self._waiting.remove(gone)
        dropped += [s for s in self._prefilling if s.request_id in gone]
        self._prefilling = [s for s in self._prefilling if s.request_id not in gone]
        rows = [i for i, s in enumerate(self._running) if s.request_id not in gone]
        dropped += [s for s in self._running if s.request_id in gone]
        self._keep_rows(rows)
        now = time.perf_counter()
        for seq in dropped:
            seq.cache = None
            lag = self._steps - gone[seq.request_id]
            _send(seq, TokenEvent(seq.request_id, None, "cancelled", at=now, cancel_lag_steps=lag))

    def _admit(self) -> None:
        with self._lock:
            while (seq := self._waiting.head()) is not None:
                active = self._running + self._prefilling + [seq]
                if len(active) > self.limits.max_running:
                    return
                # Rows are padded to the longest: reserve every row at the longest whole generation.
                if self._reservation(active) > self.limits.kv_cache_tokens:
                    return
                self._prefilling.append(self._waiting.pop())

    def _prefill(self) -> None:
        budget = self.limits.prefill_chunk_tokens
        while self._prefilling and budget > 0:
            fresh = budget == self.limits.prefill_chunk_tokens  # nothing prefilled yet this iteration
            pack = self._pack(self.limits.prefill_pack_tokens if fresh else budget)
            if len(pack) > 1:
                self._prefill_pack(pack)
                return  # a pack is this iteration's prefill
            seq = self._prefilling[0]
            self._look_up(seq)
            start = seq.prefilled
            end = min(len(seq.prompt), start + budget)
            if seq.cache is None:
                seq.cache = prompt_cache(self.model.config, len(seq.prompt))
            logits = prefill_piece(self.model, seq.prompt, start, end, seq.cache)
            budget -= end - start
            seq.prefilled = end
            if self._prefixes is not None:
                self._prefixes.store(seq.prompt, seq.cache, end)
            if end < len(seq.prompt):
                return  # the budget ran out inside this prompt: the rest next iteration
            token = next_tokens(logits, [seq.sampler])[0]
            if self._emit(seq, token) is None:
                self._join(seq, seq.cache)
            self._prefilling.pop(0)  # only now: until here a failure is this prompt's (see _guarded)
            seq.cache = None  # the batch holds it now

    def _look_up(self, seq: Sequence) -> None:
        """Once per request, before its first prefill: start after its longest cached prefix."""
        if seq.looked_up or self._prefixes is None:
            return
        seq.looked_up = True
        cache = prompt_cache(self.model.config, len(seq.prompt))
        seq.prefilled = seq.cached = self._prefixes.lookup(seq.prompt, cache)
        seq.cache = cache if seq.prefilled else None

    def _join(self, seq: Sequence, cache: DynamicCache, start: int = 0) -> None:
        """A prefilled request joins the batch (and the draft's batch, row for row)."""
        if self._proposer is not None:
            self._proposer.join(seq.prompt)
        # A popular prefix (a prefix-cache hit) may become the batch's shared one where the reservation
        # leaves room for it; a prompt that starts with the batch's shares it either way.
        hit = seq.cached
        active = [*self._running, *(s for s in self._prefilling if s is not seq), seq]
        if hit and self._reservation(active) + hit > self.limits.kv_cache_tokens:
            hit = 0
        self._batch.add(cache, len(seq.prompt), start, seq.prompt if self._shares else None, hit)
        self._running.append(seq)

    def _pack(self, limit: int) -> list[Sequence]:
        """Whole prompts from the head (none begun, none longer than a chunk), ``limit`` tokens at most."""
        if not self._packs:
            return []
        pack: list[Sequence] = []
        tokens = 0
        for seq in self._prefilling:
            size = len(seq.prompt)
            if size <= self.limits.prefill_chunk_tokens:
                self._look_up(seq)  # a prompt with a cached prefix prefills only the rest, alone
            if seq.prefilled or seq.solo or size > self.limits.prefill_chunk_tokens or tokens + size > limit:
                break
            pack.append(seq)
            tokens += size
        return pack

    def _prefill_pack(self, pack: list[Sequence]) -> None:
        self._in_pass = len(pack)
        logits, cache, starts = prefill_pack(self.model, [seq.prompt for seq in pack])
        tokens = next_tokens(logits, [seq.sampler for seq in pack])
        del self._prefilling[: len(pack)]  # only now: until here a failure is the pack's (see _guarded)
        self._in_pass = 1
        for seq, start, token in zip(pack, starts, tokens, strict=True):
            seq.prefilled = len(seq.prompt)
            if self._prefixes is not None:
                self._prefixes.store(seq.prompt, cache, len(seq.prompt), start)
            if self._emit(seq, token) is None:
                self._join(seq, cache, start)

    def _decode(self) -> None:
        t0 = time.perf_counter()
        tokens = None
        if self._speculates():
            assert self._proposer is not None
            tokens = speculative_step(
                self.model, self._batch, self._proposer, self._running, self._spare, self._spec
            )
        if tokens is None:
            ids = torch.tensor([[s.generated[-1]] for s in self._running], device=self.device)
            logits = decode_step(self.model, self._batch, ids)
            tokens = [[t] for t in next_tokens(logits, [s.sampler for s in self._running])]
            if self._proposer is not None:  # the draft's rows stay in step with the batch's
                self._proposer.follow(ids)
        self._steps += 1
        rows = [
            i
            for i, (s, ts) in enumerate(zip(self._running, tokens, strict=True))
            if all(self._emit(s, t) is None for t in ts)  # all() stops at the finishing token
        ]
        if self._on_step is not None:
            self._on_step(len(tokens), time.perf_counter() - t0)
        self._keep_rows(rows)

    def _speculates(self) -> bool:
        spec = self.limits.speculative
        return (
            self._proposer is not None
            and spec is not None
            and len(self._running) <= spec.max_rows
            and self._batch.longest + self._spare + 1 <= self._context  # positions within the model's
        )

    def _keep_rows(self, rows: list[int]) -> None:
        if len(rows) != len(self._running):
            order = self._batch.keep(rows)  # the batch moves rows into holes: follow its order
            if self._proposer is not None:
                self._proposer.keep(rows)
            self._running = [self._running[i] for i in order]

    @staticmethod
    def _emit(seq: Sequence, token: int) -> Finish | None:
        """Send ``token``; the request's finish reason when it was its last (eos: not sent as text)."""
        if token == NON_FINITE:
            error = "non-finite logits (nan or inf): the model gave no usable scores for the next token"
            _send(seq, TokenEvent(seq.request_id, None, "error", error, at=time.perf_counter()))
            return "error"
        seq.generated.append(token)
        finish: Finish | None = None
        if token in seq.eos:
            finish = "stop"
        elif len(seq.generated) >= seq.max_new:
            finish = "length"
        _send(seq, TokenEvent(seq.request_id, token, finish, at=time.perf_counter()))
        return finish


def context_tokens(model: PreTrainedModel) -> int:
    """The positions the model has (its longest sequence)."""
    return int(getattr(model.config, "max_position_embeddings", None) or 1 << 30)


def _send(seq: Sequence, event: TokenEvent) -> None:
    """A sink that fails (its event loop closed) loses its own events, never the loop's other requests."""
    try:
        seq.sink(event)
    except Exception:
        log.warning("dropped an event of %s: its sink failed", seq.request_id, exc_info=True)
