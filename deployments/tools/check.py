"""Preflight: ``python -m deployments.tools.check serve_config.yaml`` validates a config and its models.

Exits 1 with the offending field named when ``serve run`` would refuse the model (Ray Serve would
log the same error and leave the app in DEPLOY_FAILED), or when an HAProxy left behind by a killed
instance holds a port the config needs; exits 0 and prints a summary (and any other busy port) otherwise.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from pathlib import Path
from typing import Any

import yaml
from ray.serve.schema import ServeApplicationSchema, ServeDeploySchema  # imports no running Ray

from deployments.access.tenants import TenantsFile
from deployments.config import PROJECT_ROOT, ModelAppArgs, RouterArgs, resolve_path
from deployments.pipeline.card import INFERENCE, MODEL, SERIALIZER, TOKENIZER
from deployments.repository.manifest import ManifestError
from deployments.repository.resolve import resolve_model
from deployments.tools.ports import PortHolder, holders
from deployments.user_config import BatchingConfig, IngressConfig, PipelineConfig

ROUTER = "deployments.app:build_router"
MODEL_APP = "deployments.app:build_model"
USER_CONFIGS = {
    "Inference": BatchingConfig,
    "Ingress": IngressConfig,
    "Model": PipelineConfig,
}
# What a model application names explicitly even where it equals a default: which model artifact it
# serves, checked against the manifest.
IDENTITY = {"model.name", "model.version", "model.task", "model.backend"}
# Ray Serve's defaults for HAProxy's stats page and Prometheus endpoint (it binds them on every interface).
GENERATOR = "Model (generate)"  # decorator_options' key for a generate model's Model deployment
HAPROXY_PORTS = {"RAY_SERVE_HAPROXY_STATS_PORT": 8404, "RAY_SERVE_HAPROXY_METRICS_PORT": 9101}


def _check_user_configs(app: ServeApplicationSchema) -> None:
    for deployment in app.deployments:
        kind = USER_CONFIGS.get(deployment.name.removeprefix("Candidate"))
        if kind is not None and isinstance(deployment.user_config, dict):
            kind.model_validate(deployment.user_config)


def _model_lines(app: ServeApplicationSchema) -> list[str]:
    args = ModelAppArgs.model_validate(app.args or {})
    lines = []
    for role, model_config in zip(("stable", "candidate"), args.served_models(), strict=False):
        model = resolve_model(model_config, hash_files=args.runtime.verify_checksums)
        m = model.manifest
        if m.task == "embed":
            signature = f"dimension {m.output.dimension}"
        elif m.task == "generate":
            signature = "chat template" if m.chat_template else "no chat template"
        else:
            signature = f"labels {list(m.output.labels or ())}"
        torch_graph = model_config.backend == "torch" and m.task != "generate"
        graph = f" {args.runtime.torch_graph}" if torch_graph else ""
        lines.append(
            f"{app.name}: {m.name} v{m.version} {role} ({m.task}, {signature}, max {m.input.max_tokens} "
            f"tokens, {model_config.backend} {model.precision}{graph}) weights {model.weights_dir}"
        )
    return lines


def _auth_line(router: RouterArgs) -> str:
    """The tenants file read as the ingress will read it (a missing or broken one refuses to start)."""
    if router.auth.keys_file is None:
        return "; no API keys (every request is tenant 'anonymous')"
    tenants = TenantsFile.read(resolve_path(router.auth.keys_file))
    keys = sum(len(t.keys) for t in tenants.tenants.values())
    return f"; API keys on: {len(tenants.tenants)} tenants, {keys} keys"


def check_config(path: Path) -> list[str]:
    """Return one summary line per served model version; raise on the first problem."""
    schema = ServeDeploySchema.model_validate(yaml.safe_load(path.read_text()))
    lines: list[str] = []
    model_apps = {app.name for app in schema.applications if app.import_path == MODEL_APP}
    for app in schema.applications:
        _check_user_configs(app)
        if app.import_path == ROUTER:
            router = RouterArgs.model_validate(app.args or {})
            missing = [m for m in router.models if m not in model_apps]
            if missing:
                raise ValueError(f"router {app.name!r} routes to {missing}, which no application serves")
            lines.append(f"{app.name}: routes {router.models}, default {router.default}{_auth_line(router)}")
        elif app.import_path == MODEL_APP:
            lines.extend(_model_lines(app))
        else:
            lines.append(f"{app.name}: not a textserve app ({app.import_path}), skipped")
    return lines


def decorator_options() -> dict[str, dict[str, Any]]:
    """Each ``@serve.deployment(...)``'s options by deployment name, read from the source with ast (no
    torch, no Ray): the defaults that a config's ``deployments`` entries override. A generate model's
    ``Model`` (the generator) is ``GENERATOR``: its name is the encoder pipeline's too."""
    found: dict[str, dict[str, Any]] = {}
    for source in sorted((PROJECT_ROOT / "deployments").rglob("*.py")):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and ast.unparse(decorator.func) == "serve.deployment":
                    options = {kw.arg: ast.literal_eval(kw.value) for kw in decorator.keywords if kw.arg}
                    name = options.pop("name")
                    found[GENERATOR if node.name == "GeneratorDeployment" else name] = options
    return found


