"""Child process that owns one private Ray instance and the Serve apps deployed on it.

    python -m bench.serve_host --config cfg.json --temp-dir /tmp/bench-ray-x --num-cpus 2 --reply-fd N

It starts a local Ray (random ports, its own temp dir, no dashboard), deploys the config through the
same controller call ``serve run`` makes, and reports on the reply fd (one JSON line per event).
Commands arrive on stdin, one JSON line each: ``{"cmd": "apply", "config": {...}}`` re-deploys (a
changed ``user_config`` reaches replicas through ``reconfigure()``, no restart) and answers once the
new setting is in force; ``{"cmd": "stop"}`` or EOF shuts Serve and Ray down. SIGTERM does too.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

DEPLOY_TIMEOUT_S = 300.0


def _reply(fd: int, **event: Any) -> None:
    os.write(fd, (json.dumps(event) + "\n").encode())


def _deploy(config: dict[str, Any]) -> None:
    from ray.serve._private.api import serve_start
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(config)
    client = serve_start(
        http_options=schema.http_options.model_dump(),
        proxy_location=schema.proxy_location,
        # As `serve run` does: the controller gets its env (the high-throughput mode) from here.
        controller_options=schema.controller_options,
    )
    client.deploy_apps(schema, _blocking=False)


def _details() -> dict[str, Any]:
    from ray.serve.context import _get_global_client

    return dict(_get_global_client().get_serve_details())


def in_force(details: dict[str, Any], config: dict[str, Any]) -> tuple[bool, str]:
    """Whether every app is RUNNING with each listed deployment's user_config applied on all replicas."""
    apps = details.get("applications", {})
    for app in config["applications"]:
        got = apps.get(app["name"])
        if got is None:
            return False, f"{app['name']}: not deployed yet"
        if got["status"] == "DEPLOY_FAILED":
            raise RuntimeError(f"{app['name']}: DEPLOY_FAILED: {got.get('message', '')}")
        if got["status"] != "RUNNING":
            return False, f"{app['name']}: {got['status']}"
        for dep in app.get("deployments", []):
            if "user_config" not in dep:
                continue
            live = got["deployments"].get(dep["name"])
            if live is None:
                return False, f"{dep['name']}: missing"
            if live["deployment_config"].get("user_config") != dep["user_config"]:
                return False, f"{dep['name']}: old user_config"
            states = [r["state"] for r in live["replicas"]]
            if live["status"] != "HEALTHY" or any(s != "RUNNING" for s in states):
                return False, f"{dep['name']}: {live['status']} {states}"
            if len(states) != live["target_num_replicas"]:
                return False, f"{dep['name']}: {len(states)}/{live['target_num_replicas']} replicas"
    return True, "ok"


def wait_in_force(config: dict[str, Any], timeout_s: float = DEPLOY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    stable = 0
    why = "no status yet"
    while time.monotonic() < deadline:
        ok, why = in_force(_details(), config)
        stable = stable + 1 if ok else 0
        if stable >= 2:  # two polls in a row, so a status from before the change cannot pass
            return
        time.sleep(0.5)
    raise TimeoutError(f"config not in force after {timeout_s:.0f} s: {why}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Own one private Ray + Serve instance for the benchmark.")
    parser.add_argument("--config", required=True, help="JSON file: a ServeDeploySchema config")
    parser.add_argument("--temp-dir", required=True)
    parser.add_argument("--num-cpus", type=int, default=None)
    parser.add_argument("--reply-fd", type=int, required=True)
    ns = parser.parse_args(argv)

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    import ray
    from ray import serve

    with open(ns.config) as f:
        config = json.load(f)
    os.environ.pop("RAY_ADDRESS", None)  # never join someone else's cluster
    try:
        ray.init(
            num_cpus=ns.num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            namespace="serve",
            _temp_dir=ns.temp_dir,
        )
        t0 = time.monotonic()
        _deploy(config)
        wait_in_force(config)
        _reply(ns.reply_fd, event="ready", seconds=round(time.monotonic() - t0, 1))
        for line in sys.stdin:
            if not line.strip():
                continue
            msg = json.loads(line)
            if msg.get("cmd") == "stop":
                break
            if msg.get("cmd") == "apply":
                try:
                    t0 = time.monotonic()
                    config = msg["config"]
                    _deploy(config)
                    wait_in_force(config)
                    _reply(ns.reply_fd, event="applied", seconds=round(time.monotonic() - t0, 1))
                except Exception as exc:  # reported to the parent, which decides
                    _reply(ns.reply_fd, event="error", message=f"{type(exc).__name__}: {exc}")
    except KeyboardInterrupt:
        pass
    except Exception as exc:
        _reply(ns.reply_fd, event="error", message=f"{type(exc).__name__}: {exc}")
        return 1
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
