"""monitoring/prometheus.yml: valid for promtool, scrapes Ray's discovery file on 127.0.0.1."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.support.monitoring import (
    PROMETHEUS_YML,
    RAY_SD_FILE,
    assert_ok,
    promtool,
    write_local_config,
)

# ---------------------------------------------------------------------------------------------------------
# prometheus.yml


@pytest.fixture
def ray_sd_file(tmp_path: Path) -> Path:
    """A service-discovery file as Ray writes it (node IP, several ports), independent of any running Ray."""
    path = tmp_path / "sd" / "prom_metrics_service_discovery.json"
    path.parent.mkdir()
    content = [{"labels": {"job": "ray"}, "targets": ["192.0.2.2:33913", "192.0.2.2:44217"]}]
    path.write_text(json.dumps(content))
    return path


def test_prometheus_config_passes_promtool(tmp_path: Path, ray_sd_file: Path) -> None:
    # A copy pointed at a known sd file: promtool validates the file's content when it exists, and the
    # real /tmp/ray file may be absent or belong to whatever Ray ran last.
    config = write_local_config(tmp_path / "conf", ray_sd_file)
    result = promtool("check", "config", str(config))
    assert_ok(result)
    assert "WARNING" not in result.stdout + result.stderr, result.stdout + result.stderr


def test_prometheus_config_as_shipped_passes_promtool() -> None:
    # The file itself (rule_files resolved beside it); a missing sd file is only a warning for promtool.
    assert_ok(promtool("check", "config", str(PROMETHEUS_YML)))


def test_promtool_rejects_a_broken_config(tmp_path: Path, ray_sd_file: Path) -> None:
    config = write_local_config(tmp_path / "conf", ray_sd_file)
    config.write_text(config.read_text().replace("scrape_interval: 5s", "scrape_interval: 5 seconds"))
    assert promtool("check", "config", str(config)).returncode != 0


def test_prometheus_config_scrapes_rays_discovery_file() -> None:
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    assert config["global"]["scrape_interval"] == "5s"
    assert config["rule_files"] == ["alerts.yml"]
    (job,) = config["scrape_configs"]
    assert [sd["files"] for sd in job["file_sd_configs"]] == [[RAY_SD_FILE]]


def test_relabel_rule_points_targets_at_localhost() -> None:
    (job,) = yaml.safe_load(PROMETHEUS_YML.read_text())["scrape_configs"]
    (rule,) = [r for r in job["relabel_configs"] if r.get("target_label") == "__address__"]
    assert rule["source_labels"] == ["__address__"]
    # Prometheus anchors the regex and joins source labels with ";"; $1 is Go's group syntax.
    regex = re.compile(rule["regex"])
    replacement = re.sub(r"\$\{?(\d+)\}?", r"\\\1", rule["replacement"])
    for address, port in [("192.0.2.2:33913", "33913"), ("10.1.2.3:8080", "8080"), ("localhost:1", "1")]:
        match = regex.fullmatch(address)
        assert match, f"{rule['regex']!r} does not match {address}"
        assert match.expand(replacement) == f"127.0.0.1:{port}"
