"""Speculative decoding: a cheap proposer guesses the next tokens of each row, the model checks them in one
pass (``passes.verify_step``) and keeps the longest run it agrees with, plus one token of its own.

Proposers:
- ``NgramProposer``: the tokens that followed the most recent earlier occurrence of the row's last n tokens
  in its prompt and output (prompt lookup). No model; pays when an output copies its prompt.
- ``DraftProposer``: a small causal LM with the same tokenizer, decoding its own running batch beside the
  model's, row for row (``KVBatch`` again, the same joins, leaves and order).

Proposals are deterministic (the draft's argmax). ``accept`` keeps a proposed token while the model agrees:
greedy, while it is the model's own argmax, so greedy output is exactly the model's, whatever the proposer;
sampled, with the model's probability of it (the rejection rule of Leviathan et al. with a one-hot draft
distribution), and on a rejection a token drawn from the model's distribution without the rejected one, so
each token follows the model's own (temperature, top-p) distribution.
"""

from __future__ import annotations

import array

import torch
from transformers import DynamicCache, PreTrainedModel

from deployments.runtime.generate.kv_batch import KVBatch
from deployments.runtime.generate.passes import decode_step, prefill_piece, verify_step
from deployments.runtime.generate.sampling import NON_FINITE, Sampler, probabilities
from deployments.runtime.generate.sequence import Sequence, SpecCounts


class NgramProposer:
    """Prompt lookup: ``ngram_max`` down to ``ngram_min`` tokens matched, the latest occurrence first."""

    def __init__(self, tokens: int, ngram_max: int, ngram_min: int) -> None:
        self.tokens, self.ngram_max, self.ngram_min = tokens, ngram_max, ngram_min

    def propose(self, histories: list[list[int]]) -> list[list[int]]:
        return [self._lookup(h) for h in histories]

    def _lookup(self, history: list[int]) -> list[int]:
        data = array.array("q", history).tobytes()  # bytes.rfind: the search runs in C
        width = 8
        for n in range(min(self.ngram_max, len(history) - 1), self.ngram_min - 1, -1):
            tail = data[-n * width :]
            end = len(data) - width  # an occurrence that ends before the last token
            while (at := data.rfind(tail, 0, end)) >= 0:
                if at % width == 0:
                    start = at // width + n
                    return history[start : start + self.tokens]
                end = at + len(tail) - 1  # a match across token boundaries: look further back
        return []

    def join(self, prompt: list[int]) -> None:
        pass

    def keep(self, rows: list[int]) -> None:
        pass

    def settle(self, proposals: list[list[int]], accepted: list[int], bonus: list[int]) -> None:
        pass

    def follow(self, ids: torch.Tensor) -> None:
        pass

    def reset(self) -> None:
        pass


class DraftProposer:
    """A draft model's own running batch: row ``r`` holds the same sequence as the model's row ``r``, up to
    the same length (the token each row decodes next is in neither cache)."""

    def __init__(self, model: PreTrainedModel, tokens: int, budget: int) -> None:
        self.model = model.eval()
        self.tokens = tokens
        self.budget = budget
        self.batch = KVBatch(model.device, budget)

    def join(self, prompt: list[int]) -> None:
        cache = DynamicCache(config=self.model.config)
        prefill_piece(self.model, prompt, 0, len(prompt), cache)
        self.batch.add(cache, len(prompt))

    def keep(self, rows: list[int]) -> None:
        self.batch.keep(rows)  # the model's batch makes the same moves for the same rows

    def reset(self) -> None:
        self.batch = KVBatch(self.model.device, self.budget)

    def propose(self, last: list[int]) -> list[list[int]]:
        ids = torch.tensor([[t] for t in last], device=self.model.device)
        steps = []
        for _ in range(self.tokens):
            ids = decode_step(self.model, self.batch, ids).argmax(dim=-1, keepdim=True)
            steps.append(ids)
        return torch.cat(steps, dim=1).tolist()

    def follow(self, ids: torch.Tensor) -> None:
        """A plain decode step of the model's batch (``ids``: each row's token): the draft caches them too."""
        decode_step(self.model, self.batch, ids)

    def settle(self, proposals: list[list[int]], accepted: list[int], bonus: list[int]) -> None:
        """After the check: each row keeps the tokens the model kept. The draft has cached the row's token
        before the check and its proposals but the last; a row that kept them all needs that one too."""
        before = [n - self.tokens for n in self.batch.lengths]
        if any(a == self.tokens for a in accepted):
            last = [
                p[-1] if a == self.tokens else b for p, a, b in zip(proposals, accepted, bonus, strict=True)
            ]
            decode_step(self.model, self.batch, torch.tensor([[t] for t in last], device=self.model.device))
        self.batch.lengths = [n + a + 1 for n, a in zip(before, accepted, strict=True)]
        self.batch.advance([0] * self.batch.rows)  # the views follow the new lengths


