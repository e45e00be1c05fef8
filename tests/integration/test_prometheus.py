"""A real Prometheus, configured from monitoring/prometheus.yml, scrapes the running service and loads the
alert rules. Everything stays on 127.0.0.1; Prometheus is stopped in the fixture's teardown."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from bench.procs import free_port
from tests.integration.test_metrics import SD_FILE_NAME, ray_sd_content, ray_sd_file
from tests.support.monitoring import alert_rules, write_local_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

APP = "textserve"
SCRAPE_INTERVAL = "2s"
START_TIMEOUT_S = 30.0
POLL_TIMEOUT_S = 60.0
T = TypeVar("T")


class Prometheus:
    """A prometheus process on 127.0.0.1 and its HTTP API."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc = proc
        self.url = url
        self.log = log
        self.client = httpx.Client(base_url=url, timeout=10.0, trust_env=False)

    def api(self, path: str, **params: str) -> Any:
        resp = self.client.get(f"/api/v1/{path}", params=params)
        resp.raise_for_status()
        body = resp.json()
        assert body["status"] == "success", body
        return body["data"]

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"prometheus exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if self.client.get("/-/ready").status_code == 200:
                    return
            except httpx.TransportError:
                pass  # not listening yet
            time.sleep(0.5)
        pytest.fail(f"prometheus not ready within {START_TIMEOUT_S:g} s:\n{self.log_tail()}")

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)


def poll(check: Callable[[], T | None], timeout_s: float = POLL_TIMEOUT_S, every_s: float = 1.0) -> T | None:
    """check() until it returns something truthy; its last result (None/falsy after the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result or time.monotonic() >= deadline:
            return result
        time.sleep(every_s)


@pytest.fixture(scope="module")
def prometheus(serve_harness: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    exe = shutil.which("prometheus")
    if exe is None:
        pytest.fail(
            "the prometheus binary is not on PATH: install the Debian/Ubuntu package `prometheus` "
            "(apt-get install prometheus) or put a release binary from prometheus.io on PATH"
        )
    tmp = tmp_path_factory.mktemp("prometheus")
    sd_file = ray_sd_file()
    if not sd_file.exists():
        # Ray started without its dashboard writes no discovery file: write the same content (see
        # test_metrics.ray_sd_content), in Ray's format with the node's address, for the relabel rule to fix.
        sd_file = tmp / SD_FILE_NAME
        sd_file.write_text(json.dumps(ray_sd_content()))
    config = write_local_config(tmp / "config", sd_file, scrape_interval=SCRAPE_INTERVAL)
    port = free_port()
    log = tmp / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                exe,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Prometheus(proc, f"http://127.0.0.1:{port}", log)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def test_prometheus_scrapes_the_service(prometheus: Prometheus, http: httpx.Client) -> None:
    for i in range(10):
        assert http.post("/v1/embeddings", json={"input": [f"prometheus probe {i}"]}).status_code == 200

    def textserve_series() -> list[dict[str, Any]]:
        result = prometheus.api("query", query="ray_requests_total")["result"]
        return [r for r in result if r["metric"].get("application") == APP]

    series = poll(textserve_series)
    if not series:
        targets = prometheus.api("targets")["activeTargets"]
        summary = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in targets]
        pytest.fail(
            f"no ray_requests_total{{application={APP!r}}} within {POLL_TIMEOUT_S:g} s; targets: {summary}\n"
            f"{prometheus.log_tail()}"
        )
    assert sum(float(r["value"][1]) for r in series) >= 10


def test_targets_are_relabelled_to_localhost(prometheus: Prometheus) -> None:
    def scraped() -> list[dict[str, Any]]:
        targets = prometheus.api("targets")["activeTargets"]
        return targets if any(t["health"] == "up" for t in targets) else []

    targets = poll(scraped, timeout_s=30.0)
    assert targets, f"no target up: {prometheus.api('targets')['activeTargets']}"
    for target in targets:
        assert target["labels"]["instance"].startswith("127.0.0.1:"), target
        assert target["labels"]["job"] == "ray", target


def test_alert_rules_are_loaded(prometheus: Prometheus) -> None:
    expected = {rule["alert"] for rule in alert_rules() if "alert" in rule}

    def evaluated() -> list[dict[str, Any]]:
        rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
        # "unknown" until the first evaluation, every SCRAPE_INTERVAL here.
        return rules if rules and all(r["health"] != "unknown" for r in rules) else []

    rules = poll(evaluated, timeout_s=30.0)
    assert rules, f"rules never evaluated: {prometheus.api('rules')}"
    loaded = {r["name"] for r in rules if r["type"] == "alerting"}
    assert loaded >= expected, f"missing alert rules: {expected - loaded}"
    errors = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
    assert not errors, f"rules failing to evaluate: {errors}"
