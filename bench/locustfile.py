"""Locust traffic of variable length against any OpenAI-compatible embeddings route.

    pip install -e '.[bench]'    # or: pip install locust
    locust -f bench/locustfile.py --host http://127.0.0.1:8000 --headless -u 16 -r 4 -t 60s

Each simulated user sends its next request as soon as the last one answered (closed loop, like
``python -m bench``): three times out of four a single text, otherwise a batch of 2 to 32 texts, all
drawn from the benchmark corpus (real prose, 5-120 words). Environment: ``BENCH_ROUTE`` (default
``/v1/embeddings``; Infinity serves ``/embeddings``), ``BENCH_MODEL`` (default ``all-MiniLM-L6-v2``),
``BENCH_SEED`` (default 0). Locust's own per-request overhead is higher than the aiohttp client's, so
use it for mixed traffic and soak tests, and ``python -m bench`` for the comparison numbers.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

from locust import FastHttpUser, constant, task

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from deployments.tools.corpus import build_corpus

ROUTE = os.environ.get("BENCH_ROUTE", "/v1/embeddings")
MODEL = os.environ.get("BENCH_MODEL", "all-MiniLM-L6-v2")
TEXTS = build_corpus(int(os.environ.get("BENCH_SEED", "0"))).texts
BATCH_SIZES = (2, 4, 8, 16, 32)


class EmbeddingUser(FastHttpUser):
    wait_time = constant(0)

    def on_start(self) -> None:
        self.rng = random.Random()

    def _embed(self, texts: list[str], name: str) -> None:
        body = {"input": texts[0] if len(texts) == 1 else texts, "model": MODEL}
        with self.client.post(
            ROUTE,
            data=json.dumps(body),
            headers={"Content-Type": "application/json"},
            name=name,
            catch_response=True,
        ) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {(resp.text or '')[:200]}")
            elif len(resp.json().get("data", [])) != len(texts):
                resp.failure(f"expected {len(texts)} embeddings")

    @task(3)
    def single_text(self) -> None:
        self._embed([self.rng.choice(TEXTS)], "1 text")

    @task(1)
    def batch_of_texts(self) -> None:
        size = self.rng.choice(BATCH_SIZES)
        self._embed(self.rng.sample(TEXTS, size), f"{size} texts")