def _deployment_names(app: ServeApplicationSchema, args: RouterArgs | ModelAppArgs) -> list[str]:
    """Every deployment the application's builder makes (written in the config or not)."""
    if isinstance(args, RouterArgs):
        made = ["Ingress"]
    elif args.model.task == "generate":
        made = [MODEL]
    else:
        prefixes = ("", "Candidate")[: len(args.served_models())]
        made = [MODEL, *(prefix + name for prefix in prefixes for name in (TOKENIZER, INFERENCE)), SERIALIZER]
    return [*made, *(d.name for d in app.deployments if d.name not in made)]


def effective_settings(path: Path) -> dict[str, Any]:
    """Every setting of every textserve application: the config's choices over the code's defaults."""
    schema = ServeDeploySchema.model_validate(yaml.safe_load(path.read_text()))
    options = decorator_options()
    out: dict[str, Any] = {}
    for app in schema.applications:
        kind = {ROUTER: RouterArgs, MODEL_APP: ModelAppArgs}.get(app.import_path)
        if kind is None:
            continue
        args = kind.model_validate(app.args or {})
        entry: dict[str, Any] = {"args": args.model_dump(mode="json")}
        written = {d.name: d for d in app.deployments}
        generate = isinstance(args, ModelAppArgs) and args.model.task == "generate"
        for name in _deployment_names(app, args):
            role = GENERATOR if generate and name == MODEL else name.removeprefix("Candidate")
            deployment = written.get(name)
            given = (
                deployment.model_dump(exclude_unset=True, exclude={"name", "user_config"})
                if deployment
                else {}
            )
            entry[name] = {**options.get(role, {}), **given}
            config = USER_CONFIGS.get(role)
            if config is not None:
                user_config = deployment.user_config if deployment else None
                model = config.model_validate(user_config if isinstance(user_config, dict) else {})
                entry[f"{name}.user_config"] = model.model_dump(mode="json")
        out[app.name] = entry
    return out


def _controller_env(schema: ServeDeploySchema) -> dict[str, str]:
    """The environment Serve's controller, and so HAProxy, runs with: this shell's, then the config's."""
    options = schema.controller_options
    return {**os.environ, **((options.runtime_env or {}).get("env_vars", {}) if options else {})}


def busy_ports(config: dict[str, Any]) -> list[PortHolder]:
    """The ports ``serve run`` of this config will listen on that something else holds now."""
    schema = ServeDeploySchema.model_validate(config)
    wanted = [(schema.http_options.host or "0.0.0.0", schema.http_options.port)]
    env = _controller_env(schema)
    if env.get("RAY_SERVE_ENABLE_HA_PROXY") == "1":
        wanted += [("0.0.0.0", int(env.get(name, default))) for name, default in HAPROXY_PORTS.items()]
    return holders(wanted)


def missing_haproxy_binary(config: dict[str, Any]) -> str | None:
    """The HAProxy binary the config names (the project's launcher, deployments/ingress/haproxy/haproxy) when
    Ray would not find it: a relative path is taken from where Ray starts, the directory of ``serve run``.
    Ray then fails to start HAProxy and serves no HTTP at all."""
    env = _controller_env(ServeDeploySchema.model_validate(config))
    path = env.get("RAY_SERVE_HAPROXY_BINARY_PATH")
    if env.get("RAY_SERVE_ENABLE_HA_PROXY") != "1" or not path:
        return None
    return None if os.path.isfile(path) and os.access(path, os.X_OK) else path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path, nargs="?", default=Path("serve_config.yaml"))
    parser.add_argument(
        "--defaults", action="store_true", help="print every setting in force (the config over the defaults)"
    )
    ns = parser.parse_args(argv)
    try:
        if ns.defaults:
            print(yaml.safe_dump(effective_settings(ns.config), sort_keys=False), end="")
            return 0
        for line in check_config(ns.config):
            print(f"ok  {line}")
        config = yaml.safe_load(ns.config.read_text())
        busy = busy_ports(config)
        missing = missing_haproxy_binary(config)
    except ManifestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (ValueError, OSError, yaml.YAMLError) as exc:  # ValueError: pydantic, or a port that is no number
        print(f"error: invalid config {ns.config}: {exc}", file=sys.stderr)
        return 1
    for h in busy:
        # A live Serve instance on the port may be the one `serve run` deploys to; a leftover never is.
        print(f"{'error' if h.orphaned_haproxy else 'warning'}: {h.describe()}", file=sys.stderr)
    if missing:
        print(
            f"error: RAY_SERVE_HAPROXY_BINARY_PATH={missing} is no executable file from {Path.cwd()}: "
            "run from the project root",
            file=sys.stderr,
        )
    return 1 if missing or any(h.orphaned_haproxy for h in busy) else 0


if __name__ == "__main__":
    sys.exit(main())
