"""Timeline client: one client with a pause before each request, or Poisson arrivals at a rate.

    .venv/bin/python docs/hop-timeline/client.py seq 300 0.1 seq.json     # 100 ms before each of 300
    .venv/bin/python docs/hop-timeline/client.py poisson 600 20 p20.json  # 600 arrivals at 20 req/s

Each request carries X-Request-Id <prefix><i> (r, or p for Poisson arrivals: two runs against one start of
the service keep apart), which the marks in timeline.patch record; the record keeps each text.
"""

import asyncio
import json
import random
import sys
import time

import aiohttp

from bench.corpus import build_corpus

URL = "http://127.0.0.1:8000/v1/embeddings"


async def main(mode: str, n: int, rate: float, out: str) -> None:
    texts = list(build_corpus().texts)
    rng = random.Random(7)
    answered: list[tuple[str, int, int, str]] = []
    prefix = "r" if mode == "seq" else "p"
    async with aiohttp.ClientSession() as session:

        async def one(i: int) -> None:
            text = rng.choice(texts)
            body = json.dumps({"input": text, "model": "all-MiniLM-L6-v2"})
            headers = {"content-type": "application/json", "x-request-id": f"{prefix}{i}"}
            sent = time.monotonic_ns()
            async with session.post(URL, data=body, headers=headers) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"request {prefix}{i}: HTTP {response.status}")
            answered.append((f"{prefix}{i}", sent, time.monotonic_ns(), text))

        for i in range(20):  # warm-up, not recorded
            await one(-1 - i)
        answered.clear()
        if mode == "seq":
            for i in range(n):
                await asyncio.sleep(rate)
                await one(i)
        else:
            tasks = []
            due = time.monotonic()
            for i in range(n):
                due += rng.expovariate(rate)
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                tasks.append(asyncio.create_task(one(i)))
            await asyncio.gather(*tasks)
    with open(out, "w") as f:
        json.dump(answered, f)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]))
