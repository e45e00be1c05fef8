"""The preflight command refuses what the service would refuse, naming the field, across the router and
every model application; ``--defaults`` prints what is in force (the config's choices over the code's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from deployments.tools.check import MODEL_APP, ROUTER, main
from deployments.user_config import BatchingConfig

ROOT = Path(__file__).resolve().parents[4]
MODEL = "all-MiniLM-L6-v2"


def _app(config: dict[str, Any], import_path: str) -> dict[str, Any]:
    return next(a for a in config["applications"] if a["import_path"] == import_path)


def _write(tmp_path: Path, config: dict[str, Any]) -> Path:
    path = tmp_path / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _config_with_repository(tmp_path: Path, repository: Path, **user_config: object) -> dict[str, Any]:
    """The shipped multi-app config (router + one model application) with its model read from
    ``repository``; ``user_config`` goes to the model application's Inference deployment."""
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    assert _app(config, ROUTER)["args"]["models"] == [MODEL]
    app = _app(config, MODEL_APP)
    app["args"]["model"]["repository"] = str(repository)
    app["args"]["model"]["backend"] = "torch"  # the temp repository holds the HF-weights manifest only
    app["args"].setdefault("runtime", {})["verify_checksums"] = False  # keep the unit test fast
    if user_config:
        next(d for d in app["deployments"] if d["name"] == "Inference")["user_config"] = user_config
    return config


def _copy_default_manifest(repo: Path, **changes: object) -> None:
    manifest = json.loads((ROOT / f"models/{MODEL}/1/manifest.json").read_text())
    manifest.update(changes)
    target = repo / MODEL / "1"
    target.mkdir(parents=True)
    (target / "manifest.json").write_text(json.dumps(manifest))


def test_shipped_config_passes(capsys):
    assert main([str(ROOT / "serve_config.yaml")]) == 0
    out = capsys.readouterr().out
    assert f"textserve: routes ['{MODEL}'], default {MODEL}" in out
    assert f"{MODEL} v1 stable (embed, dimension 384" in out
    assert "max 256 tokens, torch bf16 trace)" in out  # how the model will run, as configured


def test_a_temp_repository_passes(tmp_path, capsys):
    """The fixture the failing cases below change one thing in passes as it is."""
    _copy_default_manifest(tmp_path / "repo")
    assert main([str(_write(tmp_path, _config_with_repository(tmp_path, tmp_path / "repo")))]) == 0
    assert f"{MODEL} v1 stable" in capsys.readouterr().out


def test_bad_manifest_fails_naming_the_field(tmp_path, capsys):
    _copy_default_manifest(tmp_path / "repo", pooling="cls")
    assert main([str(_write(tmp_path, _config_with_repository(tmp_path, tmp_path / "repo")))]) == 1
    assert "manifest field 'pooling'" in capsys.readouterr().err


def test_missing_manifest_fails(tmp_path, capsys):
    assert main([str(_write(tmp_path, _config_with_repository(tmp_path, tmp_path / "empty")))]) == 1
    assert "manifest field 'manifest.json': file is missing" in capsys.readouterr().err


def test_bad_user_config_fails(tmp_path, capsys):
    _copy_default_manifest(tmp_path / "repo")
    config = _config_with_repository(tmp_path, tmp_path / "repo", max_batch_size=0, batch_wait_timeout_s=0.01)
    assert main([str(_write(tmp_path, config))]) == 1
    assert "max_batch_size" in capsys.readouterr().err


def test_a_candidate_version_is_checked_too(tmp_path, capsys):
    _copy_default_manifest(tmp_path / "repo")
    config = _config_with_repository(tmp_path, tmp_path / "repo")
    _app(config, MODEL_APP)["args"]["candidate"] = {"version": "2"}  # no such version in the repository
    assert main([str(_write(tmp_path, config))]) == 1
    assert f"{MODEL}/2" in capsys.readouterr().err


def test_a_router_naming_a_model_no_application_serves_fails(tmp_path, capsys):
    _copy_default_manifest(tmp_path / "repo")
    config = _config_with_repository(tmp_path, tmp_path / "repo")
    _app(config, ROUTER)["args"]["models"] = [MODEL, "no-such-model"]
    assert main([str(_write(tmp_path, config))]) == 1
    err = capsys.readouterr().err
    assert "no-such-model" in err and "no application serves" in err


