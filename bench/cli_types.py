"""The argument types of ``python -m bench``'s options: each parses one option's text or says why not."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench import infinity

WORKLOADS = ("W1", "W2", "W3", "W4")
WORKLOAD_ALIASES = {"single": "W1", "batch": "W2", "open": "W3", "mixed": "W4"}
INFINITY_LABELS = tuple(c.label for c in infinity.CONFIGS)


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def concurrency_list(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers like 1,8,32, got {text!r}")
    return values


def infinity_configs(text: str) -> list[str]:
    labels = [v.strip() for v in text.split(",") if v.strip()]
    unknown = sorted(set(labels) - set(INFINITY_LABELS))
    if not labels or unknown:
        raise argparse.ArgumentTypeError(f"expected some of {', '.join(INFINITY_LABELS)}, got {text!r}")
    return labels


def workloads(text: str) -> list[str]:
    names = [WORKLOAD_ALIASES.get(v.strip().lower(), v.strip().upper()) for v in text.split(",") if v.strip()]
    unknown = sorted(set(names) - set(WORKLOADS))
    if not names or unknown:
        aliases = ", ".join(f"{k} = {v}" for k, v in WORKLOAD_ALIASES.items())
        raise argparse.ArgumentTypeError(f"expected some of {', '.join(WORKLOADS)} ({aliases}), got {text!r}")
    return names


def rate(text: str) -> float:
    from bench.mixed import MAX_RATE

    value = float(text)
    if not 0 < value <= MAX_RATE:
        raise argparse.ArgumentTypeError(f"must be within (0, {MAX_RATE:g}] req/s, got {text}")
    return value


def inprocess_spec(text: str) -> tuple[str, Path]:
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"expected LABEL=MODEL_DIR, got {text!r}")
    return label, Path(path)
