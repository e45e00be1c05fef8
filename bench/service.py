"""This service under test: a Serve config deployed on a private Ray instance, on free ports.

The Ray instance belongs to a ``bench.serve_host`` child process started in its own session, with its
own temp dir, so it never joins or disturbs another Ray instance on the machine (no ``ray stop``:
that would stop every Ray instance here). The Ray processes get the variant's environment variables.
"""

from __future__ import annotations

import copy
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench import procs
from bench.config_edit import with_args, with_env

ROOT = Path(__file__).resolve().parent.parent
# serve_config.yaml runs Ray Serve's high-throughput mode (HAProxy in front of the ingress replica, gRPC
# between replicas); these variables switch it off again for a variant, back to Serve's Python proxy.
PROXY_ENV = {
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "0",
    "RAY_SERVE_ENABLE_HA_PROXY": "0",
}
READY_TIMEOUT_S = 420.0


@dataclass(frozen=True)
class ServiceVariant:
    """One configuration of this service: a Serve config file plus environment for the Ray processes."""

    name: str
    config: Path
    env: dict[str, str] = field(default_factory=dict)
    # Dotted paths under the first application's ``args`` (e.g. "observability.access_log") -> value.
    args: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        pairs = [f"{k}={v}" for k, v in sorted(self.env.items())]
        pairs += [f"args.{k}={v}" for k, v in sorted(self.args.items())]
        extra = " ".join(pairs)
        return f"{self.config}" + (f" with {extra}" if extra else "")


def parse_env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key or not key.replace("_", "").isalnum():
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def parse_service(spec: str, common_env: dict[str, str] | None = None) -> ServiceVariant:
    """``name=config.yaml[,KEY=VAL...]``, or ``config.yaml[,KEY=VAL...]`` (named ``service``).

    ``KEY`` is an environment variable for the Ray processes, or ``args.a.b`` to set a value (YAML) in the
    ``args`` of the applications that take it (``bench.config_edit``: model keys to every model application,
    router keys to the router), e.g. ``args.observability.trace_sample_ratio=0``."""
    head, *pairs = spec.split(",")
    name, sep, config = head.partition("=")
    if not sep:
        name, config = "service", head
    if not name or not config:
        raise ValueError(f"expected name=config.yaml[,KEY=VAL...], got {spec!r}")
    env = dict(common_env or {})
    args: dict[str, Any] = {}
    for pair in filter(None, pairs):
        if pair.startswith("args."):
            key, _, value = pair.removeprefix("args.").partition("=")
            args[key] = yaml.safe_load(value)
        else:
            env.update([parse_env_pair(pair)])
    return ServiceVariant(name=name, config=Path(config), env=env, args=args)


