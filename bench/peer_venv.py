"""A peer server's own venv under ``.bench/`` (Infinity, ``transformers serve``): made once with pip,
the torch build pinned to this environment's CPU one, a stamp file when it checks out."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import time
from pathlib import Path


class PeerUnavailable(RuntimeError):
    """The peer cannot run here; the message says why (it goes into the report)."""


def torch_pin() -> str:
    """This environment's exact torch build (``torch==2.13.0+cpu``): the local version label keeps pip
    from choosing a CUDA build, and a missing wheel fails loudly instead of downloading gigabytes."""
    return f"torch=={importlib.metadata.version('torch')}"


def run_logged(cmd: list[str], log: Path, timeout_s: float) -> None:
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        try:
            done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise PeerUnavailable(
                f"timed out after {timeout_s:.0f} s: {' '.join(cmd)} (log: {log})"
            ) from None
    if done.returncode != 0:
        raise PeerUnavailable(f"failed (exit {done.returncode}): {' '.join(cmd)} (log: {log})")


def ensure_peer_venv(
    venv: Path,
    cli: Path,
    stamp: str,
    requirement: str,
    check: str,
    log: Path,
    install_timeout_s: float = 1800.0,
    after: tuple[list[str], ...] = (),
) -> None:
    """Make ``venv`` once: pinned torch, then ``requirement``, then each ``after`` pip command, then the
    ``check`` snippet; ``stamp`` (a file name in the venv) marks it done. Raises PeerUnavailable."""
    pin = torch_pin()
    if "+cpu" not in pin:
        raise PeerUnavailable(
            f"this environment's torch is not a CPU build ({pin}); install the peer by hand"
        )
    if (venv / stamp).is_file() and cli.is_file():
        return
    python = venv / "bin" / "python"
    log.parent.mkdir(parents=True, exist_ok=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    if not python.is_file():
        run_logged([sys.executable, "-m", "venv", str(venv)], log, 300)
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check"]
    run_logged([*pip, pin], log, install_timeout_s)
    run_logged([*pip, requirement, pin], log, install_timeout_s)
    for extra in after:
        run_logged([str(python), "-m", "pip", *extra], log, 300)
    run_logged([str(python), "-c", f"assert '+cpu' in __import__('torch').__version__; {check}"], log, 300)
    (venv / stamp).write_text(time.strftime("%Y-%m-%d %H:%M:%S\n"))
