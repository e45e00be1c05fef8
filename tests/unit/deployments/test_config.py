"""serve_config.yaml against Ray Serve's schema and the app's own typed config (Ray is not started)."""

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
    AppArgs,
    BatchingConfig,
    IngressConfig,
    LimitsConfig,
    ModelConfig,
    RuntimeConfig,
    SerializerConfig,
    resolve_path,
)
from deployments.repository.resolve import resolve_model

SERVE_CONFIG = PROJECT_ROOT / "serve_config.yaml"
DEPLOYMENT_NAMES = {"Ingress", "Tokenizer", "Inference", "Serializer"}
USER_CONFIG_MODELS = {"Inference": BatchingConfig, "Serializer": SerializerConfig, "Ingress": IngressConfig}


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    return yaml.safe_load(SERVE_CONFIG.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def app(raw) -> dict[str, Any]:
    (application,) = raw["applications"]
    return application


@pytest.fixture(scope="module")
def deployments_by_name(app) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in app["deployments"]}


# --- serve_config.yaml ----------------------------------------------------------------------------


def test_serve_config_validates_with_ray_schema(raw):
    schema = ServeDeploySchema.model_validate(raw)
    assert len(schema.applications) == 1
    application = schema.applications[0]
    assert application.import_path == "deployments.app:build_app"
    assert application.route_prefix == "/"
    assert {d.name for d in application.deployments} == DEPLOYMENT_NAMES


THROUGHPUT_MODE = {"RAY_SERVE_THROUGHPUT_OPTIMIZED", "RAY_SERVE_ENABLE_HA_PROXY", "RAY_SERVE_LOG_TO_STDERR"}


def test_high_throughput_mode_is_on_for_controller_and_replicas_alike(raw, app):
    # The controller starts HAProxy and sends HTTP to the ingress replica directly; the replicas must run the
    # same mode (direct ingress, gRPC between them) or the two sides disagree about how requests arrive.
    controller = raw["controller_options"]["runtime_env"]["env_vars"]
    replicas = app["runtime_env"]["env_vars"]
    assert {k: controller.get(k) for k in THROUGHPUT_MODE} == {k: "1" for k in THROUGHPUT_MODE}
    assert {k: replicas.get(k) for k in THROUGHPUT_MODE} == {k: "1" for k in THROUGHPUT_MODE}
    schema = ServeDeploySchema.model_validate(raw)
    assert schema.controller_options is not None
    assert schema.controller_options.runtime_env == {"env_vars": controller}


def test_import_path_points_at_build_app(app):
    module, _, attr = app["import_path"].partition(":")
    source = (PROJECT_ROOT / Path(*module.split("."))).with_suffix(".py")
    tree = ast.parse(source.read_text(encoding="utf-8"))
    assert attr in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}


def test_app_args_validate(app):
    args = AppArgs.model_validate(app["args"])
    assert args.model.name == "all-MiniLM-L6-v2"
    assert args.model.version == "1"
    assert args.model.task == "embed"
    assert args.model.device == "auto"
    assert args.limits.max_inputs_per_request == 256
    assert args.limits.max_body_bytes == 2 * 1024 * 1024
    assert (args.model.backend, args.model.precision, args.runtime.torch_graph) == ("torch", "bf16", "trace")
    assert args.runtime.verify_checksums is True
    # Every key written in the yaml is one the typed config keeps (nothing silently ignored).
    assert args.model_dump(include=set(app["args"])) == {
        k: {**args.model_dump()[k], **v} if isinstance(v, dict) else v for k, v in app["args"].items()
    }


def test_app_args_name_a_model_that_resolves(app):
    args = AppArgs.model_validate(app["args"])
    model = resolve_model(args.model, hash_files=False)
    assert (model.manifest.name, model.manifest.version, model.manifest.task) == (
        args.model.name,
        args.model.version,
        args.model.task,
    )


def test_deployment_names_exact(app):
    names = [d["name"] for d in app["deployments"]]
    assert len(names) == len(set(names))
    assert set(names) == DEPLOYMENT_NAMES


