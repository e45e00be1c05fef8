"""A client that disconnects costs no model time: its request is dropped before its batch runs.

The ingress replica sees a hang-up on its own HTTP connection (direct ingress) or from Serve's Python
proxy, which cancels the handler. HAProxy, in front of it in serve_config.yaml's high-throughput mode,
does not reliably pass a client's close on to a request it has already forwarded (its ``abortonclose``
is about queued requests; here the abandoned request was computed in two tries of three), so through
HAProxy the request's deadline is what surely drops it: a client with its own timeout sends it as
``X-Request-Timeout`` (docs/reliability.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from ray import serve

from deployments.user_config import PipelineConfig
from tests.integration.conftest import APP, DEFAULT_MODEL
from tests.integration.texts import near_limit

pytestmark = pytest.mark.integration

# Long enough on CPU (~2 s alone) that the second request queues behind it, short enough to end well within
# the service's 30-s deadline while the suite's other work shares the cores (256 texts took ~8 s alone, and
# past 30 s once in a full run while a broken app's build retries ran beside it: a 504, and its batch, still
# on the model, counted in the next test). A machine that ends it too soon for the client to leave gets a
# bigger one.
BUSY_TEXTS = 64
BUSY_SIZES = (BUSY_TEXTS, 2 * BUSY_TEXTS, 4 * BUSY_TEXTS, 8 * BUSY_TEXTS)
# A client's hang-up reaches the queued request within this; a big request that ends sooner can let the second
# run before its cancellation arrives (seen once in CI: 48 texts computed for a client gone), showing nothing.
CANCEL_MARGIN_S = 0.3


def _batching() -> dict[str, Any]:
    handle = serve.get_deployment_handle("Inference", app_name=DEFAULT_MODEL)
    stats: dict[str, Any] = handle.batching.remote().result(timeout_s=30)
    return stats


def _sequences() -> int:
    return int(_batching()["sequences"])


def _wait_batching(done: Callable[[dict[str, Any]], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done(_batching()):
        assert time.monotonic() < deadline, f"{what} not within {timeout_s} s"
        time.sleep(0.02)


def _wait_running(sequences: int) -> None:
    """Until Inference runs a batch of at least ``sequences``. A fixed pause was not enough on a busy machine:
    the second request, tokenized sooner than the big one, reached the model first (CI: 304 computed)."""
    _wait_batching(lambda s: s["running"] >= sequences, f"a batch of {sequences} sequences running")


def _wait_idle() -> None:
    """Until no batch runs: a big request of an earlier test or try must not count in this one's sequences."""
    _wait_batching(lambda s: not s["running"], "Inference idle")


def _ingress_replica_url() -> str:
    """The ingress replica's own HTTP listener (direct ingress: HAProxy forwards to it)."""
    import psutil
    from ray.serve._private.constants import (
        RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT,
        RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT,
    )
    from ray.serve.context import _get_global_client

    app = _get_global_client().get_serve_details()["applications"][APP]
    pids = [r["pid"] for r in app["deployments"]["Ingress"]["replicas"] if r.get("pid")]
    ports = [
        c.laddr.port
        for pid in pids
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
        and RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT <= c.laddr.port <= RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT
    ]
    assert ports, f"no direct-ingress HTTP port on the ingress replicas {pids}"
    return f"http://127.0.0.1:{ports[0]}"


@dataclass(frozen=True)
class Outcome:
    busy_status: int
    second: str  # its status code, or "left"
    busy_outlived: (
        bool  # the big request's batch was still on the model CANCEL_MARGIN_S after the second left
    )


def _busy_then_second(
    url: str,
    second: list[str],
    read_timeout_s: float | None,
    headers: dict[str, str] | None = None,
    busy_texts: int = BUSY_TEXTS,
) -> Outcome:
    """Keep the model busy with one big request, send ``second`` behind it; the second client gives up
    after ``read_timeout_s`` (None: it waits)."""
    busy = [f"{i}: " + near_limit(200) for i in range(busy_texts)]
    url = f"{url}/v1/embeddings"
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(httpx.post, url, json={"input": busy}, timeout=120)
        _wait_running(busy_texts)  # the big request is in the model now, not still being tokenized
        try:
            timeout = httpx.Timeout(120, read=read_timeout_s)
            r = httpx.post(url, json={"input": second}, headers=headers or {}, timeout=timeout)
            fate = str(r.status_code)
        except httpx.ReadTimeout:
            fate = "left"
        time.sleep(CANCEL_MARGIN_S)
        # The model, not the HTTP request: a big response is still serialized and sent after its batch ends
        # (CI: the second client got its 200 within 0.3 s while the first's response was still on its way).
        outlived = _batching()["running"] >= busy_texts
        return Outcome(first.result().status_code, fate, outlived)


def _leave_behind_a_busy_model(url: str, headers: dict[str, str] | None = None) -> tuple[Outcome, int, int]:
    """The second client leaves while the big request still runs: (outcome, texts computed, busy texts).
    A big request that ended before the client left shows nothing (the second ran behind nothing): it is
    tried again, twice as big."""
    for busy_texts in BUSY_SIZES:
        _wait_idle()
        before = _sequences()
        outcome = _busy_then_second(url, SECOND, 0.3, headers, busy_texts)
        time.sleep(1.0)  # had the second request not been dropped, its batch would run now
        if outcome.busy_outlived:
            return outcome, _sequences() - before, busy_texts
    raise AssertionError(f"a {BUSY_SIZES[-1]}-text request ended within 0.8 s: no queue to leave from")


# Over the pipeline's inline_chars, so it goes to Inference and queues behind the big request (a small
# group would run on the pipeline's own copy of the model at once, behind nothing).
SECOND = [f"text {i} that nobody will wait for, long enough to leave the pipeline " * 3 for i in range(48)]
assert sum(map(len, SECOND)) > PipelineConfig().inline_chars


def test_a_disconnected_client_costs_no_model_time(base_url: str) -> None:
    url = _ingress_replica_url()  # base_url: the session instance is up
    # Control: a client that waits is computed after the big request (so the measurement can fail).
    _wait_idle()
    before = _sequences()
    control = _busy_then_second(url, SECOND, None)
    assert (control.busy_status, control.second) == (200, "200")
    assert _sequences() - before == BUSY_TEXTS + len(SECOND)

    outcome, computed, busy_texts = _leave_behind_a_busy_model(url)
    assert (outcome.busy_status, outcome.second) == (200, "left")
    assert computed == busy_texts


def test_through_haproxy_a_client_that_leaves_costs_no_model_time_past_its_deadline(base_url: str) -> None:
    outcome, computed, busy_texts = _leave_behind_a_busy_model(base_url, {"X-Request-Timeout": "0.3"})
    assert (outcome.busy_status, outcome.second) == (200, "left")
    assert computed == busy_texts
    # The service is unaffected.
    assert (
        httpx.post(f"{base_url}/v1/embeddings", json={"input": "still fine"}, timeout=30).status_code == 200
    )
