"""Model versions: blue-green switch by config with no failed request, canary share, per-request pins.

The switch goes through `serve deploy` (Serve's REST API on the dashboard), as on a cluster.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from ray import serve

from tests.integration.conftest import (
    APP as ROUTER,
)
from tests.integration.conftest import (
    CLASSIFIER,
    DEFAULT_MODEL,
    ServeHarness,
    deployment_named,
    routed_model,
    shipped_draining,
)
from tests.integration.traffic import Answer, Traffic, failures

pytestmark = pytest.mark.integration

APP = "versions"
ROUTE = "/versions"
SERVE_CLI = Path(sys.executable).parent / "serve"
ROLLOUT_TIMEOUT_S = 180


def _entry(
    harness: ServeHarness, repo: Path, version: str, candidate: str | None, share: float
) -> list[dict[str, Any]]:
    """The model application (tiny-sentiment, served as APP) and its own router at ROUTE."""
    model = {"repository": str(repo), "name": "tiny-sentiment", "task": "classify", "backend": "torch"}
    entry, router = routed_model(harness, APP, ROUTE, {**model, "version": version})
    shipped_draining(entry)  # its old version's replicas drain as they would in production
    entry["args"]["candidate"] = {"version": candidate} if candidate else None
    deployment_named(entry, "Model")["user_config"] = {"candidate_share": share}
    # No degraded answers from the cache: they would hide a failed request.
    deployment_named(router, "Ingress")["user_config"] = {"fallback_cache_mb": 0}
    return [entry, router]


def _config(harness: ServeHarness, entries: list[dict[str, Any]]) -> dict[str, Any]:
    config = harness.config()
    config["applications"].extend(entries)
    return config


def _serve_deploy(harness: ServeHarness, config: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / f"serve_config_{time.monotonic_ns()}.yaml"
    path.write_text(yaml.safe_dump(config))
    cmd = [str(SERVE_CLI), "deploy", str(path), "--address", harness.dashboard_url]
    subprocess.run(cmd, check=True, timeout=120, capture_output=True)


def _replica_ids(*apps: str) -> dict[str, set[str]]:
    """Every replica id of each deployment of ``apps``, as Serve reports them."""
    from ray.serve.context import _get_global_client

    details = _get_global_client().get_serve_details()["applications"]
    return {
        f"{app}/{name}": {r["replica_id"] for r in deployment["replicas"]}
        for app in apps
        for name, deployment in details[app]["deployments"].items()
    }


def _settled() -> bool:
    status = serve.status().applications.get(APP)
    return (
        status is not None
        and status.status == "RUNNING"
        and all(d.status == "HEALTHY" for d in status.deployments.values())
    )


@pytest.fixture
def versions_app(serve_harness: ServeHarness) -> Iterator[None]:
    yield
    serve_harness.remove_extras()


def _rollout(traffic: Traffic, version: str, since: float) -> float:
    """Wait until the new version answers and the app has settled; returns when it had."""
    deadline = time.monotonic() + ROLLOUT_TIMEOUT_S
    while time.monotonic() < deadline:
        answered = any(a.version == version and a.at > since for a in traffic.snapshot())
        if answered and _settled():
            return time.monotonic()
        time.sleep(0.2)
    seen = Counter((a.status, a.version) for a in traffic.snapshot() if a.at > since)
    status = serve.status().applications.get(APP)
    raise TimeoutError(f"version {version} never took over: answers {seen}, {status}")


# Every deployment of a model application surges (max_surge_percent 100): the new version's replicas are up
# before the old ones drain, and a request the router addressed to the old version by its card (refreshed
# every second) goes to whichever version holds the stable role now. Without both, a few requests of a
# thousand hung to the deadline or got a 404 during the roll.
def test_blue_green_switch_fails_no_request(
    serve_harness: ServeHarness, model_repo: Path, tmp_path: Path, versions_app: None
) -> None:
    _switch_under_traffic(serve_harness, model_repo, tmp_path, ("2",))


@pytest.mark.slow
def test_blue_green_switch_and_back_fails_no_request(
    serve_harness: ServeHarness, model_repo: Path, tmp_path: Path, versions_app: None
) -> None:
    """The round trip (v1 -> v2 -> v1): the default suite makes one switch, this the second one too."""
    _switch_under_traffic(serve_harness, model_repo, tmp_path, ("2", "1"))


def _switch_under_traffic(
    serve_harness: ServeHarness, model_repo: Path, tmp_path: Path, sequence: tuple[str, ...]
) -> None:
    _serve_deploy(
        serve_harness, _config(serve_harness, _entry(serve_harness, model_repo, "1", None, 0)), tmp_path
    )
    serve_harness.wait({APP: "RUNNING", f"{APP}-router": "RUNNING"})
    serve_harness.wait_routed(APP, route=ROUTE)
    others = _replica_ids(ROUTER, DEFAULT_MODEL, CLASSIFIER, f"{APP}-router")
    url = f"{serve_harness.url}{ROUTE}/predict"
    with Traffic(url, {"texts": ["a fine day", "a bad day"]}, workers=4) as traffic:
        assert traffic.wait_for(lambda answers: len(answers) >= 20, 60)
        for new in sequence:
            started = time.monotonic()
            entry = _entry(serve_harness, model_repo, new, None, 0)
            _serve_deploy(serve_harness, _config(serve_harness, entry), tmp_path)
            done = _rollout(traffic, new, started)
            time.sleep(3.0)  # traffic keeps flowing after the switch
            after = [a for a in traffic.snapshot() if a.at > done]
            first_new = min(a.at for a in traffic.snapshot() if a.version == new and a.at > started)
            during = [a for a in traffic.snapshot() if started <= a.at <= done]
            print(
                f"\nswitch to v{new}: first v{new} answer after {first_new - started:.1f} s, "
                f"settled after {done - started:.1f} s; {len(during)} answers during the switch, "
                f"{len(failures(during))} failed; after it: {dict(Counter(a.version for a in after))}"
            )
            assert after and all(a.version == new for a in after), Counter(a.version for a in after)
    answers = traffic.snapshot()
    print(f"total {len(answers)} requests, {len(failures(answers))} failed")
    # Only the rolled model's replicas changed: every other application kept every replica it had.
    assert _replica_ids(ROUTER, DEFAULT_MODEL, CLASSIFIER, f"{APP}-router") == others
    assert failures(answers) == [], Counter((a.status, a.version) for a in failures(answers))


def _versions(url: str, body: dict[str, Any], n: int) -> Counter[str | None]:
    def one(_: int) -> Answer:
        r = httpx.post(url, json=body, timeout=30)
        assert r.status_code == 200, r.text
        return Answer(time.monotonic(), r.status_code, r.headers.get("x-model-version"))

    with ThreadPoolExecutor(8) as pool:
        return Counter(a.version for a in pool.map(one, range(n)))


@pytest.mark.slow  # ~2.5 minutes; the default suite keeps the blue-green switch test
def test_canary_share_is_set_by_config_and_versions_can_be_pinned(
    serve_harness: ServeHarness, model_repo: Path, versions_app: None
) -> None:
    serve_harness.apply(_config(serve_harness, _entry(serve_harness, model_repo, "1", "2", 0.25)))
    serve_harness.wait({APP: "RUNNING", f"{APP}-router": "RUNNING"})
    serve_harness.wait_routed(APP, f"{APP}:2", route=ROUTE)
    url = f"{serve_harness.url}{ROUTE}/predict"
    body = {"texts": ["canary traffic"]}

    n = 400
    split = _versions(url, body, n)
    share = split["2"] / n
    print(f"\ncanary share configured 0.25, measured {share:.3f} over {n} requests: {dict(split)}")
    assert set(split) == {"1", "2"}
    assert abs(share - 0.25) < 0.07  # 3 standard deviations of a binomial(400, 0.25) share

    # Pins win over the split; an unknown version is a 404 naming what is served.
    assert _versions(url, {**body, "model": f"{APP}:2"}, 40) == {"2": 40}
    assert _versions(url, {**body, "model": f"{APP}:1"}, 40) == {"1": 40}
    r = httpx.post(url, json={**body, "model": f"{APP}:3"}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert "['1', '2']" in r.json()["error"]["message"]
    models = httpx.get(f"{serve_harness.url}{ROUTE}/v1/models", timeout=30)
    assert models.status_code == 200, models.text
    listed = models.json()["data"]
    assert {(m["id"], m["role"]) for m in listed} >= {
        (f"{APP}:1", "stable"),
        (f"{APP}:2", "candidate"),
    }

    # The share changes by config alone (reconfigure, no restart): all to the candidate, then none.
    for share_now, expected in ((1.0, {"2": 60}), (0.0, {"1": 60})):
        serve_harness.apply(_config(serve_harness, _entry(serve_harness, model_repo, "1", "2", share_now)))
        time.sleep(3)
        assert _versions(url, body, 60) == expected
