"""What a large message costs between two replicas: gRPC (Serve's high-throughput mode, its size limit
raised) against a call by reference (Ray actor calls, large values through the object store).

The choice behind deployments/pipeline/transport.py: a group's answer between the model's replicas is
megabytes to tens of megabytes for bulk requests. Two trivial deployments on a private Ray instance; the
caller sends a list holding one float32 array of each size and gets it back, ``--calls`` times per
transport, alternating the transports, and prints the median round trip of each.

    .venv/bin/python -m bench.hop_bytes --sizes-mb 0.01,0.1,1,4,16,64 --calls 20
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

THROUGHPUT_ENV = {
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": str(2**31 - 1),
}


def _deployments():  # type: ignore[no-untyped-def]
    from ray import serve

    @serve.deployment(ray_actor_options={"num_cpus": 0.1})
    class Echo:
        def echo(self, payload: list[np.ndarray]) -> list[np.ndarray]:
            return payload

    @serve.deployment(ray_actor_options={"num_cpus": 0.1})
    class Caller:
        def __init__(self, echo) -> None:  # type: ignore[no-untyped-def]
            self._by = {"grpc": echo, "by-reference": echo.options(_by_reference=True)}

        async def round_trip_ms(self, nbytes: int, transport: str) -> float:
            payload = [np.ones((max(1, nbytes // 64), 16), dtype=np.float32)]
            start = time.perf_counter()
            back = await self._by[transport].echo.remote(payload)
            assert back[0].shape == payload[0].shape
            return (time.perf_counter() - start) * 1000.0

    return Caller.bind(Echo.bind())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="0.01,0.1,1,4,16,64", help="payload sizes, MB, comma-separated")
    parser.add_argument("--calls", type=int, default=20, help="round trips per size and transport")
    ns = parser.parse_args(argv)

    import ray
    from ray import serve

    ray.init(address="local", num_cpus=4, runtime_env={"env_vars": THROUGHPUT_ENV}, log_to_driver=False)
    try:
        caller = serve.run(_deployments(), name="hop-bytes", route_prefix=None)
        print(f"{'MB':>8}  {'gRPC ms':>9}  {'by reference ms':>15}   (median of {ns.calls} round trips each)")
        for mb in (float(s) for s in ns.sizes_mb.split(",")):
            nbytes = int(mb * 1e6)
            times: dict[str, list[float]] = {"grpc": [], "by-reference": []}
            for transport in times:  # warm both paths at this size
                caller.round_trip_ms.remote(nbytes, transport).result()
            for _ in range(ns.calls):
                for transport, seen in times.items():
                    seen.append(caller.round_trip_ms.remote(nbytes, transport).result())
            grpc, by_ref = (statistics.median(times[t]) for t in ("grpc", "by-reference"))
            print(f"{mb:8.2f}  {grpc:9.1f}  {by_ref:15.1f}", flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
