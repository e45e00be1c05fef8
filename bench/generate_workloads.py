"""The workloads of ``python -m bench.generate``: which prompts, how many new tokens, which points.

- ``unique``: every request its own prompt, 16-200 words of corpus text starting at a distinct place, so
  no two share a prefix (a prefix cache has nothing to find); 64 new tokens.
- ``shared-prefix``: a chat application's one system prompt of about 600 words, then a distinct user turn
  of about 20 words per request (seeded): only the system prompt is shared; 32 new tokens.
- ``speculative``: prompts from the speculative pair's own corpus (``deployments.tools.demo_pair
  .prompts`` where it exists, else like ``unique``), 64 new tokens; the service without and with its
  ``generation.speculative`` (``bench.generate_spec``), 1 and 8 clients.

No request asks to ignore the end of sequence (the service has no ``ignore_eos``): ``max_tokens`` is the
budget and random-weight models rarely emit their eos, so every system is held to completion_tokens/s.
Each start of a system takes its prompts in turn from the pool (``Cursor``), each once while the pool
lasts, so a server cannot answer a later point from a cache the earlier one filled; the output check's
prompts lie apart from the pool.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.generate_load import Prompt
from bench.service import ROOT

UNIQUE, SHARED_PREFIX, SPECULATIVE = "unique", "shared-prefix", "speculative"
WORKLOADS = (UNIQUE, SHARED_PREFIX, SPECULATIVE)
NEW_TOKENS = {UNIQUE: 64, SHARED_PREFIX: 32, SPECULATIVE: 64}
UNIQUE_WORDS = (16, 200)
SPEC_FALLBACK_WORDS = (16, 64)  # the pair's context is short (512 positions) and its vocabulary small
SYSTEM_WORDS, USER_WORDS = 600, 20
CHECK_PROMPTS = 3
TEMPLATE_MARGIN = 32  # tokens the chat template and the roles add around the texts


@dataclass
class Workload:
    """One workload's prompt pool and its points."""

    name: str
    prompts: list[Prompt]  # measured, in turn
    check: list[Prompt]  # the output check (max_tokens set by the caller)
    concurrency: list[int]
    rates: list[float] = field(default_factory=list)  # open-loop offered req/s
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Cursor:
    """Where the next point starts in a workload's pool, for one start of a system."""

    size: int
    used: int = 0

    @property
    def offset(self) -> int:
        """Where the next point starts."""
        return self.used % self.size if self.size else 0

    def advance(self, sent: int) -> None:
        """A point sent ``sent`` prompts from ``offset`` on."""
        self.used += sent

    @property
    def repeated(self) -> int:
        """Prompts sent a second time or more (the pool ran out)."""
        return max(0, self.used - self.size)


def word_stream(texts: Sequence[str]) -> list[str]:
    """All the corpus texts' words, in order."""
    return [w for t in texts for w in t.split()]


def _slice(words: Sequence[str], start: int, length: int) -> str:
    return " ".join(words[(start + i) % len(words)] for i in range(length))


def unique_prompts(
    words: Sequence[str],
    n: int,
    seed: int,
    max_tokens: int = NEW_TOKENS[UNIQUE],
    lengths: tuple[int, int] = UNIQUE_WORDS,
) -> list[Prompt]:
    """``n`` prompts of ``lengths`` words (uniform, seeded), each starting at its own word of the stream
    with its own first words: no two share a prefix."""
    if len(words) < lengths[1]:
        raise ValueError(f"the corpus has {len(words)} words; a unique prompt needs up to {lengths[1]}")
    rng = random.Random(seed)
    starts = list(range(len(words)))
    rng.shuffle(starts)
    out: list[Prompt] = []
    heads: set[tuple[str, ...]] = set()
    for start in starts:
        head = tuple(words[(start + i) % len(words)] for i in range(8))
        if head in heads:
            continue
        heads.add(head)
        out.append(Prompt(_slice(words, start, rng.randint(*lengths)), max_tokens))
        if len(out) == n:
            return out
    raise ValueError(f"only {len(out)} of {n} prompts with distinct beginnings in the corpus")


