"""A replica whose device failed reports unhealthy and is replaced while the other replica serves.

The failure is injected into a live replica (TEXTSERVE_FAULT_INJECTION=1 in that app's env only): its next
forward pass raises the error CUDA gives after an illegal memory access, and everything after that is the
production path: the runner marks itself fatal, check_health raises, Serve replaces the replica.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from ray import serve

from deployments.pipeline.inference import FAULT_INJECTION_ENV
from tests.integration.conftest import ServeHarness, deployment_named, routed_model
from tests.integration.traffic import Traffic

# slow: ~2.5 minutes with its own model application (bash .ci/run -m slow)
pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "faulty"
ROUTE = "/faulty"
CUDA_ERROR = "CUDA error: an illegal memory access was encountered"


@pytest.fixture
def faulty_app(serve_harness: ServeHarness, model_repo: Path) -> Iterator[str]:
    model = {"repository": str(model_repo), "name": "tiny-sentiment", "task": "classify", "backend": "torch"}
    entry, router = routed_model(serve_harness, APP, ROUTE, model)
    entry["runtime_env"] = {"env_vars": {FAULT_INJECTION_ENV: "1"}}
    # No degraded answers hiding a failure.
    deployment_named(router, "Ingress").setdefault("user_config", {})["fallback_cache_mb"] = 0
    inference = deployment_named(entry, "Inference")
    inference.pop("autoscaling_config", None)
    inference.update(num_replicas=2, health_check_period_s=1, health_check_timeout_s=10)
    serve_harness.deploy_extra(entry, router)
    yield f"{serve_harness.url}{ROUTE}/predict"
    serve_harness.remove_extras()


def _pids(handle: serve.handle.DeploymentHandle, tries: int = 40) -> set[int]:
    return {handle.batching.remote().result(timeout_s=30)["pid"] for _ in range(tries)}


def test_failed_device_replica_is_replaced_while_the_other_serves(faulty_app: str) -> None:
    handle = serve.get_deployment_handle("Inference", app_name=APP)
    before = _pids(handle)
    assert len(before) == 2
    with Traffic(faulty_app, {"text": "keep serving"}, workers=4, limit_s=120) as traffic:
        assert traffic.wait_for(lambda answers: len(answers) >= 20, 30)
        started = time.monotonic()
        poisoned = handle.inject_device_error.remote(CUDA_ERROR).result(timeout_s=30)
        replaced_after = None
        while time.monotonic() - started < 90:
            status = serve.status().applications[APP].deployments["Inference"]
            pids = _pids(handle, tries=10) if status.replica_states.get("RUNNING", 0) == 2 else set()
            if len(pids) == 2 and poisoned not in pids:
                replaced_after = time.monotonic() - started
                break
            time.sleep(0.5)
        time.sleep(2)
    answers = traffic.snapshot()
    during = [a for a in answers if a.at >= started]
    statuses = Counter(a.status for a in during)
    print(
        f"\ndevice failure: replica {poisoned} replaced after {replaced_after or float('nan'):.1f} s; "
        f"{len(during)} requests meanwhile: {dict(statuses)}"
    )
    assert replaced_after is not None, "the failed replica was never replaced"
    # The batch that hit the error and everything the failed replica gets until the health check catches it
    # are answered 503 unavailable (retryable: the device failed, not the input; nothing is retried on the
    # dead device, so nothing of it comes back 200 or 500); the other replica serves throughout.
    assert set(statuses) <= {200, 503}, statuses
    assert statuses[503] >= 1, statuses
    assert statuses[200] > statuses[503], statuses
    after = [a for a in answers if a.at >= started + replaced_after]
    assert after and all(a.status == 200 for a in after), Counter(a.status for a in after)
