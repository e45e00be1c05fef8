"""The README's CLI commands for a running service, run as the README gives them, from a "second terminal".

Ray 2.60 starts a local cluster with token authentication; the ``serve`` and ``ray`` CLIs send the token
(``~/.ray/auth_token``) only when ``RAY_AUTH_MODE=token`` is set. The commands are read from README.md, not
copied here: the fenced block after the ``<!-- readme-cli: ... -->`` marker ("Versions, canary, Kubernetes")
and the inline ``ray list actors`` command under "Profiling". Each runs in bash, in a directory laid out like
the project root (``.venv`` and a ``serve_config.yaml``), with this session's environment minus
``RAY_AUTH_MODE``: ``ray.init`` set that in this process, a new terminal does not have it.

Two settings stand in for what a user's terminal finds by default: ``RAY_DASHBOARD_ADDRESS`` (the ``serve``
CLI's default is ``http://localhost:8265``) and ``RAY_ADDRESS`` (``ray list`` finds the local cluster itself,
but refuses to choose when several run on the machine). Both point at this session's cluster, whichever ports
it got.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.integration.conftest import APP, DEFAULT_MODEL, DEPLOY_TIMEOUT_S, ROOT, ServeHarness, routed_model

pytestmark = pytest.mark.integration

README = ROOT / "README.md"
MARKER = "<!-- readme-cli:"
NEW_APP = "readme-cli"
NEW_ROUTE = "/readme-cli"
CLI_TIMEOUT_S = 120


def readme_block() -> list[str]:
    """The command lines of the fenced block that follows the marker (comments and blank lines dropped)."""
    text = README.read_text()
    start = text.find(MARKER)
    assert start >= 0, f"README.md lost its {MARKER} ... --> marker (the CLI block this test runs)"
    match = re.compile(r"```(?:bash|sh|shell)?\n(.*?)```", re.S).search(text, start)
    assert match, "no fenced code block after the readme-cli marker in README.md"
    lines = [line.strip() for line in match.group(1).splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def readme_inline(command: str) -> str:
    """The README's inline code span that runs ``command`` (e.g. ``ray list actors``)."""
    spans = re.findall(rf"`([^`\n]*\b{re.escape(command)}\b[^`\n]*)`", README.read_text())
    assert len(spans) == 1, f"expected one inline `{command} ...` command in README.md, found {spans}"
    return spans[0]


def second_terminal_env(harness: ServeHarness) -> dict[str, str]:
    import ray

    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    env["RAY_DASHBOARD_ADDRESS"] = harness.dashboard_url
    env["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    return env


def project_dir(path: Path, config: dict[str, Any]) -> Path:
    """A directory the README's relative paths work in: ``.venv`` (this interpreter's) and the config."""
    venv = Path(sys.prefix)
    assert (venv / "bin" / "serve").is_file(), f"no serve CLI in {venv}/bin: run the tests from the venv"
    (path / ".venv").symlink_to(venv, target_is_directory=True)
    (path / "serve_config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def bash(line: str, exports: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = "\n".join(["set -eu", *exports, line])
    return subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT_S
    )


def shown(result: subprocess.CompletedProcess[str]) -> str:
    out, err = result.stdout[-4000:], result.stderr[-4000:]
    return f"exit {result.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"


def app_statuses(status_output: str) -> dict[str, str]:
    apps = (yaml.safe_load(status_output) or {}).get("applications") or {}
    return {name: app["status"] for name, app in apps.items()}


@pytest.fixture
def new_app(serve_harness: ServeHarness) -> Iterator[None]:
    yield
    serve_harness.remove_extras()


def test_readme_rollout_commands_work_from_a_second_terminal(
    serve_harness: ServeHarness, model_repo: Path, new_app: None, tmp_path: Path
) -> None:
    lines = readme_block()
    assert any(re.search(r"\bserve deploy\b", line) for line in lines), lines
    assert any(re.search(r"\bserve status\b", line) for line in lines), lines

    # The edited config a user deploys: the session's applications plus a new one, so that the deploy
    # visibly changes the service (and the other tests' applications stay as they are).
    model = {"repository": str(model_repo), "name": "tiny-sentiment", "task": "classify", "backend": "torch"}
    config = serve_harness.config()
    config["applications"].extend(routed_model(serve_harness, NEW_APP, NEW_ROUTE, model))
    cwd = project_dir(tmp_path, config)
    env = second_terminal_env(serve_harness)

    exports: list[str] = []
    for line in lines:
        if line.startswith("export "):
            exports.append(line)
        elif re.search(r"\bserve status\b", line):
            deadline = time.monotonic() + DEPLOY_TIMEOUT_S
            while True:
                result = bash(line, exports, cwd, env)
                assert result.returncode == 0, f"{line}\n{shown(result)}"
                statuses = app_statuses(result.stdout)
                if statuses.get(NEW_APP) == "RUNNING" and statuses.get(APP) == "RUNNING":
                    break
                assert statuses.get(NEW_APP) != "DEPLOY_FAILED", f"{line}\n{shown(result)}"
                assert time.monotonic() < deadline, f"{NEW_APP} never RUNNING: {line}\n{shown(result)}"
                time.sleep(2)
        else:
            result = bash(line, exports, cwd, env)
            assert result.returncode == 0, f"{line}\n{shown(result)}"
            if re.search(r"\bserve deploy\b", line):
                assert "Sent deploy request successfully" in result.stdout + result.stderr, shown(result)

    # What `serve status` reported is what the service does: the new model answers through its router.
    serve_harness.wait_routed(NEW_APP, route=NEW_ROUTE)
    assert httpx.get(f"{serve_harness.url}{NEW_ROUTE}/healthz", timeout=30).status_code == 200


def test_without_the_token_mode_the_cli_is_refused(serve_harness: ServeHarness, tmp_path: Path) -> None:
    """Why the README exports RAY_AUTH_MODE: without it the same command fails (authentication stays on)."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode != "token":
        pytest.skip(f"this session's Ray runs without token authentication (RAY_AUTH_MODE={mode})")
    status = next(line for line in readme_block() if re.search(r"\bserve status\b", line))
    cwd = project_dir(tmp_path, serve_harness.config())
    result = bash(status, [], cwd, second_terminal_env(serve_harness))
    assert result.returncode != 0, shown(result)
    assert "AuthenticationError" in result.stdout + result.stderr, shown(result)


def test_readme_profiling_command_lists_the_inference_replica(
    serve_harness: ServeHarness, tmp_path: Path
) -> None:
    command = readme_inline("ray list actors")
    cwd = project_dir(tmp_path, serve_harness.config())
    result = bash(command, [], cwd, second_terminal_env(serve_harness))
    assert result.returncode == 0, f"{command}\n{shown(result)}"
    rows = [line for line in result.stdout.splitlines() if f"ServeReplica:{DEFAULT_MODEL}:Inference" in line]
    assert rows and all("ALIVE" in row for row in rows), f"{command}\n{shown(result)}"