def shared_prefix_prompts(
    words: Sequence[str],
    n: int,
    seed: int,
    max_tokens: int = NEW_TOKENS[SHARED_PREFIX],
    system_words: int = SYSTEM_WORDS,
    user_words: int = USER_WORDS,
    count_tokens: Callable[[str], int] | None = None,
    context_tokens: int | None = None,
) -> list[Prompt]:
    """One system prompt of ``system_words`` words and ``n`` distinct user turns of ``user_words`` words
    (seeded). With ``count_tokens`` and ``context_tokens``, the system prompt is cut (whole words) until
    system + the longest user turn + ``max_tokens`` + the template's margin fit the context."""
    if len(words) < system_words + user_words:
        raise ValueError(f"the corpus has {len(words)} words, fewer than one prompt needs")
    rng = random.Random(seed)
    begin = rng.randrange(len(words))
    system_list = [words[(begin + i) % len(words)] for i in range(system_words)]
    users: list[str] = []
    seen: set[str] = set()
    starts = list(range(len(words)))
    rng.shuffle(starts)
    for start in starts:
        text = _slice(words, start, user_words)
        if text not in seen:
            seen.add(text)
            users.append(text)
            if len(users) == n:
                break
    if len(users) < n:
        raise ValueError(f"only {len(users)} of {n} distinct user turns in the corpus")
    if count_tokens is not None and context_tokens is not None:
        longest = max(count_tokens(u) for u in users)
        budget = context_tokens - max_tokens - longest - TEMPLATE_MARGIN
        while system_list and count_tokens(" ".join(system_list)) > budget:
            system_list = system_list[: max(1, int(len(system_list) * 0.95))]
    system = " ".join(system_list)
    return [Prompt(u, max_tokens, system=system) for u in users]


def pair_prompts(n: int, seed: int, timeout_s: float = 300.0) -> list[str] | None:
    """``deployments.tools.demo_pair.prompts(n, seed)``, in a child process (bench imports none of the
    service's modules but its public surface), or None where it does not exist or fails."""
    code = (
        "import json, sys\n"
        "from deployments.tools.demo_pair import prompts\n"
        "print(json.dumps([str(t) for t in prompts(int(sys.argv[1]), int(sys.argv[2]))]))"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, str(n), str(seed)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        texts = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    return [str(t) for t in texts] if isinstance(texts, list) and texts else None


def prompt_info(prompts: Sequence[Prompt], count_tokens: Callable[[str], int] | None) -> dict[str, Any]:
    """The pool in figures (words; tokens by the model's tokenizer, before the chat template)."""
    words = [len(p.text.split()) for p in prompts]
    info: dict[str, Any] = {
        "count": len(prompts),
        "words_min": min(words),
        "words_max": max(words),
        "words_mean": round(sum(words) / len(words), 1),
        "max_tokens": prompts[0].max_tokens,
    }
    if count_tokens is not None:
        sample = prompts[:256]
        tokens = [count_tokens(p.text) for p in sample]
        info.update(
            tokens_min=min(tokens), tokens_max=max(tokens), tokens_mean=round(sum(tokens) / len(tokens), 1)
        )
    system = prompts[0].system
    if system is not None:
        info["system_words"] = len(system.split())
        if count_tokens is not None:
            info["system_tokens"] = count_tokens(system)
    return info


def build_workloads(
    names: Sequence[str],
    texts: Sequence[str],
    pool: int,
    seed: int,
    concurrency: list[int],
    rates: list[float],
    spec_concurrency: list[int],
    count_tokens: Callable[[str], int] | None = None,
    context_tokens: int | None = None,
    spec_texts: Sequence[str] | None = None,
    spec_count_tokens: Callable[[str], int] | None = None,
) -> dict[str, Workload]:
    """The chosen workloads, each with ``pool`` measured prompts and ``CHECK_PROMPTS`` apart for the
    output check. ``spec_texts``: the speculative pair's own prompts (else the corpus, like ``unique``);
    ``spec_count_tokens``: the pair's tokenizer (its prompts' token counts; None: none given)."""
    words = word_stream(texts)
    out: dict[str, Workload] = {}
    for name in names:
        if name == UNIQUE:
            made = unique_prompts(words, pool + CHECK_PROMPTS, seed)
            prompts, check = made[CHECK_PROMPTS:], made[:CHECK_PROMPTS]
            out[name] = Workload(name, prompts, check, list(concurrency), list(rates))
        elif name == SHARED_PREFIX:
            made = shared_prefix_prompts(
                words,
                pool + CHECK_PROMPTS,
                seed + 1,
                count_tokens=count_tokens,
                context_tokens=context_tokens,
            )
            prompts, check = made[CHECK_PROMPTS:], made[:CHECK_PROMPTS]
            out[name] = Workload(name, prompts, check, list(concurrency), list(rates))
        elif name == SPECULATIVE:
            if spec_texts:
                made = [Prompt(t, NEW_TOKENS[SPECULATIVE]) for t in spec_texts]
                source = "deployments.tools.demo_pair.prompts"
            else:
                made = unique_prompts(
                    words, pool + CHECK_PROMPTS, seed + 2, NEW_TOKENS[SPECULATIVE], SPEC_FALLBACK_WORDS
                )
                source = "the corpus (no deployments.tools.demo_pair.prompts)"
            prompts, check = made[CHECK_PROMPTS:] or made, made[:CHECK_PROMPTS]
            out[name] = Workload(name, prompts, check, list(spec_concurrency), [], {"source": source})
        else:
            raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
        counter = spec_count_tokens if name == SPECULATIVE else count_tokens
        out[name].info = {**prompt_info(out[name].prompts, counter), **out[name].info}
    return out
