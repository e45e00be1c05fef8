"""The preflight command refuses what the service would refuse, naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from deployments.tools.check import main

ROOT = Path(__file__).resolve().parents[4]


def _config_with_repository(tmp_path: Path, repository: Path, **user_config: object) -> Path:
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    app = config["applications"][0]
    app["args"]["model"]["repository"] = str(repository)
    app["args"]["model"]["backend"] = "torch"  # the temp repository holds the HF-weights manifest only
    app["args"]["runtime"]["verify_checksums"] = False  # keep the unit test fast
    if user_config:
        next(d for d in app["deployments"] if d["name"] == "Inference")["user_config"] = user_config
    path = tmp_path / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _copy_default_manifest(repo: Path, **changes: object) -> None:
    manifest = json.loads((ROOT / "models/all-MiniLM-L6-v2/1/manifest.json").read_text())
    manifest.update(changes)
    target = repo / "all-MiniLM-L6-v2" / "1"
    target.mkdir(parents=True)
    (target / "manifest.json").write_text(json.dumps(manifest))


def test_shipped_config_passes(capsys):
    assert main([str(ROOT / "serve_config.yaml")]) == 0
    out = capsys.readouterr().out
    assert "all-MiniLM-L6-v2 v1 stable (embed, dimension 384" in out
    assert "max 256 tokens, torch bf16 trace)" in out  # how the model will run, as configured


def test_bad_manifest_fails_naming_the_field(tmp_path, capsys):
    _copy_default_manifest(tmp_path / "repo", pooling="cls")
    assert main([str(_config_with_repository(tmp_path, tmp_path / "repo"))]) == 1
    assert "manifest field 'pooling'" in capsys.readouterr().err


def test_missing_manifest_fails(tmp_path, capsys):
    assert main([str(_config_with_repository(tmp_path, tmp_path / "empty"))]) == 1
    assert "manifest field 'manifest.json': file is missing" in capsys.readouterr().err


def test_bad_user_config_fails(tmp_path, capsys):
    _copy_default_manifest(tmp_path / "repo")
    path = _config_with_repository(tmp_path, tmp_path / "repo", max_batch_size=0, batch_wait_timeout_s=0.01)
    assert main([str(path)]) == 1
    assert "max_batch_size" in capsys.readouterr().err


def test_a_candidate_version_is_checked_too(tmp_path, capsys):
    _copy_default_manifest(tmp_path / "repo")
    path = _config_with_repository(tmp_path, tmp_path / "repo")
    config = yaml.safe_load(path.read_text())
    config["applications"][0]["args"]["candidate"] = {"version": "2"}  # no such version in the repository
    path.write_text(yaml.safe_dump(config))
    assert main([str(path)]) == 1
    assert "all-MiniLM-L6-v2/2" in capsys.readouterr().err
