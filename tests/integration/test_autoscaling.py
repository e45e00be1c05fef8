"""The inference deployment scales out on queue length and back in when the load stops.

The session's Ray declares two logical GPUs (as `ray start --head --num-gpus=2` does); each inference
replica asks for one, as on the cluster, and the shipped autoscaling policy (target_ongoing_requests)
decides. Only the bounds and delays are shortened so the test takes a minute, not ten.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from ray import serve

from tests.integration.conftest import (
    DEFAULT_MODEL,
    ROOT,
    ServeHarness,
    app_named,
    deployment_named,
    routed_model,
)
from tests.integration.texts import near_limit
from tests.integration.traffic import Traffic, failures

# Slow (about 2-3 minutes with its set-up and teardown): in `bash .ci/run -m slow`, not the default suite.
pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "autoscale"
ROUTE = "/autoscale"


def _running_replicas() -> int:
    status = serve.status().applications.get(APP)
    return status.deployments["Inference"].replica_states.get("RUNNING", 0) if status else 0


def _wait_replicas(n: int, timeout_s: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if _running_replicas() == n:
            return time.monotonic() - start
        time.sleep(0.25)
    return None


@pytest.fixture
def autoscale_app(serve_harness: ServeHarness) -> Iterator[str]:
    entry, router = routed_model(serve_harness, APP, ROUTE, {})  # the default model, as shipped
    inference = deployment_named(entry, "Inference")
    inference["ray_actor_options"] = {"num_cpus": 0.25, "num_gpus": 1}
    inference["autoscaling_config"].update(
        max_replicas=2, upscale_delay_s=2, downscale_delay_s=8, metrics_interval_s=1, look_back_period_s=3
    )
    serve_harness.deploy_extra(entry, router)
    yield f"{serve_harness.url}{ROUTE}/v1/embeddings"
    serve_harness.remove_extras()


def test_inference_scales_out_under_load_and_back_in_after(autoscale_app: str) -> None:
    shipped = _shipped_inference()["autoscaling_config"]["target_ongoing_requests"]
    assert _running_replicas() == 1
    texts = [f"{i}: {near_limit(60)}" for i in range(32)]
    with Traffic(autoscale_app, {"input": texts}, workers=8, limit_s=150) as traffic:
        scale_up_s = _wait_replicas(2, timeout_s=120)
        served = len(traffic.snapshot())
    assert scale_up_s is not None, f"never scaled out (target_ongoing_requests={shipped})"
    scale_down_s = _wait_replicas(1, timeout_s=120)
    down = "never" if scale_down_s is None else f"{scale_down_s:.1f} s"
    print(
        f"\nautoscaling (target_ongoing_requests={shipped}): 1 -> 2 replicas {scale_up_s:.1f} s after the "
        f"load started; 2 -> 1 {down} after it stopped; {served} requests, "
        f"{len(failures(traffic.snapshot()))} failed"
    )
    assert scale_down_s is not None, "never scaled back in after the load stopped"
    assert failures(traffic.snapshot()) == []


def _shipped_inference() -> dict[str, Any]:
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    return deployment_named(app_named(config, DEFAULT_MODEL), "Inference")
