"""Editing a multi-application Serve config (a router and one application per model): a deployment's
user_config is rewritten in place with the rest of the file, comments included; ``args`` edits go to the
applications that have the field, environment variables to every application."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bench.config_edit import (
    ConfigEditError,
    find_app,
    model_app,
    rewrite_text,
    user_config_of,
    with_args,
    with_env,
    with_user_config,
    write_user_config,
)

ROOT = Path(__file__).resolve().parents[3]

CONFIG = """\
# Top comment survives.
http_options:
  host: 127.0.0.1
  port: 8000

applications:
  - name: textserve
    import_path: deployments.app:build_router
    runtime_env: &env
      env_vars:
        SHARED: "1"
    args:
      models: [m, other]
      default_model: m
    deployments:
      - name: Ingress
        user_config: {max_in_flight: 64}
  - name: other
    import_path: deployments.app:build_model
    runtime_env: *env
    args:
      model: {name: other}
    deployments:
      - name: Inference
        user_config: {max_batch_size: 7}
  - name: m
    import_path: deployments.app:build_model
    runtime_env: *env
    args:
      runtime:
        intra_op_threads: null        # null: default
    deployments:
      - name: Tokenizer
        user_config: {max_batch_size: 99}
      - name: Inference
        ray_actor_options: {num_cpus: 1.0}
        user_config:                  # applied by reconfigure()
          max_batch_size: 32          # sequences per batch
          batch_wait_timeout_s: 0.005 # the wait
