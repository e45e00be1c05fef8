"""Rewriting the Inference user_config keeps the rest of the file, comments included."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bench.config_edit import (
    ConfigEditError,
    rewrite_text,
    user_config_of,
    with_user_config,
    write_user_config,
)

CONFIG = """\
# Top comment survives.
http_options:
  host: 127.0.0.1
  port: 8000

applications:
  - name: textserve
    import_path: deployments.app:build_app
    args:
      runtime:
        threads: null                 # null: default
    deployments:
      - name: Tokenizer
        user_config: {max_batch_size: 99}
      - name: Inference
        ray_actor_options: {num_cpus: 1.0}
        user_config:                  # applied by reconfigure()
          max_batch_size: 32          # sequences per batch
          batch_wait_timeout_s: 0.005 # the wait
"""


def test_rewrite_changes_only_the_inference_user_config() -> None:
    new = rewrite_text(CONFIG, {"max_batch_size": 16, "max_batch_tokens": 4096})
    data = yaml.safe_load(new)
    deps = {d["name"]: d for d in data["applications"][0]["deployments"]}
    assert deps["Inference"]["user_config"] == {
        "max_batch_size": 16,
        "batch_wait_timeout_s": 0.005,
        "max_batch_tokens": 4096,
    }
    assert deps["Tokenizer"]["user_config"] == {"max_batch_size": 99}
    for comment in ("# Top comment survives.", "# null: default", "# applied by reconfigure()", "# the wait"):
        assert comment in new
    assert "threads: null" in new  # null stays spelled out
    changed = [(a, b) for a, b in zip(CONFIG.splitlines(), new.splitlines(), strict=False) if a != b]
    assert len(changed) == 1 and "max_batch_size: 16" in changed[0][1]


def test_rewrite_with_same_values_is_identity() -> None:
    assert rewrite_text(CONFIG, {"max_batch_size": 32, "batch_wait_timeout_s": 0.005}) == CONFIG


def test_unknown_deployment_or_app_is_an_error() -> None:
    with pytest.raises(ConfigEditError, match="Serializer"):
        rewrite_text(CONFIG, {"x": 1}, deployment="Serializer")
    with pytest.raises(ConfigEditError, match="nope"):
        rewrite_text(CONFIG, {"x": 1}, app_name="nope")


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