Proposer = NgramProposer | DraftProposer


def accept(
    logits: torch.Tensor, proposals: list[list[int]], caps: list[int], samplers: list[Sampler]
) -> list[list[int]]:
    """The tokens each row gives: its accepted proposals, then the model's own next token. ``logits``:
    (rows, tokens + 1, vocabulary), position ``j`` the model's prediction after proposal ``j``'s
    predecessor; ``caps[r]``: at most this many of row ``r``'s proposals may be kept (its room left). A row
    whose logits are not finite gives ``[NON_FINITE]``."""
    finite = torch.isfinite(logits).flatten(1).all(dim=1).tolist()
    best = logits.argmax(dim=-1).tolist()
    out: list[list[int]] = []
    for r, (proposal, cap, sampler) in enumerate(zip(proposals, caps, samplers, strict=True)):
        if not finite[r]:
            out.append([NON_FINITE])
            continue
        n = min(len(proposal), cap)
        if sampler.params.greedy:
            kept = 0
            while kept < n and proposal[kept] == best[r][kept]:
                kept += 1
            out.append([*proposal[:kept], best[r][kept]])
            continue
        probs = probabilities(logits[r, : n + 1], sampler.params)
        generator = sampler.generator_on(probs.device)
        tokens: list[int] = []
        for j in range(n + 1):
            if j == n:  # every proposal kept: the model's own token after them
                tokens.append(int(torch.multinomial(probs[j], 1, generator=generator)))
                break
            token = proposal[j]
            if float(torch.rand((), generator=generator, device=probs.device)) < float(probs[j, token]):
                tokens.append(token)
                continue
            rest = probs[j].clone()
            rest[token] = 0.0
            tokens.append(int(torch.multinomial(rest, 1, generator=generator)))
            break
        out.append(tokens)
    return out


def speculative_step(
    model: PreTrainedModel,
    batch: KVBatch,
    proposer: Proposer,
    running: list[Sequence],
    tokens: int,
    counts: SpecCounts,
) -> list[list[int]] | None:
    """One speculative step of the running batch: each row's proposals checked in one pass of ``model``;
    the tokens each row gives (None: nothing proposed, the caller runs a plain step). Both batches then hold
    each row's kept tokens."""
    last = [s.generated[-1] for s in running]
    if isinstance(proposer, NgramProposer):
        proposals = proposer.propose([s.prompt + s.generated for s in running])
        if not any(proposals):
            return None
    else:
        proposals = proposer.propose(last)
    padded = [p + [0] * (tokens - len(p)) for p in proposals]  # every row checks as many: one pass
    ids = torch.tensor([[t, *p] for t, p in zip(last, padded, strict=True)], device=batch.device)
    logits = verify_step(model, batch, ids)
    # A row keeps at most what its max_tokens leaves room for, the model's own token after them included.
    caps = [min(len(p), s.max_new - len(s.generated) - 1) for p, s in zip(proposals, running, strict=True)]
    out = accept(logits, proposals, caps, [s.sampler for s in running])
    accepted = [len(o) - 1 for o in out]
    batch.advance([a + 1 for a in accepted])
    proposer.settle(padded, accepted, [max(o[-1], 0) for o in out])
    counts.proposed += sum(min(len(p), c) for p, c in zip(proposals, caps, strict=True))
    counts.accepted += sum(accepted)
    counts.checks += len(running)
    counts.tokens += sum(accepted) + len(running)
    return out
