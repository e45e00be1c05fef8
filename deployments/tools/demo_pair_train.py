"""Training and measuring for ``demo_pair``: a GPT-2 trained on a token stream, the draft's greedy agreement
with the target, and the ms per decode step. Torch on the CPU, two threads."""

from __future__ import annotations

import contextlib
import math
import random
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from deployments.tools.demo_lm import LMSpec

THREADS = 2


def new_model(spec: LMSpec) -> Any:
    """An untrained ``GPT2LMHeadModel`` of ``spec``'s shape, from its seed, fp32, without dropout."""
    import torch
    from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel

    ids = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
    stops = {**ids, "eos_token_id": [0, 2]}  # <|endoftext|> and <|im_end|>: a chat reply ends at the latter
    no_dropout = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}  # minutes of training: no overfit
    torch.manual_seed(spec.seed)
    model = GPT2LMHeadModel(GPT2Config(**spec.config_fields(), **ids, **no_dropout)).to(torch.float32)
    model.generation_config = GenerationConfig(**stops, do_sample=False)
    return model


def batches(stream: list[list[int]], batch: int, seq: int, seed: int) -> Iterator[Any]:
    """Endless (batch, seq) windows, each from a document's start on across the next ones (a prompt
    starts at position 0 when served: no <|endoftext|> before it)."""
    import torch

    rng = random.Random(seed)
    while True:
        rows = []
        for _ in range(batch):
            i, row = rng.randrange(len(stream)), []
            while len(row) < seq:
                row += stream[i % len(stream)]
                i += 1
            rows.append(row[:seq])
        yield torch.tensor(rows)


def train(
    spec: LMSpec,
    stream: list[list[int]],
    batch: int,
    seq: int,
    steps: int,
    lr: float,
    warmup: int,
    log: Callable[[str], None] | None = None,
    teacher: Any = None,
    mix: float = 0.5,
) -> tuple[Any, float]:
    """``spec`` trained for ``steps`` AdamW steps (linear warmup, cosine to a tenth): the model, in eval
    mode, and its final loss (the mean of the last ten steps'). ``log`` hears the loss every 50 steps."""
    import torch

    torch.set_num_threads(THREADS)
    model = new_model(spec).train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))
    warmup = max(1, min(warmup, steps // 4))

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    amp = _amx() and spec.hidden >= 256  # bfloat16 pays for the wide matmuls only
    data = batches(stream, batch, seq, spec.seed)
    recent: list[float] = []
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        ids = next(data)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            out = model(input_ids=ids, labels=ids)
        loss = out.loss
        if teacher is not None:  # distillation: the teacher's next-token distribution, mixed in
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=_amx()):
                soft = torch.log_softmax(teacher(input_ids=ids).logits.float(), -1).flatten(0, 1)
            own = torch.log_softmax(out.logits.float(), -1).flatten(0, 1)
            kl = torch.nn.functional.kl_div(own, soft.clone(), log_target=True, reduction="batchmean")
            loss = (1 - mix) * loss + mix * kl
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        recent = [*recent[-9:], out.loss.item()]  # the cross-entropy on the corpus
        if log is not None and (step % 50 == 0 or step == steps):
            took = time.perf_counter() - t0
            log(f"  {spec.name} step {step}/{steps}: loss {statistics.fmean(recent):.3f} ({took:.0f} s)")
    return model.eval(), statistics.fmean(recent)


def _amx() -> bool:
    """Whether the CPU multiplies bfloat16 in hardware (AMX): bfloat16 autocast is slower without."""
    import torch

    with contextlib.suppress(Exception):
        return bool(torch.cpu._is_amx_tile_supported())
    return False


def agreement(target: Any, draft: Any, tokenizer_json: str, texts: list[str], tokens: int) -> float:
    """Over the target's greedy continuations of ``texts`` (up to ``tokens`` each, ending at <|endoftext|>),
    the fraction of its next tokens that the draft's argmax predicts from the same prefix."""
    import torch
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    hits = total = 0
    with torch.inference_mode():
        for text in texts:
            ids = torch.tensor([tokenizer.encode(text).ids])
            n = ids.shape[1]
            out = target.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, do_sample=False
            )
            guess = draft(out[:, :-1]).logits[0, n - 1 :].argmax(-1)
            hits += int((guess == out[0, n:]).sum())
            total += out.shape[1] - n
    return hits / max(1, total)


def step_ms(models: list[Any], prefix: int = 32, steps: int = 32, rounds: int = 5) -> list[float]:
    """Median ms per single-token decode step at batch 1 with the KV cache, after a ``prefix``-token
    prompt, per model; the models take turns, so a busy CPU slows each alike."""
    import torch

    times: list[list[float]] = [[] for _ in models]
    with torch.inference_mode():
        for _ in range(rounds):
            for i, model in enumerate(models):
                out = model(torch.arange(3, 3 + prefix)[None], use_cache=True)
                for _ in range(steps):
                    token = out.logits[:, -1:].argmax(-1)
                    t = time.perf_counter()
                    out = model(token, cache=out.cache, use_cache=True)
                    times[i].append(time.perf_counter() - t)
    return [statistics.median(t) * 1e3 for t in times]
