"""Infinity (``infinity-emb`` 0.0.78), the peer: its own virtual environment, model copy and commands.

Infinity pins an older transformers than this project, so it lives in ``.bench/infinity-venv``, made on
request (``--with-infinity``). The CPU build of torch is installed first so that pip keeps it instead of
pulling a multi-GB CUDA build, then ``infinity-emb[server,torch,optimum]`` (``[all]`` would pull vision
and audio stacks), then any ``torchvision`` is removed (it breaks beside the CPU torch build).

Three configurations serve a scratch copy of the default model's weights: the ``torch`` engine in fp32
and in bf16 (``--dtype bfloat16``, its fastest on 32-text requests on a CPU with bf16 instructions), and
``optimum`` (ONNX Runtime, its fastest on single texts) with a ``model.onnx`` exported beside the
weights. Version 0.0.78 only finds a local ONNX file when started inside the model directory with
``--model-id .``. Pooling is passed explicitly: with ``auto`` the optimum engine falls back to CLS
pooling for this model (cosine ~0.5 against the reference).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.peer_venv import PeerUnavailable, ensure_peer_venv

INFINITY_VERSION = "0.0.78"
EXTRAS = "server,torch,optimum"
ENGINES = ("torch", "optimum")
# Infinity's own default level: uvicorn writes an access line per request, as the service writes one
# (observability.access_log, on by default). Like for like: until 4 December the peer ran at
# "warning", without its access line, against the service with its own. What each line costs its server:
# docs/benchmarks.md, "Access logs".
LOG_LEVEL = "info"


@dataclass(frozen=True)
class InfinityConfig:
    """One way of running Infinity: its report label, engine and weight dtype (None: Infinity's default)."""

    label: str
    engine: str
    dtype: str | None = None

    @property
    def flags(self) -> str:
        return f"--engine {self.engine}" + (f" --dtype {self.dtype}" if self.dtype else "")


CONFIGS = (
    InfinityConfig("infinity-torch", "torch"),
    InfinityConfig("infinity-torch-bf16", "torch", "bfloat16"),
    InfinityConfig("infinity-onnx", "optimum"),
)


class InfinityUnavailable(PeerUnavailable):
    """Infinity cannot run here; the message says why (it goes into the report)."""


@dataclass(frozen=True)
class InfinityEnv:
    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def cli(self) -> Path:
        return self.venv / "bin" / "infinity_emb"

    def version(self) -> str:
        out = subprocess.run(
            [str(self.python), "-c", "import importlib.metadata as m; print(m.version('infinity_emb'))"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return out.stdout.strip()


def ensure_venv(venv: Path, log: Path, install_timeout_s: float = 1800.0) -> InfinityEnv:
    """Create (once) and return the Infinity environment; raises InfinityUnavailable with the reason."""
    env = InfinityEnv(venv)
    try:
        ensure_peer_venv(
            venv,
            env.cli,
            f".bench-installed-{INFINITY_VERSION}",
            f"infinity-emb[{EXTRAS}]=={INFINITY_VERSION}",
            "import infinity_emb, optimum.onnxruntime",
            log,
            install_timeout_s,
            after=(["uninstall", "-y", "torchvision"],),
        )
    except PeerUnavailable as exc:
        raise InfinityUnavailable(str(exc)) from None
    return env


def prepare_model(env: InfinityEnv, source: Path, dest: Path, log: Path) -> Path:
    """Copy the weights to ``dest`` and export ``model.onnx`` beside them (once)."""
    if not (dest / "config.json").is_file():
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(source, dest, ignore=shutil.ignore_patterns("model.onnx", "onnx"))
    if not (dest / "model.onnx").is_file():
        export = (
            "from optimum.onnxruntime import ORTModelForFeatureExtraction as M; "
            "M.from_pretrained('.', export=True).save_pretrained('.')"
        )
        with log.open("a") as f:
            f.write(f"$ (cd {dest}) python -c {export!r}\n")
            f.flush()
            done = subprocess.run(
                [str(env.python), "-c", export], cwd=dest, stdout=f, stderr=subprocess.STDOUT, timeout=900
            )
        if done.returncode != 0 or not (dest / "model.onnx").is_file():
            raise InfinityUnavailable(f"ONNX export for Infinity's optimum engine failed (log: {log})")
    return dest


def command(
    env: InfinityEnv, engine: str, model_dir: Path, port: int, model_name: str, dtype: str | None = None
) -> tuple[list[str], Path]:
    """The command line and working directory for one Infinity engine (weights in ``dtype``, if given)."""
    if engine not in ENGINES:
        raise ValueError(f"unknown Infinity engine {engine!r}; one of {ENGINES}")
    cmd = [
        str(env.cli),
        "v2",
        "--model-id",
        "." if engine == "optimum" else str(model_dir),
        "--served-model-name",
        model_name,
        "--engine",
        engine,
        "--device",
        "cpu",
        "--batch-size",
        "32",
        "--pooling-method",
        "mean",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        LOG_LEVEL,
    ]
    if dtype:
        cmd += ["--dtype", dtype]
    return cmd, model_dir


def server_env(base: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in base.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    env.update(HF_HUB_OFFLINE="1", INFINITY_ANONYMOUS_USAGE_STATS="0", DO_NOT_TRACK="1")
    return env
