"""The link-aware autoscaling policy: Serve's queue-length rule, with the link's requests counted too; and
every shipped config that autoscales Inference uses it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ray.serve.autoscaling_policy import replica_queue_length_autoscaling_policy
from ray.serve.config import AutoscalingConfig, AutoscalingContext, AutoscalingPolicy

from deployments.link.autoscaling import LINK_ONGOING, POLICY_PATH, link_aware_policy

ROOT = Path(__file__).resolve().parents[4]


def _context(
    replicas: int, serve_counts: float, link: dict[str, float], target: float = 1.0
) -> AutoscalingContext:
    config = AutoscalingConfig(min_replicas=1, max_replicas=8, target_ongoing_requests=target)
    return AutoscalingContext(
        deployment_id=None,  # type: ignore[arg-type]
        deployment_name="Inference",
        app_name="m",
        current_num_replicas=replicas,
        target_num_replicas=max(replicas, 1),
        running_replicas=[],
        total_num_requests=serve_counts,
        total_queued_requests=0.0,
        aggregated_metrics={LINK_ONGOING: link} if link else {},  # type: ignore[dict-item]
        raw_metrics=None,
        capacity_adjusted_min_replicas=1,
        capacity_adjusted_max_replicas=8,
        policy_state={},
        last_scale_up_time=None,
        last_scale_down_time=None,
        current_time=None,
        config=config,
    )


@pytest.mark.parametrize(
    ("replicas", "serve_counts", "target"), [(1, 0.0, 1.0), (1, 3.0, 1.0), (4, 6.0, 2.0)]
)
def test_without_link_requests_it_decides_as_serves_default(
    replicas: int, serve_counts: float, target: float
) -> None:
    ctx = _context(replicas, serve_counts, {}, target)
    ours, _ = link_aware_policy(ctx)
    serves, _ = replica_queue_length_autoscaling_policy(_context(replicas, serve_counts, {}, target))
    assert ours == pytest.approx(serves)


def test_the_link_requests_count_beside_serves() -> None:
    # All the load came over the link: Serve alone sees none and would keep 1 replica (or scale in).
    ctx = _context(2, 0.0, {"r1": 3.0, "r2": 2.0}, target=1.0)
    assert link_aware_policy(ctx)[0] == pytest.approx(5.0)
    assert replica_queue_length_autoscaling_policy(_context(2, 0.0, {}, 1.0))[0] == pytest.approx(0.0)
    mixed = _context(2, 2.0, {"r1": 1.0, "r2": 1.0}, target=2.0)
    assert link_aware_policy(mixed)[0] == pytest.approx(2.0)


def test_with_no_replica_yet_it_keeps_the_target() -> None:
    assert link_aware_policy(_context(0, 0.0, {}))[0] == 1


def test_serve_loads_the_policy_by_its_path_as_the_controller_does() -> None:
    policy = AutoscalingPolicy(policy_function=POLICY_PATH)
    loaded = policy.get_policy()  # cloudpickled by value, then loaded, as Serve's controller does
    assert loaded(_context(1, 1.0, {"r1": 2.0}))[0] == pytest.approx(3.0)


def _autoscaled_inference(config: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for app in config.get("applications", []):
        for d in app.get("deployments", []):
            if d["name"].endswith("Inference") and d.get("autoscaling_config"):
                found.append(d)
    return found


def _shipped_configs() -> list[Path]:
    return [ROOT / "serve_config.yaml", *sorted((ROOT / "examples").glob("*.yaml"))]


def test_every_shipped_config_that_autoscales_inference_counts_the_link() -> None:
    checked = 0
    for path in _shipped_configs():
        for deployment in _autoscaled_inference(yaml.safe_load(path.read_text()) or {}):
            assert deployment["autoscaling_config"].get("policy") == {"policy_function": POLICY_PATH}, path
            checked += 1
    for path in sorted((ROOT / "k8s").glob("rayservice*.yaml")):
        manifest = yaml.safe_load(path.read_text())
        if "serveConfigV2" not in manifest.get("spec", {}):
            continue
        for deployment in _autoscaled_inference(yaml.safe_load(manifest["spec"]["serveConfigV2"])):
            assert deployment["autoscaling_config"].get("policy") == {"policy_function": POLICY_PATH}, path
            checked += 1
    assert checked >= 4  # serve_config.yaml and the three generated manifests at least