def test_defaults_print_the_code_defaults_with_the_config_choices_applied(capsys):
    assert main(["--defaults", str(ROOT / "serve_config.yaml")]) == 0
    settings = yaml.safe_load(capsys.readouterr().out)
    router, model = settings["textserve"], settings[MODEL]
    assert router["args"]["models"] == [MODEL] and router["args"]["default_model"] == MODEL
    assert router["args"]["limits"]["max_inputs_per_request"] == 256  # from code, not written in the YAML
    assert router["Ingress"]["num_replicas"] == 1  # written in the YAML
    assert router["Ingress.user_config"]["fallback_cache_mb"] == 64.0  # from code
    assert model["args"]["model"]["precision"] == "bf16"  # the config's choice over the code's fp32
    assert model["args"]["runtime"]["torch_graph"] == "trace"  # from code
    assert model["args"]["runtime"]["intra_op_threads"] == 1
    assert model["Inference"]["autoscaling_config"]["target_ongoing_requests"] == 1  # written in the YAML
    assert model["Inference"]["max_ongoing_requests"] == 128  # the deployment decorator's
    assert model["Inference.user_config"]["micro_batch_tokens"] == 256 == BatchingConfig().micro_batch_tokens
    assert model["Model.user_config"]["candidate_share"] == 0.0


def test_defaults_list_the_deployments_the_config_leaves_out(tmp_path, capsys):
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    model = next(a for a in config["applications"] if a["import_path"] == MODEL_APP)
    model["deployments"] = [d for d in model["deployments"] if d["name"] != "Serializer"]
    model["args"]["candidate"] = {"version": "2"}
    path = tmp_path / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["--defaults", str(path)]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)[model["name"]]
    assert shown["Serializer"]["max_ongoing_requests"] == 64  # the decorator's, nothing written
    assert shown["Model.user_config"]["float_decimals"] == 6
    assert {"CandidateTokenizer", "CandidateInference", "CandidateInference.user_config"} <= set(shown)


def test_defaults_of_an_invalid_config_is_an_error_not_a_traceback(tmp_path, capsys):
    path = tmp_path / "serve_config.yaml"
    path.write_text(yaml.safe_dump({"applications": [{"name": "x", "import_path": ROUTER, "args": {}}]}))
    assert main(["--defaults", str(path)]) == 1
    assert "invalid config" in capsys.readouterr().err


def test_the_generate_example_passes_and_shows_its_generator(capsys):
    """examples/generate.yaml (demo models built by .ci/setup): the causal LM is checked like every model,
    and --defaults shows its one deployment with the generator's own options and the engine's bounds."""
    example = str(ROOT / "examples" / "generate.yaml")
    assert main([example]) == 0
    assert "demo-gpt2-lm: demo-gpt2-lm v1 stable (generate, chat template, max 512 tokens, torch fp32)" in (
        capsys.readouterr().out
    )
    assert main(["--defaults", example]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)["demo-gpt2-lm"]
    assert [k for k in shown if k != "args"] == ["Model"]  # no tokenizer, inference or serializer stages
    assert shown["Model"]["max_ongoing_requests"] == 512  # GeneratorDeployment's, not the encoder pipeline's
    assert shown["Model"]["ray_actor_options"] == {"num_cpus": 0.5}  # written in the example
    assert shown["args"]["generation"]["max_running"] == 16  # the example's choice
    assert shown["args"]["generation"]["prefill_chunk_tokens"] == 256


def test_the_tenants_file_is_read_as_the_ingress_will_and_a_missing_one_fails(tmp_path, capsys, tenants):
    _copy_default_manifest(tmp_path / "repo")
    config = _config_with_repository(tmp_path, tmp_path / "repo")
    _app(config, ROUTER)["args"]["auth"] = {"keys_file": str(tenants.path)}
    assert main([str(_write(tmp_path, config))]) == 0
    assert "API keys on: 2 tenants, 2 keys" in capsys.readouterr().out
    _app(config, ROUTER)["args"]["auth"] = {"keys_file": str(tmp_path / "absent.yaml")}
    assert main([str(_write(tmp_path, config))]) == 1
    assert "absent.yaml" in capsys.readouterr().err
