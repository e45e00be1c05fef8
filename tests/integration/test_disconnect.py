"""A client that disconnects costs no model time: its request is dropped before its batch runs."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from ray import serve

from tests.integration.conftest import APP
from tests.integration.texts import near_limit

pytestmark = pytest.mark.integration

BUSY_TEXTS = 256  # long enough on CPU (> 1 s) that the second request queues behind it


def _sequences() -> int:
    stats: dict[str, Any] = (
        serve.get_deployment_handle("Inference", app_name=APP).batching.remote().result(timeout_s=30)
    )
    return int(stats["sequences"])


def _busy_then_second(base_url: str, second: list[str], read_timeout_s: float | None) -> tuple[int, str]:
    """Keep the model busy with one big request, send ``second`` behind it; the second client gives up
    after ``read_timeout_s`` (None: it waits). Returns the big request's status and the second's fate."""
    busy = [f"{i}: " + near_limit(200) for i in range(BUSY_TEXTS)]
    url = f"{base_url}/v1/embeddings"
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(httpx.post, url, json={"input": busy}, timeout=120)
        time.sleep(0.5)  # the big request is in the model now
        try:
            r = httpx.post(url, json={"input": second}, timeout=httpx.Timeout(120, read=read_timeout_s))
            fate = str(r.status_code)
        except httpx.ReadTimeout:
            fate = "left"
        return first.result().status_code, fate


def test_a_disconnected_client_costs_no_model_time(base_url: str) -> None:
    second = [f"text {i} that nobody will wait for" for i in range(48)]
    # Control: a client that waits is computed after the big request (so the measurement can fail).
    before = _sequences()
    assert _busy_then_second(base_url, second, None) == (200, "200")
    assert _sequences() - before == BUSY_TEXTS + len(second)

    before = _sequences()
    assert _busy_then_second(base_url, second, 0.3) == (200, "left")
    time.sleep(1.0)  # had it not been dropped, its batch would run now
    assert _sequences() - before == BUSY_TEXTS
    # The service is unaffected.
    assert (
        httpx.post(f"{base_url}/v1/embeddings", json={"input": "still fine"}, timeout=30).status_code == 200
    )
