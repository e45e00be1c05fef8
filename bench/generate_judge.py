"""The ratios ``python -m bench.generate`` judges (issue 52), per round and as medians over rounds.

- service ÷ vLLM output tokens/s (>= 1.0) and TTFT p99 (<= 1.0), closed loop: ``shared-prefix`` at c=1 and
  c=8, ``unique`` at c=8 and c=32; the other closed-loop levels and the open-loop points for context;
- the speculative workload: the service with ``generation.speculative`` ÷ without, ITL p50 at c=1 (<= 0.6);
  the same at the other levels and their output tokens/s for context;
- for context, the earlier ratios against ``transformers serve`` and the naive endpoint on ``unique``
  (``http_ratios``; its targets named in the detail, no longer judged).

Over several rounds each ratio is judged on its median (``bench.ratios.medians_over_rounds``), and every
round's own judged ratios are listed after the medians; a system measured in the first round only (the
context peers) is compared in every round with that round's service.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from bench.generate_spec import SPEC_OFF, SPEC_ON
from bench.generate_stats import CLOSED, OPEN, GenPoint, GenRatio, _ratio, find
from bench.generate_workloads import SHARED_PREFIX, SPECULATIVE, UNIQUE
from bench.ratios import medians_over_rounds, meets

VS_VLLM_THROUGHPUT, VS_VLLM_TTFT, SPEC_ITL = 1.0, 1.0, 0.6
THROUGHPUT_TARGET, TTFT_TARGET = 1.5, 1.0  # against transformers serve (issue 50): context since issue 52
JUDGED_VS_VLLM = ((SHARED_PREFIX, 1), (SHARED_PREFIX, 8), (UNIQUE, 8), (UNIQUE, 32))
SPEC_JUDGED_LEVEL = 1
CONTEXT = "context"
# The closed-loop levels a judged ratio uses, by workload: what rounds after the first measure.
JUDGED_LEVELS: dict[str, tuple[int, ...]] = {
    UNIQUE: tuple(c for w, c in JUDGED_VS_VLLM if w == UNIQUE),
    SHARED_PREFIX: tuple(c for w, c in JUDGED_VS_VLLM if w == SHARED_PREFIX),
    SPECULATIVE: (SPEC_JUDGED_LEVEL,),
}


def _one(name: str, a: GenPoint | None, b: GenPoint | None, metric: str, target: str, unit: str) -> GenRatio:
    value = _ratio(a and getattr(a, metric), b and getattr(b, metric))
    met = None if value is None or target == CONTEXT else meets(value, target)
    return GenRatio(name, value, target, met, f"{_v(a, metric)} / {_v(b, metric)} {unit}")


def vllm_ratios(points: Sequence[GenPoint], service: str, vllm: str) -> list[GenRatio]:
    """Service ÷ vLLM at the judged points (targets), then at every other point of both (context)."""
    out: list[GenRatio] = []
    seen: set[tuple[str, str, float]] = set()
    for workload, c in JUDGED_VS_VLLM:
        s, v = find(points, service, CLOSED, c, workload), find(points, vllm, CLOSED, c, workload)
        if s is None and v is None:
            continue
        seen.add((workload, CLOSED, c))
        where = f"{workload} c={c:g}"
        out.append(
            _one(
                f"output tokens/s {service} / {vllm}, {where}",
                s,
                v,
                "tokens_per_s",
                f">= {VS_VLLM_THROUGHPUT}",
                "tokens/s",
            )
        )
        out.append(
            _one(f"TTFT p99 {service} / {vllm}, {where}", s, v, "ttft_p99_ms", f"<= {VS_VLLM_TTFT}", "ms")
        )
    others = sorted(
        {(p.workload, p.mode, p.level) for p in points if p.system == vllm} - seen,
        key=lambda k: (k[0], k[1] != CLOSED, k[2]),
    )
    for workload, mode, level in others:
        s, v = find(points, service, mode, level, workload), find(points, vllm, mode, level, workload)
        if s is None:
            continue
        where = f"{workload} c={level:g}" if mode == CLOSED else f"{workload} open loop {level:g} req/s"
        out.append(
            _one(f"output tokens/s {service} / {vllm}, {where}", s, v, "tokens_per_s", CONTEXT, "tokens/s")
        )
        out.append(_one(f"TTFT p99 {service} / {vllm}, {where}", s, v, "ttft_p99_ms", CONTEXT, "ms"))
    return out


def spec_ratios(points: Sequence[GenPoint], on: str = SPEC_ON, off: str = SPEC_OFF) -> list[GenRatio]:
    """With ÷ without speculative decoding: ITL p50 at c=1 (<= 0.6), the other levels and output
    tokens/s for context."""
    out: list[GenRatio] = []
    levels = sorted({p.level for p in points if p.workload == SPECULATIVE and p.system in (on, off)})
    for c in levels:
        a, b = find(points, on, CLOSED, c, SPECULATIVE), find(points, off, CLOSED, c, SPECULATIVE)
        target = f"<= {SPEC_ITL}" if c == SPEC_JUDGED_LEVEL else CONTEXT
        out.append(_one(f"ITL p50 {on} / {off}, {SPECULATIVE} c={c:g}", a, b, "itl_p50_ms", target, "ms"))
    for c in levels:
        a, b = find(points, on, CLOSED, c, SPECULATIVE), find(points, off, CLOSED, c, SPECULATIVE)
        out.append(
            _one(
                f"output tokens/s {on} / {off}, {SPECULATIVE} c={c:g}",
                a,
                b,
                "tokens_per_s",
                CONTEXT,
                "tokens/s",
            )
        )
    return out


def http_ratios(
    points: Sequence[GenPoint],
    service: str,
    peer: str,
    naive: str,
    throughput_levels: Sequence[int] = (8, 32),
) -> list[GenRatio]:
    """The targets: service output tokens/s / transformers serve's at c=8 and c=32 (>= 1.5), service TTFT
    p99 / transformers serve's at every closed-loop level and open-loop rate (<= 1.0); for context the
    same throughput ratio at the other levels and against the naive endpoint."""
    out: list[GenRatio] = []
    pair = (service, peer)
    levels = sorted({p.level for p in points if p.mode == CLOSED and p.system in pair})
    for c in levels:
        s, t = find(points, service, CLOSED, c), find(points, peer, CLOSED, c)
        target = f">= {THROUGHPUT_TARGET}" if c in throughput_levels else "context"
        value = _ratio(s and s.tokens_per_s, t and t.tokens_per_s)
        met = None if value is None or target == "context" else value >= THROUGHPUT_TARGET
        out.append(
            GenRatio(
                f"output tokens/s {service} / {peer}, c={c:g}",
                value,
                target,
                met,
                f"{_v(s, 'tokens_per_s')} / {_v(t, 'tokens_per_s')} tokens/s",
            )
        )
    for mode, unit in ((CLOSED, "c="), (OPEN, "req/s=")):
        for level in sorted({p.level for p in points if p.mode == mode and p.system in pair}):
            s, t = find(points, service, mode, level), find(points, peer, mode, level)
            value = _ratio(s and s.ttft_p99_ms, t and t.ttft_p99_ms)
            met = None if value is None else value <= TTFT_TARGET
            out.append(
                GenRatio(
                    f"TTFT p99 {service} / {peer}, {mode} loop {unit}{level:g}",
                    value,
                    f"<= {TTFT_TARGET}",
                    met,
                    f"{_v(s, 'ttft_p99_ms')} / {_v(t, 'ttft_p99_ms')} ms",
                )
            )
    for c in sorted({p.level for p in points if p.mode == CLOSED}):
        s, n = find(points, service, CLOSED, c), find(points, naive, CLOSED, c)
        value = _ratio(s and s.tokens_per_s, n and n.tokens_per_s)
        if value is not None:
            out.append(
                GenRatio(
                    f"output tokens/s {service} / {naive}, c={c:g}",
                    value,
                    "context",
                    None,
                    f"{_v(s, 'tokens_per_s')} / {_v(n, 'tokens_per_s')} tokens/s",
                )
            )
    return out


def _v(p: GenPoint | None, name: str) -> str:
    value = None if p is None else getattr(p, name)
    return "n/a" if value is None else f"{value:g}"


def context_ratios(
    points: Sequence[GenPoint], service: str, peer: str, naive: str, workload: str = UNIQUE
) -> list[GenRatio]:
    """The earlier ratios (against ``transformers serve``, the naive endpoint) on ``workload``, for context:
    the target they had goes into the detail."""
    chosen = [p for p in points if p.workload == workload]
    present = {p.system for p in chosen}
    out = []
    for r in http_ratios(chosen, service, peer, naive):
        if f"/ {peer}," in r.name and peer not in present:
            continue  # not in this run: no rows of n/a
        detail = r.detail if r.target == CONTEXT else f"{r.detail} (earlier target {r.target})"
        out.append(
            replace(
                r,
                name=f"{r.name.replace(', ', f', {workload} ', 1)}",
                target=CONTEXT,
                met=None,
                detail=detail,
            )
        )
    return out


def round_ratios(
    points: Sequence[GenPoint], service: str, vllm: str, peer: str, naive: str
) -> list[GenRatio]:
    """Every ratio of one round's points."""
    return (
        vllm_ratios(points, service, vllm)
        + spec_ratios(points)
        + context_ratios(points, service, peer, naive)
    )


def ratios_over_rounds(
    points: Sequence[GenPoint], rounds: int, service: str, vllm: str, peer: str, naive: str
) -> list[GenRatio]:
    """``round_ratios`` of a one-round run. Over several rounds: each ratio's median over the rounds that
    have it (judged), then every round's own judged ratios, named by round (the context rows only as
    medians). A system measured in the first round only is taken from that round in every round."""
    if rounds <= 1:
        return round_ratios(points, service, vllm, peer, naive)
    once = {p.system for p in points if p.round == 1} - {p.system for p in points if p.round > 1}
    in_round = [
        [p for p in points if p.round == r or (p.round == 1 and p.system in once)]
        for r in range(1, rounds + 1)
    ]
    # A point measured in the first round only (the open loop) is a context row of that round alone.
    each = [round_ratios(chosen, service, vllm, peer, naive) for chosen in in_round]
    merged = medians_over_rounds(each, digits=3)
    return [r for r in merged if not (r.name.startswith("round ") and r.target == CONTEXT)]


def headline(ratios: Sequence[GenRatio]) -> list[GenRatio]:
    """The judged ratios (their medians where there are rounds): the report's first table."""
    return [r for r in ratios if r.target != CONTEXT and not r.name.startswith("round ")]
