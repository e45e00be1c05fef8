"""The HTTP systems under test behind one interface: start, where to send requests, stop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from bench import infinity, procs
from bench.service import ROOT, RayServeService, ServiceVariant

MODEL_NAME = "all-MiniLM-L6-v2"


class Server(Protocol):
    name: str
    kind: str
    description: str
    embeddings_path: str

    @property
    def base_url(self) -> str: ...

    @property
    def session_id(self) -> int | None: ...

    def start(self) -> float: ...

    def stop(self) -> None: ...


class ServiceServer:
    kind = "service"
    embeddings_path = "/v1/embeddings"

    def __init__(self, variant: ServiceVariant, log_dir: Path, num_cpus: int | None) -> None:
        self.name = variant.name
        self.description = f"this service: {variant.describe()}"
        self.service = RayServeService(variant, log_dir, num_cpus)

    @property
    def base_url(self) -> str:
        return self.service.base_url

    @property
    def session_id(self) -> int | None:
        return self.service.session_id

    def start(self) -> float:
        return self.service.start()

    def stop(self) -> None:
        self.service.stop()


@dataclass
class ProcessServer:
    """A single server process (naive FastAPI, Infinity) on a free port."""

    name: str
    kind: str
    description: str
    embeddings_path: str
    health_path: str
    launch: Callable[[int], tuple[list[str], Path, dict[str, str]]]  # port -> (cmd, cwd, env)
    log: Path
    ready_timeout_s: float = 300.0
    port: int = 0
    _proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def session_id(self) -> int | None:
        return self._proc.pid if self._proc is not None else None  # started with start_new_session

    def start(self) -> float:
        self.port = procs.free_port()
        cmd, cwd, env = self.launch(self.port)
        self._proc = procs.start(cmd, self.log, env=env, cwd=cwd)
        return procs.wait_http_ok(
            self.base_url + self.health_path, self.ready_timeout_s, self._proc, self.log
        )

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            left = procs.stop(proc, grace_s=10.0)
            if left:
                print(f"warning: processes still alive after stopping {self.name}: {left}", file=sys.stderr)


def naive_server(log_dir: Path, model_dir: Path | None = None) -> ProcessServer:
    def launch(port: int) -> tuple[list[str], Path, dict[str, str]]:
        cmd = [sys.executable, "-m", "bench.naive_server", "--port", str(port), "--model-name", MODEL_NAME]
        if model_dir is not None:
            cmd += ["--model-dir", str(model_dir)]
        return cmd, ROOT, dict(os.environ)

    return ProcessServer(
        name="naive-fastapi",
        kind="naive",
        description="FastAPI + uvicorn + transformers AutoModel, one request at a time",
        embeddings_path="/v1/embeddings",
        health_path="/healthz",
        launch=launch,
        log=log_dir / "naive-fastapi.log",
    )


def infinity_server(
    env: infinity.InfinityEnv, config: infinity.InfinityConfig, model_dir: Path, log_dir: Path
) -> ProcessServer:
    def launch(port: int) -> tuple[list[str], Path, dict[str, str]]:
        cmd, cwd = infinity.command(env, config.engine, model_dir, port, MODEL_NAME, config.dtype)
        return cmd, cwd, infinity.server_env(dict(os.environ))

    return ProcessServer(
        name=config.label,
        kind="infinity",
        description=(
            f"Infinity {infinity.INFINITY_VERSION} {config.flags} --device cpu --batch-size 32"
            f" --log-level {infinity.LOG_LEVEL}"
        ),
        embeddings_path="/embeddings",
        health_path="/health",
        launch=launch,
        log=log_dir / f"{config.label}.log",
    )


def fetch_embeddings(url: str, texts: Sequence[str], timeout_s: float = 60.0) -> np.ndarray:
    """One request with ``texts``; the embeddings in input order (float32 rows)."""
    body = json.dumps({"input": list(texts), "model": MODEL_NAME, "encoding_format": "float"}).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        data = json.loads(resp.read())["data"]
    rows = sorted(data, key=lambda d: d.get("index", 0))
    return np.asarray([r["embedding"] for r in rows], dtype=np.float32)


def min_cosine(got: np.ndarray, want: np.ndarray) -> float:
    """The lowest row-wise cosine similarity between two equally shaped matrices."""
    if got.shape != want.shape:
        raise ValueError(f"shape {got.shape} != reference {want.shape}")
    num = (got * want).sum(axis=1)
    den = np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1)
    return float((num / np.maximum(den, 1e-12)).min())
