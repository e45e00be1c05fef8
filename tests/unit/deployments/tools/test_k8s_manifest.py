"""The RayService generator: merge rules, rendering, and the --write / --check command."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployments.link.autoscaling import POLICY_PATH
from deployments.tools.k8s_manifest import (
    BASE,
    GENERATE_CONFIG,
    GENERATED,
    MULTI_MODEL_CONFIG,
    OUTPUT,
    OVERLAY,
    SERVE_CONFIG,
    main,
    merge_serve_config,
    output_for,
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


def test_import_path_selects_applications_and_defaults_fill_only_gaps() -> None:
    serve = _serve("router", "model")
    serve["applications"][0]["import_path"] = "deployments.app:build_router"
    serve["applications"][1]["route_prefix"] = None  # a null in the config is a value, not a deletion
    serve["applications"][1]["deployments"][1]["autoscaling_config"] = {"target_ongoing_requests": 4}
    overlay = {
        "applications": [
            {"import_path": "*:build_app", "deployments": [
                {"name": "Inference", "autoscaling_config": {"max_replicas": 8},
                 "defaults": {"autoscaling_config": {"target_ongoing_requests": 32, "upscale_delay_s": 10}}},
            ]},
        ]
    }  # fmt: skip
    router, model = merge_serve_config(serve, overlay)["applications"]
    assert router == serve["applications"][0]
    assert model["import_path"] == "deployments.app:build_app" and model["route_prefix"] is None
    policy = model["deployments"][1]["autoscaling_config"]
    assert policy == {"target_ongoing_requests": 4, "upscale_delay_s": 10, "max_replicas": 8}
    with pytest.raises(ValueError, match=r"import_path 'x:y'.*does not have"):
        merge_serve_config(serve, {"applications": [{"name": "*", "import_path": "x:y"}]})


def _model_apps(*tasks: str | None) -> dict[str, Any]:
    """A router and one build_model application per task (None: the config names no task)."""
    serve = _serve("router", *(f"m-{task}" for task in tasks))
    serve["applications"][0]["import_path"] = "deployments.app:build_router"
    serve["applications"][0]["args"] = {}
    for app, task in zip(serve["applications"][1:], tasks, strict=True):
        app["import_path"] = "deployments.app:build_model"
        if task is not None:
            app["args"]["model"]["task"] = task
    return serve


GENERATE_ENTRY = {
    "import_path": "deployments.app:build_model",
    "task": "generate",
    "deployments": [{"name": "Inference", "ray_actor_options": {"num_gpus": 1}}],
}
ENCODER_ENTRY = {
    "import_path": "deployments.app:build_model",
    "task": "!generate",
    "args": {"runtime": {"p": 1}},
}


def test_task_selects_model_applications_by_their_task() -> None:
    serve = _model_apps("embed", None, "generate", "classify")
    merged = merge_serve_config(serve, {"applications": [GENERATE_ENTRY, ENCODER_ENTRY]})
    router, embed, default, generate, classify = merged["applications"]
    assert router == serve["applications"][0]  # not a model application: no task to match, nor its negation
    for app in (embed, default, classify):  # no task written: ModelConfig's default (embed)
        assert app["args"]["runtime"] == {"p": 1}
        assert app["deployments"][1]["ray_actor_options"]["num_gpus"] == 0
    assert "runtime" not in generate["args"]
    assert generate["deployments"][1]["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 1}


def test_a_task_may_be_absent_but_its_deployments_must_match() -> None:
    serve = _model_apps("embed")  # a config without a generate model
    assert merge_serve_config(serve, {"applications": [GENERATE_ENTRY]}) == serve
    generate = _model_apps("generate")
    renamed = copy.deepcopy(GENERATE_ENTRY)
    renamed["deployments"][0]["name"] = "Generator"
    with pytest.raises(ValueError, match=r"name 'Generator'.*does not have"):
        merge_serve_config(generate, {"applications": [renamed]})
    with pytest.raises(ValueError, match="does not have"):  # other selectors keep the rule
        merge_serve_config(serve, {"applications": [{"import_path": "x:y"}]})


def test_the_overlay_gives_every_generate_model_a_gpu() -> None:
    overlay = yaml.safe_load((ROOT / OVERLAY).read_text())
    serve = yaml.safe_load((ROOT / GENERATE_CONFIG).read_text())
    by_name = {a["name"]: a for a in merge_serve_config(serve, overlay)["applications"]}
    generating = [
        a for a in serve["applications"] if (a.get("args") or {}).get("model", {}).get("task") == "generate"
    ]
    assert generating, f"{GENERATE_CONFIG} serves no generate model"
    for local in generating:
        app = by_name[local["name"]]
        assert app["args"]["model"]["device"] == "cuda" and "backend" not in app["args"]["model"]
        assert "runtime" not in app["args"], "the encoder's runtime settings stay off the generate model"
        (model,) = [d for d in app["deployments"] if d["name"] == "Model"]
        assert model["ray_actor_options"]["num_gpus"] == 1
        assert model["ray_actor_options"]["num_cpus"] == 0.5  # the config's own options are kept


def test_a_patch_that_only_deletes_creates_nothing() -> None:
    merged = merge_serve_config(
        _serve("app"), {"applications": [{"name": "*", "runtime_env": {"env_vars": {"A": None}}}]}
    )
    assert "runtime_env" not in merged["applications"][0]


def test_anchors_and_merge_keys_come_out_resolved() -> None:
    config = yaml.safe_load("""
