"""Preflight: ``python -m deployments.check serve_config.yaml`` validates a config and its models.

Exits 1 with the offending field named when ``serve run`` would refuse the model (Ray Serve would
log the same error and leave the app in DEPLOY_FAILED); exits 0 and prints a summary otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml
from pydantic import ValidationError

from deployments.config import AppArgs, BatchingConfig, IngressConfig, SerializerConfig
from deployments.manifest import ManifestError
from deployments.model_repo import resolve_model

BUILDER = "deployments.app:build_app"
USER_CONFIGS = {"Inference": BatchingConfig, "Serializer": SerializerConfig, "Ingress": IngressConfig}


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path, nargs="?", default=Path("serve_config.yaml"))
    ns = parser.parse_args(argv)
    try:
        for line in check_config(ns.config):
            print(f"ok  {line}")
    except ManifestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (ValidationError, OSError, yaml.YAMLError) as exc:
        print(f"error: invalid config {ns.config}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
