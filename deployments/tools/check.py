"""Preflight: ``python -m deployments.tools.check serve_config.yaml`` validates a config and its models.

Exits 1 with the offending field named when ``serve run`` would refuse the model (Ray Serve would
log the same error and leave the app in DEPLOY_FAILED), or when an HAProxy left behind by a killed
instance holds a port the config needs; exits 0 and prints a summary (and any other busy port) otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from deployments.config import AppArgs, BatchingConfig, IngressConfig, SerializerConfig
from deployments.repository.manifest import ManifestError
from deployments.repository.resolve import resolve_model
from deployments.tools.ports import PortHolder, holders

BUILDER = "deployments.app:build_app"
USER_CONFIGS = {"Inference": BatchingConfig, "Serializer": SerializerConfig, "Ingress": IngressConfig}
# Ray Serve's defaults for HAProxy's stats page and Prometheus endpoint (it binds them on every interface).
HAPROXY_PORTS = {"RAY_SERVE_HAPROXY_STATS_PORT": 8404, "RAY_SERVE_HAPROXY_METRICS_PORT": 9101}


def check_config(path: Path) -> list[str]:
    """Return one summary line per application; raise on the first problem."""
    from ray.serve.schema import ServeDeploySchema  # imports no running Ray

    schema = ServeDeploySchema.model_validate(yaml.safe_load(path.read_text()))
    lines = []
    for app in schema.applications:
        if app.import_path != BUILDER:
            lines.append(f"{app.name}: not a textserve app ({app.import_path}), skipped")
            continue
        args = AppArgs.model_validate(app.args or {})
        for deployment in app.deployments:
            kind = USER_CONFIGS.get(deployment.name.removeprefix("Candidate"))
            if kind is not None and deployment.user_config is not None:
                kind.model_validate(deployment.user_config)
        for role, model_config in zip(("stable", "candidate"), args.served_models(), strict=False):
            model = resolve_model(model_config, hash_files=args.runtime.verify_checksums)
            m = model.manifest
            signature = (
                f"dimension {m.output.dimension}"
                if m.task == "embed"
                else f"labels {list(m.output.labels or ())}"
            )
            graph = f" {args.runtime.torch_graph}" if model_config.backend == "torch" else ""
            lines.append(
                f"{app.name}: {m.name} v{m.version} {role} ({m.task}, {signature}, max {m.input.max_tokens} "
                f"tokens, {model_config.backend} {model.precision}{graph}) weights {model.weights_dir}"
            )
    return lines


def busy_ports(config: dict[str, Any]) -> list[PortHolder]:
    """The ports ``serve run`` of this config will listen on that something else holds now."""
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(config)
    wanted = [(schema.http_options.host or "0.0.0.0", schema.http_options.port)]
    options = schema.controller_options
    env = {**os.environ, **((options.runtime_env or {}).get("env_vars", {}) if options else {})}
    if env.get("RAY_SERVE_ENABLE_HA_PROXY") == "1":
        wanted += [("0.0.0.0", int(env.get(name, default))) for name, default in HAPROXY_PORTS.items()]
    return holders(wanted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path, nargs="?", default=Path("serve_config.yaml"))
    ns = parser.parse_args(argv)
    try:
        for line in check_config(ns.config):
            print(f"ok  {line}")
        busy = busy_ports(yaml.safe_load(ns.config.read_text()))
    except ManifestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (ValueError, OSError, yaml.YAMLError) as exc:  # ValueError: pydantic, or a port that is no number
        print(f"error: invalid config {ns.config}: {exc}", file=sys.stderr)
        return 1
    for h in busy:
        # A live Serve instance on the port may be the one `serve run` deploys to; a leftover never is.
        print(f"{'error' if h.orphaned_haproxy else 'warning'}: {h.describe()}", file=sys.stderr)
    return 1 if any(h.orphaned_haproxy for h in busy) else 0


if __name__ == "__main__":
    sys.exit(main())