"""


def _apps(data: dict) -> dict[str, dict]:
    return {a["name"]: a for a in data["applications"]}


def _deps(app: dict) -> dict[str, dict]:
    return {d["name"]: d for d in app["deployments"]}


def test_rewrite_changes_only_the_default_models_inference_user_config() -> None:
    new = rewrite_text(CONFIG, {"max_batch_size": 16, "max_batch_tokens": 4096})
    apps = _apps(yaml.safe_load(new))
    deps = _deps(apps["m"])  # the router's default model, though another model app comes first
    assert deps["Inference"]["user_config"] == {
        "max_batch_size": 16,
        "batch_wait_timeout_s": 0.005,
        "max_batch_tokens": 4096,
    }
    assert deps["Tokenizer"]["user_config"] == {"max_batch_size": 99}
    assert _deps(apps["other"])["Inference"]["user_config"] == {"max_batch_size": 7}
    for comment in ("# Top comment survives.", "# null: default", "# applied by reconfigure()", "# the wait"):
        assert comment in new
    assert "intra_op_threads: null" in new  # null stays spelled out
    assert "runtime_env: *env" in new  # anchors survive
    changed = [(a, b) for a, b in zip(CONFIG.splitlines(), new.splitlines(), strict=False) if a != b]
    assert len(changed) == 1 and "max_batch_size: 16" in changed[0][1]


def test_rewrite_with_same_values_is_identity() -> None:
    assert rewrite_text(CONFIG, {"max_batch_size": 32, "batch_wait_timeout_s": 0.005}) == CONFIG


def test_a_named_application_or_a_router_deployment_is_found() -> None:
    data = yaml.safe_load(CONFIG)
    assert user_config_of(data, app_name="other") == {"max_batch_size": 7}
    assert user_config_of(data, "Ingress") == {"max_in_flight": 64}  # only the router lists it
    new = yaml.safe_load(rewrite_text(CONFIG, {"max_in_flight": 8}, deployment="Ingress"))
    assert _deps(_apps(new)["textserve"])["Ingress"]["user_config"] == {"max_in_flight": 8}
    assert find_app(data, None)["name"] == "m" and model_app(data)["name"] == "m"
    without_router = {"applications": [a for a in data["applications"] if a["name"] != "textserve"]}
    assert model_app(without_router)["name"] == "other"  # no router: the first model application


def test_unknown_deployment_or_app_is_an_error() -> None:
    with pytest.raises(ConfigEditError, match="Serializer"):
        rewrite_text(CONFIG, {"x": 1}, deployment="Serializer")
    with pytest.raises(ConfigEditError, match="nope"):
        rewrite_text(CONFIG, {"x": 1}, app_name="nope")
    with pytest.raises(ConfigEditError, match="Tokenizer"):
        rewrite_text(CONFIG, {"x": 1}, deployment="Tokenizer", app_name="other")
    with pytest.raises(ConfigEditError, match="build_model"):
        model_app({"applications": [{"name": "a", "import_path": "deployments.app:build_app"}]})


def test_with_user_config_does_not_mutate() -> None:
    base = yaml.safe_load(CONFIG)
    new = with_user_config(base, {"max_batch_size": 8})
    assert user_config_of(new)["max_batch_size"] == 8
    assert user_config_of(base)["max_batch_size"] == 32


def test_write_user_config_in_place(tmp_path: Path) -> None:
    path = tmp_path / "serve_config.yaml"
    path.write_text(CONFIG)
    write_user_config(path, {"batch_wait_timeout_s": 0.01})
    assert user_config_of(yaml.safe_load(path.read_text()))["batch_wait_timeout_s"] == 0.01
    assert "# Top comment survives." in path.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["serve_config.yaml"]  # no temp file left behind


def test_args_edits_go_to_the_applications_that_have_the_field() -> None:
    base = yaml.safe_load(CONFIG)
    cfg = with_args(
        base,
        {
            "runtime.parallel_passes": 1,  # model applications only: every one of them
            "model.precision": "fp32",
            "limits.max_body_bytes": 2048,  # the router only
            "observability.access_log": False,  # both kinds: every application
        },
    )
    apps = _apps(cfg)
    assert apps["m"]["args"] == {
        "runtime": {"intra_op_threads": None, "parallel_passes": 1},
        "model": {"precision": "fp32"},
        "observability": {"access_log": False},
    }
    assert apps["other"]["args"] == {
        "model": {"name": "other", "precision": "fp32"},
        "runtime": {"parallel_passes": 1},
        "observability": {"access_log": False},
    }
    assert apps["textserve"]["args"] == {
        "models": ["m", "other"],
        "default_model": "m",
        "limits": {"max_body_bytes": 2048},
        "observability": {"access_log": False},
    }
    assert base == yaml.safe_load(CONFIG)  # not modified
    with pytest.raises(ConfigEditError, match="threads"):
        with_args(base, {"threads": 2})  # a field of neither kind of application
    with pytest.raises(ConfigEditError, match="build_router"):
        with_args(
            {"applications": [a for a in base["applications"] if a["name"] != "textserve"]}, {"limits.x": 1}
        )


def test_args_edits_of_the_shipped_config_validate() -> None:
    from deployments.config import ModelAppArgs, RouterArgs

    base = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    cfg = with_args(base, {"runtime.torch_graph": "eager", "limits.max_inputs_per_request": 8})
    assert ModelAppArgs.model_validate(model_app(cfg)["args"]).runtime.torch_graph == "eager"
    router = next(a for a in cfg["applications"] if a["import_path"] == "deployments.app:build_router")
    assert RouterArgs.model_validate(router["args"]).limits.max_inputs_per_request == 8


def test_env_edits_go_to_the_controller_and_every_application() -> None:
    base = yaml.safe_load(CONFIG)  # the three applications share one runtime_env (a YAML anchor)
    cfg = with_env(base, {"SHARED": "0", "EXTRA": "x"})
    assert cfg["controller_options"] == {"runtime_env": {"env_vars": {"SHARED": "0", "EXTRA": "x"}}}
    for app in cfg["applications"]:
        assert app["runtime_env"]["env_vars"] == {"SHARED": "0", "EXTRA": "x"}
    assert base["applications"][0]["runtime_env"]["env_vars"] == {"SHARED": "1"}  # not modified
    assert with_env(base, {}) == base
