"""serve_config.yaml and examples/multi-model.yaml against Ray Serve's schema and the typed config
(Ray is not started)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from ray.serve.schema import ServeDeploySchema

from deployments.config import (
    PROJECT_ROOT,
    LimitsConfig,
    ModelAppArgs,
    ModelConfig,
    RouterArgs,
    RuntimeConfig,
    resolve_path,
)
from deployments.repository.resolve import resolve_model
from deployments.tools.check import GENERATOR, IDENTITY, decorator_options
from deployments.user_config import BatchingConfig, IngressConfig, PipelineConfig

CONFIGS = [PROJECT_ROOT / "serve_config.yaml", PROJECT_ROOT / "examples" / "multi-model.yaml"]
ROUTER = "deployments.app:build_router"
MODEL_APP = "deployments.app:build_model"
MODEL_DEPLOYMENTS = {"Model", "Tokenizer", "Inference", "Serializer"}
DEPLOYMENT_NAMES = {"Ingress", *MODEL_DEPLOYMENTS}
USER_CONFIG_MODELS = {
    "Inference": BatchingConfig,
    "Ingress": IngressConfig,
    "Model": PipelineConfig,
}
ARGS_MODELS = {ROUTER: RouterArgs, MODEL_APP: ModelAppArgs}


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda p: p.name)
def raw(request) -> dict[str, Any]:
    return yaml.safe_load(request.param.read_text(encoding="utf-8"))


def _router(raw: dict[str, Any]) -> dict[str, Any]:
    (router,) = [a for a in raw["applications"] if a["import_path"] == ROUTER]
    return router


def _model_apps(raw: dict[str, Any]) -> list[dict[str, Any]]:
    return [a for a in raw["applications"] if a["import_path"] == MODEL_APP]


# --- the shipped configs ----------------------------------------------------------------------------


def test_config_validates_with_ray_schema(raw):
    schema = ServeDeploySchema.model_validate(raw)
    by_path = {a.import_path for a in schema.applications}
    assert by_path == {ROUTER, MODEL_APP}
    router = next(a for a in schema.applications if a.import_path == ROUTER)
    assert router.route_prefix == "/"
    assert {d.name for d in router.deployments} == {"Ingress"}
    for app in schema.applications:
        if app.import_path == MODEL_APP:
            assert app.route_prefix is None  # reached through the router only
            assert {d.name for d in app.deployments} == MODEL_DEPLOYMENTS


def test_router_routes_to_exactly_the_model_apps(raw):
    router = RouterArgs.model_validate(_router(raw)["args"])
    apps = _model_apps(raw)
    assert router.models == [a["name"] for a in apps]
    for app in apps:  # each model application is named after the model it serves
        assert ModelAppArgs.model_validate(app["args"]).model.name == app["name"]
    assert router.default == "all-MiniLM-L6-v2"


THROUGHPUT_MODE = {"RAY_SERVE_THROUGHPUT_OPTIMIZED", "RAY_SERVE_ENABLE_HA_PROXY", "RAY_SERVE_LOG_TO_STDERR"}


def test_high_throughput_mode_is_on_for_controller_and_every_application(raw):
    # The controller starts HAProxy and sends HTTP to the ingress replica directly; the replicas must run the
    # same mode (direct ingress, gRPC between them) or the two sides disagree about how requests arrive.
    controller = raw["controller_options"]["runtime_env"]["env_vars"]
    assert {k: controller.get(k) for k in THROUGHPUT_MODE} == {k: "1" for k in THROUGHPUT_MODE}
    for app in raw["applications"]:
        replicas = app["runtime_env"]["env_vars"]
        assert {k: replicas.get(k) for k in THROUGHPUT_MODE} == {k: "1" for k in THROUGHPUT_MODE}, app["name"]


def test_replica_env_is_written_once(raw):
    """The variables are written once (YAML anchors): every application gets the very same mapping."""
    envs = [app["runtime_env"]["env_vars"] for app in raw["applications"]]
    assert all(env == envs[0] for env in envs)
    controller = raw["controller_options"]["runtime_env"]["env_vars"]
    assert controller.items() <= envs[0].items()


def test_import_paths_point_at_builders(raw):
    for app in raw["applications"]:
        module, _, attr = app["import_path"].partition(":")
        source = (PROJECT_ROOT / Path(*module.split("."))).with_suffix(".py")
        tree = ast.parse(source.read_text(encoding="utf-8"))
        assert attr in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}


def test_model_apps_name_models_that_resolve(raw):
    for app in _model_apps(raw):
        args = ModelAppArgs.model_validate(app["args"])
        for config in args.served_models():
            model = resolve_model(config, hash_files=False)
            m = model.manifest
            assert (m.name, m.version, m.task) == (config.name, config.version, config.task)


def _field(where: str, key: str) -> str:
    return f"{where}.{key}".split(".args.", 1)[-1]


def _restated(written: dict[str, Any], defaults: dict[str, Any], where: str) -> list[str]:
    out = []
    for key, value in written.items():
        if isinstance(value, dict) and isinstance(defaults.get(key), dict):
            out += _restated(value, defaults[key], f"{where}.{key}")
        elif (
            key in defaults
            and defaults[key] == value
            and f"{where}.{key}".split(".args.", 1)[-1] not in IDENTITY
        ):
            out.append(f"{where}.{key}: {value!r}")
    return out


def test_configs_restate_no_default(raw):
    """One source of truth: a value written in the config is a choice that differs from the code's
    default (deployments/config.py, deployments/user_config.py, the deployment decorators); a restated
    default is a second copy."""
    restated: list[str] = []
    for app in raw["applications"]:
        kind = ARGS_MODELS[app["import_path"]]
        restated += _restated(
            app.get("args") or {},
            kind().model_dump() if kind is ModelAppArgs else RouterArgs(models=["x"]).model_dump(),
            f"{app['name']}.args",
        )
        for d in app["deployments"]:
            config = USER_CONFIG_MODELS.get(d["name"])
            if config is not None and "user_config" in d:
                restated += _restated(d["user_config"], config().model_dump(), f"{d['name']}.user_config")
            options = DECORATOR_OPTIONS[d["name"]]
            restated += _restated({k: v for k, v in d.items() if k != "name"}, options, d["name"])
    assert not restated, restated


DECORATOR_OPTIONS = decorator_options()


def test_deployment_names_match_code():
    """Each yaml name is a ``@serve.deployment(name=...)`` in deployments/ (read with ast: no torch)."""
    assert set(DECORATOR_OPTIONS) == DEPLOYMENT_NAMES | {GENERATOR}  # a generate model's Model


def test_user_configs_validate_as_written(raw):
    for app in raw["applications"]:
        for d in app["deployments"]:
            model = USER_CONFIG_MODELS.get(d["name"])
            if "user_config" in d:
                assert model is not None, f"{d['name']} has no reconfigure()"
                parsed = model.model_validate(d["user_config"])
                assert parsed.model_dump(include=set(d["user_config"])) == d["user_config"]


def test_total_cpus_fit_two_cores(raw):
    total = 0.0
    for app in raw["applications"]:
        for d in app["deployments"]:
            options = {**DECORATOR_OPTIONS[d["name"]]["ray_actor_options"], **d.get("ray_actor_options", {})}
            assert options["num_cpus"] > 0
            total += options["num_cpus"] * d.get("num_replicas", 1)
    assert total <= 2.0


def test_no_gpu_required(raw):
    for app in raw["applications"]:
        assert all(d.get("ray_actor_options", {}).get("num_gpus", 0) == 0 for d in app["deployments"])


def test_shipped_batching_defaults_are_consistent():
    batching = BatchingConfig()
    assert batching.micro_batch_size <= batching.max_batch_size
    assert batching.min_wait_s <= batching.batch_wait_timeout_s <= batching.max_wait_s


def test_router_args_reject_a_default_it_does_not_serve():
    with pytest.raises(ValidationError, match="default_model"):
        RouterArgs(models=["a"], default_model="b")
    with pytest.raises(ValidationError, match="twice"):
        RouterArgs(models=["a", "a"])
    with pytest.raises(ValidationError):
        RouterArgs(models=[])
    assert RouterArgs(models=["a", "b"]).default == "a"


# --- config objects -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "attr", "value"),
    [
        (ModelAppArgs(), "model", ModelConfig()),
        (ModelConfig(), "name", "other"),
        (LimitsConfig(), "max_inputs_per_request", 1),
        (RuntimeConfig(), "verify_checksums", False),
        (BatchingConfig(), "max_batch_size", 8),
        (PipelineConfig(), "float_decimals", 2),
    ],
)
def test_configs_are_frozen(obj, attr, value):
    before = getattr(obj, attr)
    with pytest.raises(ValidationError, match="frozen"):
        setattr(obj, attr, value)
    assert getattr(obj, attr) == before


def test_nested_config_is_frozen():
    args = ModelAppArgs()
    with pytest.raises(ValidationError):
        args.model.name = "other"  # type: ignore[misc]
    assert args.model.name == "all-MiniLM-L6-v2"


@pytest.mark.parametrize(
    ("cls", "data", "where"),
    [
        (ModelAppArgs, {"modle": {}}, "modle"),
        (ModelAppArgs, {"model": {"nmae": "x"}}, "nmae"),
        (RouterArgs, {"models": ["a"], "limits": {"max_inputs": 3}}, "max_inputs"),
        (ModelAppArgs, {"runtime": {"threads": 2}}, "threads"),
        (BatchingConfig, {"max_batch_size": 8, "batch_timeout": 0.1}, "batch_timeout"),
        (PipelineConfig, {"decimals": 3}, "decimals"),
    ],
)
def test_configs_reject_unknown_keys(cls, data, where):
    with pytest.raises(ValidationError, match="Extra inputs are not permitted") as info:
        cls.model_validate(data)
    assert where in str(info.value)


@pytest.mark.parametrize(
    "data",
    [
        {"max_batch_size": 1},
        {"max_batch_size": 4096},
        {"batch_wait_timeout_s": 0.0},
        {"batch_wait_timeout_s": 1.0},
        {},
    ],
)
def test_batching_bounds_accept(data):
    cfg = BatchingConfig.model_validate(data)
    for key, value in data.items():
        assert getattr(cfg, key) == value


@pytest.mark.parametrize(
    "data",
    [
        {"max_batch_size": 0},
        {"max_batch_size": -1},
        {"max_batch_size": 4097},
        {"batch_wait_timeout_s": -0.001},
        {"batch_wait_timeout_s": 1.5},
        {"max_batch_size": "lots"},
    ],
)
def test_batching_bounds_reject(data):
    with pytest.raises(ValidationError) as info:
        BatchingConfig.model_validate(data)
    assert next(iter(data)) in str(info.value)


def test_batching_defaults():
    cfg = BatchingConfig()
    assert cfg.micro_batch_size <= cfg.max_batch_size
    assert cfg.micro_batch_tokens <= cfg.max_batch_tokens
    assert cfg.min_wait_s <= cfg.batch_wait_timeout_s <= cfg.max_wait_s


@pytest.mark.parametrize(("value", "ok"), [(None, True), (0, True), (9, True), (-1, False), (10, False)])
def test_pipeline_decimals_bounds(value, ok):
    if ok:
        assert PipelineConfig(float_decimals=value).float_decimals == value
    else:
        with pytest.raises(ValidationError, match="float_decimals"):
            PipelineConfig(float_decimals=value)


@pytest.mark.parametrize(
    "data",
    [
        {"model": {"task": "translate"}},
        {"model": {"task": "generate"}, "candidate": {"version": "2"}},  # one version at a time
        {"model": {"task": "rerank", "backend": "onnx"}},
        {"model": {"device": "tpu"}},
        {"model": {"version": 1}},  # an unquoted YAML version is an int, not a str
        {"runtime": {"intra_op_threads": 0}},
    ],
)
def test_app_args_reject_bad_values(data):
    with pytest.raises(ValidationError):
        ModelAppArgs.model_validate(data)


def test_app_args_defaults_from_empty():
    args = ModelAppArgs.model_validate({})
    assert args == ModelAppArgs()
    assert args.model.repository == "models"


# --- paths ----------------------------------------------------------------------------------------


def test_manifest_path_from_project_root_when_cwd_elsewhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = ModelConfig().manifest_path()
    assert path == PROJECT_ROOT / "models" / "all-MiniLM-L6-v2" / "1" / "manifest.json"
    assert path.is_file()


def test_manifest_path_prefers_existing_relative_dir_in_cwd(tmp_path, monkeypatch):
    (tmp_path / "myrepo").mkdir()
    monkeypatch.chdir(tmp_path)
    path = ModelConfig(repository="myrepo", name="m", version="2").manifest_path()
    assert path == (tmp_path / "myrepo" / "m" / "2" / "manifest.json").resolve()


def test_resolve_path_absolute(tmp_path):
    assert resolve_path(str(tmp_path / "nope")) == (tmp_path / "nope").resolve()