def test_deployment_names_match_code():
    """Each yaml name is a ``@serve.deployment(name=...)`` in deployments/ (read with ast: no torch)."""
    found = set()
    for source in (PROJECT_ROOT / "deployments").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "serve.deployment":
                for kw in node.keywords:
                    if kw.arg == "name" and isinstance(kw.value, ast.Constant):
                        found.add(kw.value.value)
    assert found == DEPLOYMENT_NAMES


@pytest.mark.parametrize("name", sorted(DEPLOYMENT_NAMES))
def test_user_config_validates(deployments_by_name, name):
    deployment = deployments_by_name[name]
    if name in USER_CONFIG_MODELS:
        assert "user_config" in deployment, f"{name} needs a user_config block"
        USER_CONFIG_MODELS[name].model_validate(deployment["user_config"])
    else:
        assert "user_config" not in deployment, f"{name} has no reconfigure()"


def test_user_config_values(deployments_by_name):
    for name, model in USER_CONFIG_MODELS.items():
        written = deployments_by_name[name]["user_config"]
        parsed = model.model_validate(written)
        assert parsed.model_dump(include=set(written)) == written  # every key honoured as written
    batching = BatchingConfig.model_validate(deployments_by_name["Inference"]["user_config"])
    assert batching.micro_batch_size <= batching.max_batch_size
    assert batching.min_wait_s <= batching.batch_wait_timeout_s <= batching.max_wait_s


def test_total_cpus_fit_two_cores(app):
    total = 0.0
    for d in app["deployments"]:
        cpus = d["ray_actor_options"]["num_cpus"]
        assert cpus > 0
        total += cpus * d.get("num_replicas", 1)
    assert total <= 2.0


def test_no_gpu_required(app):
    assert all(d["ray_actor_options"].get("num_gpus", 0) == 0 for d in app["deployments"])


# --- config objects -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "attr", "value"),
    [
        (AppArgs(), "model", ModelConfig()),
        (ModelConfig(), "name", "other"),
        (LimitsConfig(), "max_inputs_per_request", 1),
        (RuntimeConfig(), "verify_checksums", False),
        (BatchingConfig(), "max_batch_size", 8),
        (SerializerConfig(), "float_decimals", 2),
    ],
)
def test_configs_are_frozen(obj, attr, value):
    before = getattr(obj, attr)
    with pytest.raises(ValidationError, match="frozen"):
        setattr(obj, attr, value)
    assert getattr(obj, attr) == before


def test_nested_config_is_frozen():
    args = AppArgs()
    with pytest.raises(ValidationError):
        args.model.name = "other"  # type: ignore[misc]
    assert args.model.name == "all-MiniLM-L6-v2"


@pytest.mark.parametrize(
    ("cls", "data", "where"),
    [
        (AppArgs, {"modle": {}}, "modle"),
        (AppArgs, {"model": {"nmae": "x"}}, "nmae"),
        (AppArgs, {"limits": {"max_inputs": 3}}, "max_inputs"),
        (AppArgs, {"runtime": {"threads": 2}}, "threads"),
        (BatchingConfig, {"max_batch_size": 8, "batch_timeout": 0.1}, "batch_timeout"),
        (SerializerConfig, {"decimals": 3}, "decimals"),
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
def test_serializer_decimals_bounds(value, ok):
    if ok:
        assert SerializerConfig(float_decimals=value).float_decimals == value
    else:
        with pytest.raises(ValidationError, match="float_decimals"):
            SerializerConfig(float_decimals=value)


@pytest.mark.parametrize(
    "data",
    [
        {"model": {"task": "rerank"}},
        {"model": {"device": "tpu"}},
        {"model": {"version": 1}},  # an unquoted YAML version is an int, not a str
        {"limits": {"max_inputs_per_request": 0}},
        {"limits": {"max_body_bytes": 1023}},
        {"runtime": {"intra_op_threads": 0}},
    ],
)
def test_app_args_reject_bad_values(data):
    with pytest.raises(ValidationError):
        AppArgs.model_validate(data)


def test_app_args_defaults_from_empty():
    args = AppArgs.model_validate({})
    assert args == AppArgs()
    assert args.model.repository == "models"
    assert args.limits.max_inputs_per_request == 256


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