env: &env {A: "1", B: "2"}
applications:
  - {name: a, import_path: m:f, runtime_env: {env_vars: &vars {<<: *env, C: "3"}}}
  - {name: b, import_path: m:f, runtime_env: {env_vars: *vars}}
""")
    text = render_rayservice(config, BASE_DOC, {})
    serve_text = yaml.safe_load(text)["spec"]["serveConfigV2"]
    for doc in (text, serve_text):
        assert not [
            e for e in yaml.parse(doc) if isinstance(e, yaml.AliasEvent) or getattr(e, "anchor", None)
        ]
    a, b = yaml.safe_load(serve_text)["applications"]
    assert a["runtime_env"] == b["runtime_env"] == {"env_vars": {"A": "1", "B": "2", "C": "3"}}


def test_outputs_are_named_after_their_config() -> None:
    assert output_for(SERVE_CONFIG) == OUTPUT == Path("k8s/rayservice.yaml")
    assert output_for(MULTI_MODEL_CONFIG) == Path("k8s/rayservice.multi-model.yaml")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the generator's inputs and outputs, to change freely."""
    for rel in (BASE, OVERLAY, *GENERATED, *map(output_for, GENERATED)):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    return tmp_path


# How to name each committed manifest's config on the command line (the default needs nothing).
SELECT = [
    pytest.param([], SERVE_CONFIG, id="default"),
    pytest.param(["--config", str(MULTI_MODEL_CONFIG)], MULTI_MODEL_CONFIG, id="multi-model"),
]


@pytest.mark.parametrize("select", [[], ["--config", str(MULTI_MODEL_CONFIG)], ["--all"]])
def test_check_passes_on_the_committed_files(project: Path, select: list[str]) -> None:
    assert main(["--check", *select, "--root", str(project)]) == 0


@pytest.mark.parametrize(("select", "config"), SELECT)
def test_check_fails_with_a_diff_on_a_hand_edited_output(
    project: Path, capsys: pytest.CaptureFixture, select: list[str], config: Path
) -> None:
    target = project / output_for(config)
    target.write_text(target.read_text().replace("maxReplicas: 8", "maxReplicas: 9"))
    assert main(["--check", *select, "--root", str(project)]) == 1
    assert main(["--check", "--all", "--root", str(project)]) == 1
    out = capsys.readouterr().out
    assert "-      maxReplicas: 9\n" in out and "+      maxReplicas: 8\n" in out
    assert f"--- {output_for(config).as_posix()}\n" in out
    assert main(["--write", *select, "--root", str(project)]) == 0
    assert main(["--check", "--all", "--root", str(project)]) == 0


@pytest.mark.parametrize(("select", "config"), SELECT)
def test_a_changed_serve_config_needs_only_a_rewrite(project: Path, select: list[str], config: Path) -> None:
    """A model's new version and its own autoscaling policy: the manifest follows after --write alone."""
    config_doc = yaml.safe_load((project / config).read_text())
    (app, *_) = [a for a in reversed(config_doc["applications"]) if a["import_path"].endswith(":build_model")]
    app["args"]["model"]["version"] = "2"
    (inference,) = [d for d in app["deployments"] if d["name"] == "Inference"]
    inference.pop("num_replicas", None)
    inference["autoscaling_config"] = {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 4}
    (project / config).write_text(yaml.safe_dump(config_doc, sort_keys=False))
    assert main(["--check", *select, "--root", str(project)]) == 1
    other = [c for c in GENERATED if c != config]
    assert all(main(["--check", "--config", str(c), "--root", str(project)]) == 0 for c in other)
    assert main(["--write", *select, "--root", str(project)]) == 0
    assert main(["--check", "--all", "--root", str(project)]) == 0

    from ray.serve.schema import ServeDeploySchema

    rendered = yaml.safe_load((project / output_for(config)).read_text())
    serve = yaml.safe_load(rendered["spec"]["serveConfigV2"])
    ServeDeploySchema.model_validate(serve)
    (cluster_app,) = [a for a in serve["applications"] if a["name"] == app["name"]]
    assert cluster_app["args"]["model"]["version"] == "2"
    (remote,) = [d for d in cluster_app["deployments"] if d["name"] == "Inference"]
    # The local autoscaling settings travel; the overlay raises the ceiling, sets the policy that counts the
    # link's groups, and fills in the delays.
    assert remote["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 8,
        "target_ongoing_requests": 4,
        "upscale_delay_s": 10,
        "downscale_delay_s": 120,
        "policy": {"policy_function": POLICY_PATH},
    }


def test_out_writes_elsewhere_and_all_wants_a_mode(project: Path) -> None:
    out = Path("k8s/staging.yaml")
    args = ["--config", str(MULTI_MODEL_CONFIG), "--out", str(out), "--root", str(project)]
    assert main(["--write", *args]) == 0
    assert main(["--check", *args]) == 0
    command = "python -m deployments.tools.k8s_manifest --write --config examples/multi-model.yaml"
    first_line = (project / out).read_text().splitlines()[0]
    assert first_line == f"# GENERATED by `{command} --out k8s/staging.yaml`"
    with pytest.raises(SystemExit):
        main(["--all", "--root", str(project)])


def test_missing_input_is_reported_not_raised(project: Path, capsys: pytest.CaptureFixture) -> None:
    (project / OVERLAY).unlink()
    assert main(["--check", "--root", str(project)]) == 2
    assert "overlay.yaml" in capsys.readouterr().err
