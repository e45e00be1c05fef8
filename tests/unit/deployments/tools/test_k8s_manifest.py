"""The RayService generator: merge rules, rendering, and the --write / --check command."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployments.tools.k8s_manifest import (
    BASE,
    OUTPUT,
    OVERLAY,
    SERVE_CONFIG,
    main,
    merge_serve_config,
    render_rayservice,
)

ROOT = Path(__file__).resolve().parents[4]


def _serve(*apps: str) -> dict[str, Any]:
    deployments = [
        {"name": "Ingress", "num_replicas": 1, "ray_actor_options": {"num_cpus": 0.2}},
        {"name": "Inference", "num_replicas": 1, "ray_actor_options": {"num_cpus": 1.0, "num_gpus": 0}},
    ]
    return {
        "http_options": {"host": "127.0.0.1", "port": 8000},
        "applications": [
            {"name": a, "import_path": "deployments.app:build_app", "args": {"model": {"version": "1"}},
             "deployments": copy.deepcopy(deployments)}
            for a in apps
        ],
    }  # fmt: skip


GPU_PATCH = {"name": "Inference", "ray_actor_options": {"num_gpus": 1}}
BASE_DOC = {"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": "t"}, "spec": {"a": 1}}


def test_deployments_merge_by_name_and_deeply() -> None:
    serve = _serve("app")
    merged = merge_serve_config(serve, {"applications": [{"name": "app", "deployments": [GPU_PATCH]}]})
    ingress, inference = merged["applications"][0]["deployments"]
    assert inference["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 1}  # num_cpus kept
    assert ingress == serve["applications"][0]["deployments"][0]  # untouched
    assert serve == _serve("app"), "the input was modified"


def test_null_removes_a_key_and_other_values_replace() -> None:
    overlay = {"http_options": None, "proxy_location": "EveryNode"}
    merged = merge_serve_config(_serve("app"), overlay)
    assert "http_options" not in merged and merged["proxy_location"] == "EveryNode"


def test_patterns_match_many_and_plain_names_one() -> None:
    overlay = {
        "applications": [
            {"name": "*", "deployments": [{**GPU_PATCH, "name": "*ence"}]},
            {"name": "candidate", "args": {"model": {"version": "2"}}},
        ]
    }
    stable, candidate = merge_serve_config(_serve("stable", "candidate"), overlay)["applications"]
    for app in (stable, candidate):
        assert app["deployments"][1]["ray_actor_options"]["num_gpus"] == 1
    assert stable["args"]["model"]["version"] == "1" and candidate["args"]["model"]["version"] == "2"


@pytest.mark.parametrize(
    "overlay",
    [
        {"applications": [{"name": "other", "route_prefix": "/x"}]},
        {"applications": [{"name": "app", "deployments": [{"name": "Inferense", "num_replicas": 2}]}]},
        {"applications": [{"name": "*", "deployments": [{"name": "Missing"}]}]},
    ],
)
def test_an_overlay_name_that_matches_nothing_is_an_error(overlay: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="does not have"):
        merge_serve_config(_serve("app"), overlay)


def test_render_embeds_the_serve_config_as_a_literal_block() -> None:
    text = render_rayservice(_serve("app"), BASE_DOC, {"http_options": None})
    assert "\n  serveConfigV2: |\n" in text
    doc = yaml.safe_load(text)
    assert isinstance(doc["spec"]["serveConfigV2"], str) and doc["spec"]["a"] == 1
    assert yaml.safe_load(doc["spec"]["serveConfigV2"]) == merge_serve_config(
        _serve("app"), {"http_options": None}
    )


def test_render_refuses_a_base_that_sets_serve_config_v2() -> None:
    base = copy.deepcopy(BASE_DOC)
    base["spec"]["serveConfigV2"] = "applications: []"
    with pytest.raises(ValueError, match="serveConfigV2"):
        render_rayservice(_serve("app"), base, {})


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the generator's inputs and output, to change freely."""
    for rel in (SERVE_CONFIG, BASE, OVERLAY, OUTPUT):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    return tmp_path


def test_check_passes_on_the_committed_files(project: Path) -> None:
    assert main(["--check", "--root", str(project)]) == 0


def test_check_fails_with_a_diff_on_a_hand_edited_output(
    project: Path, capsys: pytest.CaptureFixture
) -> None:
    target = project / OUTPUT
    target.write_text(target.read_text().replace("maxReplicas: 8", "maxReplicas: 9"))
    assert main(["--check", "--root", str(project)]) == 1
    out = capsys.readouterr().out
    assert "-      maxReplicas: 9\n" in out and "+      maxReplicas: 8\n" in out
    assert main(["--write", "--root", str(project)]) == 0
    assert main(["--check", "--root", str(project)]) == 0


def test_a_changed_serve_config_needs_only_a_rewrite(project: Path) -> None:
    """What the parallel serve_config.yaml changes will do: autoscaling on Inference, a new model version."""
    config = yaml.safe_load((project / SERVE_CONFIG).read_text())
    app = config["applications"][0]
    app["args"]["model"]["version"] = "2"
    (inference,) = [d for d in app["deployments"] if d["name"] == "Inference"]
    inference.pop("num_replicas", None)
    inference["autoscaling_config"] = {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 4}
    (project / SERVE_CONFIG).write_text(yaml.safe_dump(config, sort_keys=False))
    assert main(["--check", "--root", str(project)]) == 1
    assert main(["--write", "--root", str(project)]) == 0
    assert main(["--check", "--root", str(project)]) == 0

    from ray.serve.schema import ServeDeploySchema

    serve = yaml.safe_load(yaml.safe_load((project / OUTPUT).read_text())["spec"]["serveConfigV2"])
    ServeDeploySchema.model_validate(serve)
    cluster_app = serve["applications"][0]
    assert cluster_app["args"]["model"]["version"] == "2"
    (remote,) = [d for d in cluster_app["deployments"] if d["name"] == "Inference"]
    # The local autoscaling settings travel; the overlay raises only the ceiling.
    assert remote["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 8,
        "target_ongoing_requests": 4,
    }


def test_missing_input_is_reported_not_raised(project: Path, capsys: pytest.CaptureFixture) -> None:
    (project / OVERLAY).unlink()
    assert main(["--check", "--root", str(project)]) == 2
    assert "overlay.yaml" in capsys.readouterr().err
