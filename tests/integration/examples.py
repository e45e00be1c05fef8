"""Run an example config as a user runs it: `serve run` on its own local Ray, on private ports.

The only changes to the file are its ports (private ones, so a `serve run` on this machine is never disturbed)
and how long its replicas drain when Ctrl-C deletes the apps; everything else, the demo models built by
`.ci/setup` included, is what a fresh clone runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import yaml

from bench.procs import free_port
from tests.integration.conftest import ROOT, quick_draining

SERVE_CLI = Path(sys.executable).parent / "serve"
START_TIMEOUT_S = 240
# The high-throughput mode gives each replica its own HTTP and gRPC port from fixed ranges (30000-31000,
# 40000-41000), chosen per Ray instance: a second instance beside the test session's would take the same
# ports, and HAProxy could send its requests to the other instance's replicas. Other ranges here.
OWN_REPLICA_PORTS = {
    "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": "31001",
    "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": "32000",
    "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT": "41001",
    "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": "42000",
}


def _with_private_ports(example: Path, path: Path, port: int) -> str:
    config = yaml.safe_load(example.read_text())
    config["http_options"]["port"] = port
    env = config["controller_options"]["runtime_env"]["env_vars"]
    env.update(RAY_SERVE_HAPROXY_STATS_PORT=str(free_port()), RAY_SERVE_HAPROXY_METRICS_PORT=str(free_port()))
    # Ray's processes take these from the config, not from serve run's environment. HAProxy falls back to
    # Serve's proxy (8500) while the ingress starts: that one must be this instance's too.
    env.update(OWN_REPLICA_PORTS)
    env.update(
        RAY_SERVE_FALLBACK_PROXY_HTTP_PORT=str(free_port()),
        RAY_SERVE_FALLBACK_PROXY_GRPC_PORT=str(free_port()),
    )
    # Ctrl-C deletes the apps: each ingress replica (the router's, every model app's) holds on for Ray's
    # direct-ingress minimum draining period, 30 s, and the teardown ran into its 90 s wait (CI).
    for app in config["applications"]:
        app["runtime_env"] = quick_draining({"env_vars": {**app["runtime_env"]["env_vars"], **env}})
    path.write_text(yaml.safe_dump(config))
    return str(path)


@contextlib.contextmanager
def serve_example(example: Path, models: list[str], tmp: Path) -> Iterator[str]:
    """``serve run example`` until every one of ``models`` is ready; yields its URL, then Ctrl-C's it."""
    port = free_port()
    config = _with_private_ports(example, tmp / example.name, port)
    # RAY_ADDRESS=local: a new Ray instance of its own, as on a machine where no other Ray runs.
    # Nothing of the test session's own Ray (ray.init sets RAY_* variables in this process) reaches it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_ADDRESS"] = "local"
    log = (tmp / "serve.log").open("w")
    proc = subprocess.Popen(
        [str(SERVE_CLI), "run", config], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, (
                f"serve run exited {proc.returncode}: {(tmp / 'serve.log').read_text()}"
            )
            try:
                health = httpx.get(f"{url}/healthz", timeout=5)
                body = health.json() if health.status_code == 200 else {}
                if set(body.get("models", ())) == set(models) and body["status"] == "ready":
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (
                f"not ready in {START_TIMEOUT_S} s: {(tmp / 'serve.log').read_text()}"
            )
            time.sleep(1)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: serve run deletes its apps and stops its Ray
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()
