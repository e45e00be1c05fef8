"""What one call between two processes costs after an idle gap, by transport (no Ray, no model).

    .venv/bin/python -m bench.hop_probe --pauses 0,5,10,20,100

The router calls a model's pipeline replica once per request, over gRPC (Ray Serve's high-throughput mode:
``grpc.aio`` between replicas). Under open-loop traffic at 10-40 req/s each call comes after 25-100 ms with
nothing on that connection. This measures a small unary call after each pause, one way (the caller's clock
before the call to the callee's clock in its handler: CLOCK_MONOTONIC is one clock for every process on a
machine) and back, for raw loopback TCP (the floor), ``grpc.aio`` (how the replicas talk) and gRPC's blocking
API (whether asyncio has a part in it). docs/architecture.md, "The hop after an idle gap".
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from bench.results import percentile

TRANSPORTS = ("tcp", "grpc-aio", "grpc-sync")
PAYLOAD = b"x" * 300  # about a pickled single-text request
WARM_UP = 20  # calls before the timed ones, so the connection and its threads exist
_METHOD = "/probe.Probe/Echo"


def parse_pauses(text: str) -> list[float]:
    """``"5,20,100"`` (milliseconds) -> seconds."""
    pauses = [float(p) / 1000 for p in text.split(",") if p.strip()]
    if not pauses or any(p < 0 for p in pauses):
        raise argparse.ArgumentTypeError(f"expected milliseconds like 5,20,100, got {text!r}")
    return pauses


def _stamp() -> bytes:
    return time.monotonic_ns().to_bytes(8, "little")


def _tcp_server(port_out: Connection) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port_out.send(listener.getsockname()[1])
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while conn.recv(65536):
        conn.sendall(_stamp())


def _grpc_handlers() -> Any:
    import grpc

    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: _stamp())
    return grpc.method_handlers_generic_handler("probe.Probe", {"Echo": handler})


def _grpc_server(port_out: Connection) -> None:
    async def serve() -> None:
        import grpc

        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_grpc_handlers(),))
        port_out.send(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(serve())


@dataclass
class Samples:
    """Nanoseconds per call: caller to callee's handler, and back."""

    out: list[int] = field(default_factory=list)
    back: list[int] = field(default_factory=list)

    def add(self, sent_ns: int, stamped: bytes, received_ns: int) -> None:
        handled_ns = int.from_bytes(stamped[:8], "little")
        self.out.append(handled_ns - sent_ns)
        self.back.append(received_ns - handled_ns)


def _tcp_calls(port: int, pauses: list[float], calls: int) -> dict[float, Samples]:
    conn = socket.create_connection(("127.0.0.1", port))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def call() -> bytes:
        conn.sendall(PAYLOAD)
        return conn.recv(64)

    try:
        return _blocking_calls(call, pauses, calls)
    finally:
        conn.close()


def _grpc_sync_calls(port: int, pauses: list[float], calls: int) -> dict[float, Samples]:
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = channel.unary_unary(_METHOD)
        return _blocking_calls(lambda: stub(PAYLOAD), pauses, calls)


def _blocking_calls(call: Callable[[], bytes], pauses: list[float], calls: int) -> dict[float, Samples]:
    for _ in range(WARM_UP):
        call()
    measured: dict[float, Samples] = {}
    for pause in pauses:
        samples = measured.setdefault(pause, Samples())
        for _ in range(calls):
            time.sleep(pause)
            sent = time.monotonic_ns()
            samples.add(sent, call(), time.monotonic_ns())
    return measured


def _grpc_aio_calls(port: int, pauses: list[float], calls: int) -> dict[float, Samples]:
    async def run() -> dict[float, Samples]:
        import grpc

        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = channel.unary_unary(_METHOD)
            for _ in range(WARM_UP):
                await stub(PAYLOAD)
            measured: dict[float, Samples] = {}
            for pause in pauses:
                samples = measured.setdefault(pause, Samples())
                for _ in range(calls):
                    await asyncio.sleep(pause)
                    sent = time.monotonic_ns()
                    samples.add(sent, await stub(PAYLOAD), time.monotonic_ns())
            return measured

    return asyncio.run(run())


def measure(transport: str, pauses: list[float], calls: int) -> dict[float, Samples]:
    """Every pause's samples for one transport, against a callee in a fresh process."""
    server = _tcp_server if transport == "tcp" else _grpc_server
    client = {"tcp": _tcp_calls, "grpc-aio": _grpc_aio_calls, "grpc-sync": _grpc_sync_calls}[transport]
    context = mp.get_context("spawn")  # gRPC's threads do not survive a fork
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=server, args=(send,), daemon=True)
    process.start()
    try:
        if not receive.poll(60):
            raise RuntimeError(f"the {transport} callee did not start")
        return client(receive.recv(), pauses, calls)
    finally:
        process.kill()
        process.join()


def _ms(values: list[int], q: float) -> float:
    return percentile(values, q) / 1e6


def render(results: dict[str, dict[float, Samples]]) -> str:
    lines = [
        "| transport | pause before each call | one way p50 / p90 ms | back p50 ms | round trip p50 ms |",
        "|---|---|---|---|---|",
    ]
    for transport, by_pause in results.items():
        for pause, s in by_pause.items():
            trip = [o + b for o, b in zip(s.out, s.back, strict=True)]
            lines.append(
                f"| {transport} | {1000 * pause:g} ms | {_ms(s.out, 50):.3f} / {_ms(s.out, 90):.3f} "
                f"| {_ms(s.back, 50):.3f} | {_ms(trip, 50):.3f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pauses", type=parse_pauses, default=parse_pauses("0,5,10,20,100"))
    parser.add_argument("--calls", type=int, default=150, help="timed calls per pause and transport")
    parser.add_argument("--transports", default=",".join(TRANSPORTS), help=f"any of {', '.join(TRANSPORTS)}")
    args = parser.parse_args(argv)
    transports = [t for t in args.transports.split(",") if t]
    unknown = set(transports) - set(TRANSPORTS)
    if unknown or args.calls < 1:
        parser.error(f"unknown transports {sorted(unknown)}" if unknown else "--calls must be at least 1")
    print(render({t: measure(t, args.pauses, args.calls) for t in transports}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
