"""The HTTP systems of ``python -m bench.generate``: this service, ``transformers serve``, a naive endpoint
(vLLM: ``bench.generate_vllm``).

Each is started alone on a free loopback port in its own process session (``bench.procs``), waited for
(health route and ``/v1/models`` listing the model) and stopped before the next one.

``transformers serve`` lives in ``.bench/serving-venv`` (made on first use): ``transformers[serving]``
at this environment's transformers version with this environment's exact CPU torch build pinned
(``bench.peer_venv.torch_pin``: ``torch==2.13.0+cpu``), so pip never pulls a multi-GB CUDA build.
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench import procs
from bench.peer_venv import PeerUnavailable, ensure_peer_venv
from bench.service import ROOT, RayServeService, ServiceVariant, load_config

SERVICE, VLLM, TRANSFORMERS_SERVE, NAIVE = "service", "vllm", "transformers-serve", "naive"
SYSTEMS = (SERVICE, VLLM, TRANSFORMERS_SERVE, NAIVE)
CHAT_ROUTE = "/v1/chat/completions"
TS_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # --precision -> transformers serve --dtype
START_TIMEOUT_S = 600.0


class Unavailable(RuntimeError):
    """A system cannot run here; the message says why (it goes into the report)."""


def transformers_version() -> str:
    return importlib.metadata.version("transformers")


@dataclass(frozen=True)
class ServingEnv:
    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def cli(self) -> Path:
        return self.venv / "bin" / "transformers"


def ensure_serving_venv(venv: Path, log: Path, install_timeout_s: float = 1800.0) -> ServingEnv:
    """Create (once) the ``transformers serve`` environment; raises Unavailable with the reason."""
    env, version = ServingEnv(venv), transformers_version()
    try:
        ensure_peer_venv(
            venv,
            env.cli,
            f".bench-installed-transformers-{version}",
            f"transformers[serving]=={version}",
            f"import transformers, fastapi, uvicorn; assert transformers.__version__ == {version!r}",
            log,
            install_timeout_s,
        )
    except PeerUnavailable as exc:
        raise Unavailable(str(exc)) from None
    return env


def serve_help(env: ServingEnv) -> str:
    """``transformers serve --help`` of the serving venv (for the report: which flags it has)."""
    done = subprocess.run(
        [str(env.cli), "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
    )
    return done.stdout + done.stderr


def _get_json(url: str, timeout_s: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def wait_model_listed(base_url: str, model: str | None, timeout_s: float, proc: Any, log: Path) -> str:
    """Poll ``/v1/models`` until it lists ``model`` (None: any model); returns the id listed."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            ids = [m.get("id") for m in _get_json(f"{base_url}/v1/models").get("data", [])]
            if ids and (model is None or model in ids):
                return model or str(ids[0])
            last = f"listed {ids}"
        except (OSError, ValueError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        if proc is not None and proc.poll() is not None:
            raise procs.StartError(f"exited with code {proc.returncode}; log: {log}\n{procs.tail(log)}")
        time.sleep(1.0)
    raise procs.StartError(f"{base_url}/v1/models did not list {model or 'a model'} ({last}); log: {log}")


@dataclass
class Running:
    """A started system: where to send requests, which model name to put in them, how to stop it."""

    name: str
    base_url: str
    model: str | None  # None: leave ``model`` out of the requests
    session: int | None  # process session of the server (its CPU is not "other load")
    log: Path
    start_s: float
    _stop: Any = field(repr=False, default=None)

    @property
    def chat_url(self) -> str:
        return self.base_url + CHAT_ROUTE

    def stop(self) -> None:
        if self._stop is not None:
            stop, self._stop = self._stop, None
            stop()


def _stop_proc(proc: Any, name: str) -> Any:
    def stop() -> None:
        left = procs.stop(proc, grace_s=15.0)
        if left:
            print(f"warning: processes still alive after stopping {name}: {left}", file=sys.stderr)

    return stop


def _generate_apps(config: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        app
        for app in config.get("applications", [])
        if isinstance((app.get("args") or {}).get("model"), dict)
        and app["args"]["model"].get("task") == "generate"
    ]


def retarget_config(
    config: dict[str, Any], model: str, model_dir: Path, precision: str | None = None
) -> tuple[dict[str, Any], str]:
    """``config`` with its (first) generate application serving ``model_dir`` as ``model``: the app and
    its model renamed, ``version`` and ``repository`` taken from the path (``<repository>/<name>/<version>``,
    so ``model_dir``'s parent must be named ``model``), the routers' model lists following; with
    ``precision``, the application serving ``model`` set to it. Returned as is when an application already
    serves ``model`` in that precision. Also says what it changed."""
    gen = _generate_apps(config)
    if not gen:
        raise ValueError("the config has no application with task: generate")
    serving = [app for app in gen if app["args"]["model"].get("name") == model]
    if serving:
        if precision is None or serving[0]["args"]["model"].get("precision", "fp32") == precision:
            return config, ""
        cfg = copy.deepcopy(config)
        app = next(a for a in _generate_apps(cfg) if a["args"]["model"].get("name") == model)
        app["args"]["model"]["precision"] = precision
        return cfg, f"precision {precision}"
    if model_dir.resolve().parent.name != model:
        raise ValueError(f"{model_dir} is not <repository>/{model}/<version>: cannot serve it as {model}")
    cfg = copy.deepcopy(config)
    app = _generate_apps(cfg)[0]
    old = app["args"]["model"]["name"]
    repository = str(model_dir.resolve().parent.parent)
    app["args"]["model"].update(name=model, version=model_dir.resolve().name, repository=repository)
    if precision is not None:
        app["args"]["model"]["precision"] = precision
    if app.get("name") == old:
        app["name"] = model
    for other in cfg["applications"]:
        args = other.get("args") or {}
        if isinstance(args.get("models"), list):
            args["models"] = [model if m == old else m for m in args["models"]]
        if args.get("default_model") == old:
            args["default_model"] = model
    return cfg, f"{old} -> {model} from {model_dir}"


def service_config(
    config_path: Path, model: str, model_dir: Path, out_dir: Path, precision: str | None = None
) -> tuple[Path, str]:
    """The config to deploy: ``config_path`` itself, or a retargeted copy in ``out_dir``."""
    config = load_config(config_path)
    cfg, change = retarget_config(config, model, model_dir, precision)
    if not change:
        return config_path, ""
    path = out_dir / "service-config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    head = f"# {config_path} with its generate application retargeted: {change}\n"
    path.write_text(head + yaml.safe_dump(cfg, sort_keys=False))
    return path, change


def start_service(variant: ServiceVariant, model: str, log_dir: Path, num_cpus: int | None) -> Running:
    """This service on a private Ray instance (``bench.service``), ready when ``/healthz`` answers and
    ``/v1/models`` lists ``model``."""
    t0 = time.monotonic()
    service = RayServeService(variant, log_dir, num_cpus=num_cpus)
    try:
        service.start()
        wait_model_listed(service.base_url, model, START_TIMEOUT_S, None, service.log)
    except BaseException:
        service.stop()
        raise
    return Running(
        SERVICE, service.base_url, model, service.session_id, service.log, time.monotonic() - t0, service.stop
    )


def transformers_serve_command(env: ServingEnv, model_dir: Path, port: int, flags: list[str]) -> list[str]:
    return [
        str(env.cli),
        "serve",
        "--continuous-batching",
        "--device",
        "cpu",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *flags,
        str(model_dir.resolve()),
    ]


def start_transformers_serve(env: ServingEnv, model_dir: Path, log_dir: Path, flags: list[str]) -> Running:
    """``transformers serve --continuous-batching --device cpu`` pinned to the model dir; requests leave
    ``model`` out (the server is pinned to its one model)."""
    t0 = time.monotonic()
    port = procs.free_port()
    log = log_dir / f"{TRANSFORMERS_SERVE}.log"
    server_env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    server_env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    proc = procs.start(transformers_serve_command(env, model_dir, port, flags), log, env=server_env, cwd=ROOT)
    return await_server(TRANSFORMERS_SERVE, proc, port, "/health", None, log, t0)


def start_naive(model_dir: Path, model: str, log_dir: Path, precision: str = "fp32") -> Running:
    t0 = time.monotonic()
    port = procs.free_port()
    log = log_dir / f"{NAIVE}.log"
    cmd = [
        sys.executable,
        "-m",
        "bench.naive_generate_server",
        "--port",
        str(port),
        "--model-dir",
        str(model_dir.resolve()),
        "--model-name",
        model,
        "--precision",
        precision,
    ]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = procs.start(cmd, log, env=env, cwd=ROOT)
    return await_server(NAIVE, proc, port, "/healthz", model, log, t0)


def await_server(
    name: str, proc: Any, port: int, health: str, model: str | None, log: Path, t0: float
) -> Running:
    """A started peer once its health route answers and it lists the model; stopped if it never does."""
    base = f"http://127.0.0.1:{port}"
    try:
        procs.wait_http_ok(f"{base}{health}", START_TIMEOUT_S, proc, log)
        wait_model_listed(base, model, 60.0, proc, log)
    except BaseException:
        procs.stop(proc)
        raise
    return Running(name, base, model, proc.pid, log, time.monotonic() - t0, _stop_proc(proc, name))


if __name__ == "__main__":  # python -m bench.generate_systems: make the serving venv only
    work = ROOT / ".bench"
    print(ensure_serving_venv(work / "serving-venv", work / "serving-install.log").cli)