def load_config(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or "applications" not in data:
        raise ValueError(f"{path}: not a Ray Serve config (no 'applications')")
    return data


def with_port(config: dict[str, Any], port: int) -> dict[str, Any]:
    """A copy of ``config`` served on 127.0.0.1:``port``."""
    cfg = copy.deepcopy(config)
    http = dict(cfg.get("http_options") or {})
    http.update(host="127.0.0.1", port=port)
    cfg["http_options"] = http
    return cfg


def ray_env(variant_env: dict[str, str], temp_dir: Path) -> dict[str, str]:
    """The environment for the Ray processes: the caller's, the variant's, and private paths/ports
    for the optional HAProxy so that a second Serve instance on this machine cannot collide with it."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    # Directly in the (short) temp dir: Ray adds a 56-character node id below it, and HAProxy refuses
    # socket paths over 97 characters.
    haproxy = temp_dir
    env.update(
        RAY_USAGE_STATS_ENABLED="0",
        RAY_SERVE_HAPROXY_CONFIG_FILE_LOC=str(haproxy / "haproxy.cfg"),
        RAY_SERVE_HAPROXY_SOCKET_PATH=str(haproxy / "admin.sock"),
        RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH=str(haproxy / "metrics.sock"),
        RAY_SERVE_HAPROXY_SERVER_STATE_BASE=str(haproxy / "hp-state"),
        RAY_SERVE_HAPROXY_SERVER_STATE_FILE=str(haproxy / "server-state"),
        RAY_SERVE_HAPROXY_STATS_PORT=str(procs.free_port()),
        RAY_SERVE_HAPROXY_METRICS_PORT=str(procs.free_port()),
    )
    env.update(variant_env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


class RayServeService:
    """Start with ``start()``, re-apply configs with ``apply()``, always ``stop()`` (or use ``with``)."""

    def __init__(self, variant: ServiceVariant, log_dir: Path, num_cpus: int | None = None) -> None:
        self.variant = variant
        self.log = log_dir / f"{variant.name}.log"
        self.num_cpus = num_cpus
        self.port = 0
        self.config: dict[str, Any] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._reply_r = -1
        self._temp_dir: Path | None = None
        self._buffer = b""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ray_logs_dir(self) -> Path | None:
        """The private Ray instance's log directory (replica stderr: ``worker-*.err``) while it runs."""
        return self._temp_dir / "session_latest" / "logs" if self._temp_dir is not None else None

    @property
    def session_id(self) -> int | None:
        """The session of every process of this instance (the host leads it)."""
        return self._proc.pid if self._proc is not None else None

    def __enter__(self) -> RayServeService:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> float:
        """Deploy and wait for /healthz; returns the seconds it took."""
        t0 = time.monotonic()
        self.port = procs.free_port()
        config = with_env(with_args(load_config(self.variant.config), self.variant.args), self.variant.env)
        self.config = with_port(config, self.port)
        # Short: Ray's unix socket paths under it must stay below 108 bytes.
        self._temp_dir = Path(tempfile.mkdtemp(prefix="bench-ray-", dir="/tmp"))
        cfg_file = self._temp_dir / "serve_config.json"
        cfg_file.write_text(json.dumps(self.config))
        self._reply_r, reply_w = os.pipe()
        cmd = [
            sys.executable,
            "-m",
            "bench.serve_host",
            "--config",
            str(cfg_file),
            "--temp-dir",
            str(self._temp_dir),
            "--reply-fd",
            str(reply_w),
        ]
        if self.num_cpus:
            cmd += ["--num-cpus", str(self.num_cpus)]
        env = ray_env(self.variant.env, self._temp_dir)
        try:
            self._proc = procs.start(
                cmd, self.log, env=env, cwd=ROOT, pass_fds=[reply_w], stdin=subprocess.PIPE
            )
        finally:
            os.close(reply_w)
        event = self._read_event(READY_TIMEOUT_S)
        if event.get("event") != "ready":
            raise procs.StartError(f"{self.variant.name}: {event.get('message', event)}; log: {self.log}")
        procs.wait_http_ok(f"{self.base_url}/healthz", 120.0, self._proc, self.log)
        return time.monotonic() - t0

    def apply(self, config: dict[str, Any], timeout_s: float = 300.0) -> float:
        """Re-deploy ``config`` (its port is forced to this instance's); returns seconds until in force."""
        if self._proc is None or self._proc.stdin is None:
            raise RuntimeError("service is not running")
        config = with_port(config, self.port)
        self._proc.stdin.write((json.dumps({"cmd": "apply", "config": config}) + "\n").encode())
        self._proc.stdin.flush()
        event = self._read_event(timeout_s)
        if event.get("event") != "applied":
            raise RuntimeError(f"apply failed: {event.get('message', event)}; log: {self.log}")
        self.config = config
        return float(event.get("seconds", 0.0))

    def _read_event(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return {"event": "timeout", "message": f"no answer within {timeout_s:.0f} s"}
            ready, _, _ = select.select([self._reply_r], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self._reply_r, 65536)
                if not chunk:
                    code = self._proc.poll() if self._proc else None
                    return {
                        "event": "exit",
                        "message": f"serve host exited (code {code})\n{procs.tail(self.log)}",
                    }
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return dict(json.loads(line))

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.stdin is not None and proc.poll() is None:
                try:
                    proc.stdin.write(b'{"cmd": "stop"}\n')
                    proc.stdin.close()
                    proc.wait(timeout=60)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            marker = str(self._temp_dir) if self._temp_dir else ""
            left = procs.stop(proc, grace_s=15.0, markers=[marker])
            if left:
                print(
                    f"warning: processes still alive after stopping {self.variant.name}: {left}",
                    file=sys.stderr,
                )
        if self._reply_r >= 0:
            os.close(self._reply_r)
            self._reply_r = -1
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None
