"""Interleaved A/B inside one start of the service: Poisson arrivals at a fixed rate, while the rule file
switches between variants every ``period`` seconds, in turn.

    .venv/bin/python docs/interleaved-ab/client.py 20 600 20 beside,wait,queue ab20.json

Arguments: rate (req/s), seconds, period (s), the variants (what the rule file holds in turn), output. A rate
written ``c<N>`` (``c1``, ``c8``) runs N clients back to back instead (closed loop). Each
answer is recorded with the variant in force when it was sent and whether it was sent in the first second
after a switch (analyze.py leaves those out: requests in flight then may meet either variant).
"""

import asyncio
import json
import random
import sys
import time
from pathlib import Path

import aiohttp

from bench.corpus import build_corpus

URL = "http://127.0.0.1:8000/v1/embeddings"
RULE_FILE = Path("/tmp/interleaved-ab/rule")  # the scratch patches' replica polls it every 0.1 s
SETTLE_S = 1.0


async def main(rate: str, seconds: float, period: float, variants: list[str], out: str) -> None:
    texts = list(build_corpus().texts)
    rng = random.Random(11)
    records: list[tuple[str, bool, int, int, str, int]] = []
    RULE_FILE.parent.mkdir(parents=True, exist_ok=True)
    async with aiohttp.ClientSession() as session:

        async def one(text: str, variant: str, settling: bool) -> None:
            body = json.dumps({"input": text, "model": "all-MiniLM-L6-v2"})
            sent = time.monotonic_ns()
            async with session.post(URL, data=body, headers={"content-type": "application/json"}) as response:
                await response.read()
            records.append((variant, settling, sent, time.monotonic_ns(), text, response.status))

        for _ in range(20):  # warm-up, not recorded
            await one(rng.choice(texts), "warm-up", True)
        records.clear()
        start = switched = time.monotonic()
        current = ""

        def variant_now() -> tuple[str, bool]:
            nonlocal current, switched
            variant = variants[int((time.monotonic() - start) // period) % len(variants)]
            if variant != current:
                current, switched = variant, time.monotonic()
                RULE_FILE.write_text(current)
            return current, time.monotonic() - switched < SETTLE_S

        if rate.startswith("c"):  # closed loop: each client sends its next text when its answer is back

            async def client() -> None:
                while time.monotonic() - start < seconds:
                    await one(rng.choice(texts), *variant_now())

            await asyncio.gather(*(client() for _ in range(int(rate[1:]))))
        else:
            due = start
            tasks: list[asyncio.Task[None]] = []
            while due - start < seconds:
                due += rng.expovariate(float(rate))
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                tasks.append(asyncio.create_task(one(rng.choice(texts), *variant_now())))
            await asyncio.gather(*tasks)
    Path(out).write_text(json.dumps(records))


if __name__ == "__main__":
    rate, seconds, period, variants, out = sys.argv[1:6]
    asyncio.run(main(rate, float(seconds), float(period), variants.split(","), out))
