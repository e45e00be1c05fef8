"""Every metric the service defines reaches Ray's Prometheus endpoints and moves under real traffic.

Ray exports metrics from each node's metrics agent, listed in Ray's Prometheus service-discovery file, every
~5-10 s, so after the traffic the endpoints are polled for up to a minute.
"""

from __future__ import annotations

import functools
import json
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from deployments.config import RouterArgs
from tests.integration.conftest import APP, DEFAULT_MODEL, app_named
from tests.support.monitoring import (
    COUNTER,
    GAUGE,
    GPU_METRICS,
    HISTOGRAM,
    RAY_SERVE_SERIES,
    SERVICE_METRICS,
    exported_series,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# The applications of serve_config.yaml: the router and its model (the conftest asserts their names).
APPS = {APP, DEFAULT_MODEL}
SD_FILE_NAME = "prom_metrics_service_discovery.json"
POLL_TIMEOUT_S = 60.0
POLL_EVERY_S = 2.0
SCRAPE_TIMEOUT_S = 5.0
JSON = {"Content-Type": "application/json"}

# Ray Serve's own series that must move (counters, histogram counts) or exist (gauges) for our application:
# the dashboard plots them. ray_serve_num_ongoing_http_requests carries no application tag, so not here.
RAY_SERVE_MOVED = ("ray_serve_num_http_requests_total", "ray_serve_http_request_latency_ms_count")
RAY_SERVE_PRESENT = ("ray_serve_replica_processing_queries", "ray_serve_deployment_queued_queries")


def ray_sd_file() -> Path:
    """Ray's service-discovery file of the running session (/tmp/ray/<same name> links to the newest one)."""
    import ray

    return Path(ray._private.worker.global_worker.node.get_session_dir_path()) / SD_FILE_NAME


def ray_sd_content() -> list[dict[str, Any]]:
    """The file_sd content for this Ray session: Ray's own file, or the same built from ray.nodes()."""
    path = ray_sd_file()
    if path.exists():
        return json.loads(path.read_text())
    # Ray writes the file from its dashboard (ReportHead, every few seconds), so it is missing under
    # include_dashboard=False or just after start, and the /tmp/ray link may still point at an older
    # session. Its first entries are each alive node's NodeManagerAddress:MetricsExportPort: build those.
    import ray

    targets = [
        f"{node['NodeManagerAddress']}:{node['MetricsExportPort']}"
        for node in ray.nodes()
        if node.get("Alive", node.get("alive"))
    ]
    return [{"labels": {"job": "ray"}, "targets": targets}]


def metrics_ports() -> list[int]:
    ports = sorted({int(t.rsplit(":", 1)[1]) for group in ray_sd_content() for t in group["targets"]})
    assert ports, f"no metrics targets for this Ray session (looked at {ray_sd_file()} and ray.nodes())"
    return ports


@dataclass
class Scrape:
    """One pass over all of Ray's metrics endpoints."""

    totals: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # APP's samples, summed
    samples: dict[str, list[Sample]] = field(default_factory=lambda: defaultdict(list))  # APP's samples
    names: set[str] = field(default_factory=set)  # every sample name, any application
    skipped: dict[int, str] = field(default_factory=dict)  # port -> why it gave nothing


def scrape(ports: list[int]) -> Scrape:
    """Scrape 127.0.0.1:<port> for each target (local Ray: the node's own address may not be reachable)."""
    result = Scrape()
    with httpx.Client(timeout=SCRAPE_TIMEOUT_S, trust_env=False) as client:
        for port in ports:
            try:
                resp = client.get(f"http://127.0.0.1:{port}/metrics")
                resp.raise_for_status()
                families = list(text_string_to_metric_families(resp.text))
            except (httpx.HTTPError, ValueError) as exc:
                # Ray lists a few ports per node; one may refuse or serve no exposition text. Skip it.
                result.skipped[port] = repr(exc)
                continue
            for family in families:
                for sample in family.samples:
                    result.names.add(sample.name)
                    if sample.labels.get("application") in APPS:
                        result.totals[sample.name] += sample.value
                        result.samples[sample.name].append(sample)
    return result


def must_move() -> list[str]:
    """Series whose total must rise under traffic: counters and histogram counts (GPU ones aside)."""
    names = []
    for name, kind in SERVICE_METRICS.items():
        if name in GPU_METRICS:
            continue
        if kind == COUNTER:
            names.extend(exported_series(name, kind))
        elif kind == HISTOGRAM:
            names.append(f"{name}_count")
    return [*names, *RAY_SERVE_MOVED]


@functools.cache
def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def must_exist() -> list[str]:
    """Gauges that must be exported (their value may be anything, e.g. an empty queue); the GPU ones are
    waited for only where a GPU is, but test_gpu_gauges_only_with_a_gpu decides about them."""
    gauges = [n for n, kind in SERVICE_METRICS.items() if kind == GAUGE]
    if not cuda_available():
        gauges = [n for n in gauges if n not in GPU_METRICS]
    return [*gauges, *RAY_SERVE_PRESENT]


def not_moved(before: Scrape, after: Scrape) -> list[str]:
    stuck = [n for n in must_move() if after.totals.get(n, 0.0) <= before.totals.get(n, 0.0)]
    return stuck + [n for n in must_exist() if n not in after.samples]


def send_traffic(base_url: str, max_inputs: int) -> Counter[int]:
    """Bounded traffic of every kind the metrics count: good requests of 1..16 texts, both routes, 4xx."""
    statuses: Counter[int] = Counter()

    def embed(i: int) -> int:
        # Texts of different lengths, so batches carry padding and padding efficiency is below 1.
        texts = [f"metrics probe {i}.{j}: " + "word " * (1 + (i * 7 + j * 3) % 40) for j in range(1 + i % 16)]
        return client.post("/v1/embeddings", json={"input": texts}).status_code

    with httpx.Client(base_url=base_url, timeout=60.0, trust_env=False) as client:
        with ThreadPoolExecutor(max_workers=8) as pool:  # concurrent, so batches hold several requests
            statuses.update(pool.map(embed, range(40)))
        for i in range(2):
            statuses[
                client.post("/predict", json={"texts": [f"predict probe {i}", "second"]}).status_code
            ] += 1
        for _ in range(3):
            statuses[client.post("/v1/embeddings", content=b"{not json", headers=JSON).status_code] += 1
        # Over the configured input limit: refused before tokenizing (moves rejected_total).
        too_many = {"input": ["x"] * (max_inputs + 1)}
        statuses[client.post("/v1/embeddings", json=too_many).status_code] += 1
    return statuses


@dataclass
class Observed:
    before: Scrape
    after: Scrape
    statuses: Counter[int]
    waited_s: float


@pytest.fixture(scope="module")
def observed(serve_harness: Any, base_url: str) -> Observed:
    """Scrape, send traffic, then scrape until everything moved (or POLL_TIMEOUT_S passed)."""
    limits = RouterArgs.model_validate(serve_harness.base_config["applications"][0]["args"]).limits
    ports = metrics_ports()
    before = scrape(ports)
    statuses = send_traffic(base_url, limits.max_inputs_per_request)
    started = time.monotonic()
    after = scrape(ports)
    while not_moved(before, after) and time.monotonic() - started < POLL_TIMEOUT_S:
        time.sleep(POLL_EVERY_S)
        after = scrape(ports)
    return Observed(before, after, statuses, time.monotonic() - started)


def _context(obs: Observed) -> str:
    ours = sorted(n for n in obs.after.names if n.startswith("ray_") and not n.startswith("ray_serve_"))
    return (
        f"after {obs.waited_s:.0f} s; traffic statuses {dict(obs.statuses)}; skipped targets "
        f"{obs.after.skipped}; {sorted(APPS)} totals {dict(obs.after.totals)}; "
        f"non-Serve ray_ series seen: {ours[:80]}"
    )


def test_traffic_was_answered_as_intended(observed: Observed) -> None:
    assert observed.statuses[200] == 42, observed.statuses
    assert observed.statuses[400] == 4, observed.statuses


def test_some_metrics_endpoint_answers(observed: Observed) -> None:
    assert observed.after.names, f"no metrics target answered: {observed.after.skipped}"


def test_service_counters_and_histograms_moved(observed: Observed) -> None:
    stuck = [n for n in must_move() if not n.startswith("ray_serve_")]
    stuck = [n for n in stuck if observed.after.totals.get(n, 0.0) <= observed.before.totals.get(n, 0.0)]
    assert not stuck, f"did not move: {stuck}; {_context(observed)}"


def test_service_gauges_present(observed: Observed) -> None:
    wanted = [n for n in must_exist() if not n.startswith("ray_serve_") and n not in GPU_METRICS]
    missing = [n for n in wanted if n not in observed.after.samples]
    assert not missing, f"not exported: {missing}; {_context(observed)}"


def test_requests_total_is_tagged_by_route_and_status(observed: Observed) -> None:
    samples = observed.after.samples["ray_requests_total"]
    routes = {s.labels.get("route") for s in samples}
    codes = {s.labels.get("status_code") for s in samples}
    assert {"embeddings", "predict"} <= routes, routes
    assert "200" in codes and "400" in codes, codes
    assert all(s.labels.get("deployment") and s.labels.get("replica") for s in samples), samples


def test_rejected_total_is_tagged_by_reason(observed: Observed) -> None:
    # The traffic had malformed JSON ("invalid") and one request over the input limit ("too_large").
    reasons = {s.labels.get("reason") for s in observed.after.samples["ray_rejected_total"]}
    assert {"invalid", "too_large"} <= reasons, f"reasons: {reasons}; {_context(observed)}"


def test_the_router_reaches_its_local_pipeline_over_the_link(observed: Observed) -> None:
    # One node: the model's pipeline replica is local, so the router's calls go over the Unix socket
    # (deployments/link/), not Serve's handle, once the replica's card has come (within a second).
    link, handle = (
        _moved(observed, "ray_model_calls_total", "link"),
        _moved(observed, "ray_model_calls_total", "handle"),
    )
    assert link > 0 and link > handle, f"link {link}, handle {handle}; {_context(observed)}"


def test_the_pipeline_reaches_its_local_inference_over_the_link(observed: Observed) -> None:
    # One node: the model's Inference replica is local too, so the pipeline's groups go over its Unix socket
    # (pipeline/inference_calls.py) once its card has come.
    link, handle = (
        _moved(observed, "ray_inference_calls_total", "link"),
        _moved(observed, "ray_inference_calls_total", "handle"),
    )
    assert link > 0 and link > handle, f"link {link}, handle {handle}; {_context(observed)}"


def _moved(observed: Observed, metric: str, transport: str) -> float:
    """How much ``metric`` grew for ``transport`` over the observed traffic."""

    def total(scrape: Scrape) -> float:
        return sum(s.value for s in scrape.samples[metric] if s.labels.get("transport") == transport)

    return total(observed.after) - total(observed.before)


def test_model_info_names_the_served_model(observed: Observed, serve_harness: Any) -> None:
    model = app_named(serve_harness.base_config, DEFAULT_MODEL)["args"]["model"]
    samples = observed.after.samples["ray_model_info"]
    assert samples, f"ray_model_info not exported; {_context(observed)}"
    for sample in samples:  # a canary version, if another test deployed one, has its own sample
        assert sample.value == 1, sample
        assert all(sample.labels.get(tag) for tag in ("model", "version", "backend", "device")), sample
    served = {(s.labels["model"], s.labels["version"], s.labels["backend"]) for s in samples}
    assert (model["name"], str(model["version"]), model.get("backend", "torch")) in served, served


def served_on_gpu(observed: Observed) -> bool:
    return any(
        s.labels.get("device", "").startswith("cuda") for s in observed.after.samples["ray_model_info"]
    )


def test_gpu_gauges_only_with_a_gpu(observed: Observed) -> None:
    if cuda_available() and not served_on_gpu(observed):
        # serve_config.yaml gives Inference num_gpus: 0; whether NVML then sees a device depends on the
        # CUDA_VISIBLE_DEVICES Ray sets, so neither presence nor absence is a fault here.
        pytest.skip("a GPU is present but textserve's Inference runs on the CPU")
    if cuda_available():
        missing = [n for n in sorted(GPU_METRICS) if n not in observed.after.samples]
        assert not missing, f"a GPU is present but not reported: {missing}; {_context(observed)}"
        assert all(s.labels.get("device") for n in GPU_METRICS for s in observed.after.samples[n])
        assert observed.after.totals["ray_gpu_memory_used_bytes"] > 0
    else:
        # Any application: NVML metrics must not appear at all on a machine without a GPU.
        present = GPU_METRICS & observed.after.names
        assert not present, f"GPU metrics exported without a GPU: {present}"


def test_ray_serve_metrics_on_the_dashboard_are_exported(observed: Observed) -> None:
    # Names from Ray's source (the unit tests check them against the installed Ray); here: exported for real.
    assert {*RAY_SERVE_MOVED, *RAY_SERVE_PRESENT} <= RAY_SERVE_SERIES
    stuck = [
        n for n in RAY_SERVE_MOVED if observed.after.totals.get(n, 0.0) <= observed.before.totals.get(n, 0.0)
    ]
    missing = [n for n in RAY_SERVE_PRESENT if n not in observed.after.samples]
    assert not stuck and not missing, f"did not move: {stuck}, missing: {missing}; {_context(observed)}"
