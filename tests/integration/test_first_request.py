"""Work a request starts in a model's pipeline replica outlives that request.

The pipeline's group workers and the load of its own model copy start with the replica's first request.
Ray Serve records a handle call made in a request's context as that request's child and, when the request
is cancelled, cancels its children still waiting for a replica (``_on_request_cancelled``); an asyncio
task inherits its creator's context. Before they were detached, a first request dropped at its deadline
while Inference was busy cancelled every other request's stage calls waiting behind it (and ended their
group worker), and the model copy's load with them: small groups then never ran in the pipeline.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from ray import serve

from contracts.tokenized import TokenizeJob
from tests.integration.conftest import ServeHarness, deployment_named, routed_model
from tests.integration.texts import near_limit

pytestmark = pytest.mark.integration

APP = "first-request"
ROUTE = "/first-request"
BUSY_TEXTS = 256  # seconds of model time on CPU: the first request's deadline falls well inside it


@pytest.fixture
def fresh_app(serve_harness: ServeHarness) -> Iterator[str]:
    """A model application that has served nothing yet, with a router of its own. Its Inference takes one
    call at a time, so that calls behind a busy one wait for a replica, as under load or while it starts."""
    entry, router = routed_model(serve_harness, APP, ROUTE, {})
    deployment_named(entry, "Inference")["max_ongoing_requests"] = 1
    serve_harness.deploy_extra(entry, router)
    yield f"{serve_harness.url}{ROUTE}/v1/embeddings"
    serve_harness.remove_extras()


def test_a_first_request_dropped_at_its_deadline_takes_nothing_else_with_it(fresh_app: str) -> None:
    texts = [f"{i}: " + near_limit(200) for i in range(BUSY_TEXTS)]
    encoded = serve.get_deployment_handle("Tokenizer", app_name=APP).encode.remote([TokenizeJob(texts)])
    busy = serve.get_deployment_handle("Inference", app_name=APP).infer.remote(encoded.result(timeout_s=60))
    time.sleep(0.3)  # Inference's one slot is taken: the pipeline's calls wait for it
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(
            httpx.post, fresh_app, json={"input": "first"}, headers={"X-Request-Timeout": "1"}, timeout=120
        )
        time.sleep(0.1)
        second = pool.submit(httpx.post, fresh_app, json={"input": "second, with no deadline"}, timeout=120)
        assert first.result().status_code == 504  # dropped at its deadline while Inference was busy
        assert len(busy.result(timeout_s=120)) == 1
        answer = second.result()
    assert answer.status_code == 200, answer.text
    # Both group slots still serve, small groups (tokenized here) and large ones (the stages).
    large = [f"text {i}, long enough that its group goes through the stages" for i in range(48)]
    with ThreadPoolExecutor(4) as pool:
        answers = pool.map(
            lambda i: httpx.post(fresh_app, json={"input": i}, timeout=60), ["a", large, "b", large]
        )
        assert [a.status_code for a in answers] == [200] * 4
