"""Read and change a Serve config of this service: deployments' ``user_config``, application ``args``
and the runtime environment, in memory or in the file itself.

The service is several Serve applications: one router (``deployments.app:build_router``, deployment
``Ingress``; args ``RouterArgs``) and one application per model (``deployments.app:build_model``,
deployments ``Model``, ``Tokenizer``, ``Inference``, ``Serializer``; args ``ModelAppArgs``). Where an edit
goes when no application is named:

- a deployment's ``user_config``: the first application that lists the deployment, model applications
  first, the router's default model's first of them (so ``Inference`` is the default model's);
- ``args`` (dotted ``a.b.c`` keys), by the key's first part, as the typed configs in deployments/config.py
  declare it: a field only model applications have (``model``, ``candidate``, ``runtime``) goes to every
  model application; a field only the router has (``models``, ``default_model``, ``limits``) to the
  router; a field both have (``observability``) to every application; any other key is an error;
- environment variables: the controller's and every application's ``runtime_env``.

``rewrite_text``/``write_user_config`` rewrite the file with ruamel.yaml's round-trip mode, so comments,
key order and the rest of the file survive; only the named deployment's ``user_config`` keys change.
"""

from __future__ import annotations

import copy
import io
import os
import tempfile
from pathlib import Path
from typing import Any

ROUTER_BUILDER = "deployments.app:build_router"
MODEL_BUILDER = "deployments.app:build_model"


class ConfigEditError(ValueError):
    pass


def _apps(config: Any, builder: str) -> list[Any]:
    return [a for a in config.get("applications") or [] if a.get("import_path") == builder]


def model_apps(config: Any) -> list[Any]:
    """The model applications, the router's default model's first, then the others in file order."""
    apps = _apps(config, MODEL_BUILDER)
    routers = _apps(config, ROUTER_BUILDER)
    if routers:
        args = routers[0].get("args") or {}
        default = args.get("default_model") or next(iter(args.get("models") or []), None)
        apps.sort(key=lambda a: a.get("name") != default)  # stable: the rest keep their order
    return apps


def model_app(config: Any, app_name: str | None = None) -> Any:
    """The named application, or the default model's application (the first one without a router)."""
    if app_name is not None:
        return find_app(config, app_name)
    apps = model_apps(config)
    if not apps:
        raise ConfigEditError(f"no application built by {MODEL_BUILDER} in the config ({_names(config)})")
    return apps[0]


def _names(config: Any) -> str:
    return f"apps: {[a.get('name') for a in config.get('applications') or []]}"


def find_app(config: Any, app_name: str | None, deployment: str | None = None) -> Any:
    """The named application; else the first of this project's applications (model applications
    first, the default model's first of them, then the router) that lists ``deployment`` (any, if None)."""
    apps = config.get("applications") or []
    if app_name is not None:
        for app in apps:
            if app.get("name") == app_name:
                return app
        raise ConfigEditError(f"no application {app_name!r} in the config ({_names(config)})")
    ours = [*model_apps(config), *_apps(config, ROUTER_BUILDER)]
    for app in ours:
        if deployment is None or any(d.get("name") == deployment for d in app.get("deployments") or []):
            return app
    if not ours:
        raise ConfigEditError(
            f"no application built by {MODEL_BUILDER} or {ROUTER_BUILDER} in the config ({_names(config)})"
        )
    raise ConfigEditError(
        f"no application of this service lists a deployment {deployment!r} ({_names(config)})"
    )


def find_deployment(app: Any, deployment: str) -> Any:
    for dep in app.get("deployments") or []:
        if dep.get("name") == deployment:
            return dep
    raise ConfigEditError(f"application {app.get('name')!r} lists no deployment {deployment!r}")


def _deployment(config: Any, deployment: str, app_name: str | None) -> Any:
    return find_deployment(find_app(config, app_name, deployment), deployment)


def user_config_of(config: Any, deployment: str = "Inference", app_name: str | None = None) -> dict[str, Any]:
    return dict(_deployment(config, deployment, app_name).get("user_config") or {})


def with_user_config(
    config: dict[str, Any], values: dict[str, Any], deployment: str = "Inference", app_name: str | None = None
) -> dict[str, Any]:
    """A deep copy of ``config`` whose deployment's user_config has ``values`` merged in."""
    out = copy.deepcopy(config)
    dep = _deployment(out, deployment, app_name)
    dep["user_config"] = {**(dep.get("user_config") or {}), **values}
    return out


def args_targets(config: Any, dotted: str) -> list[Any]:
    """The applications an ``args`` edit of ``dotted`` goes to (the rule in the module docstring)."""
    from deployments.config import ModelAppArgs, RouterArgs

    head = dotted.split(".", 1)[0]
    in_model, in_router = head in ModelAppArgs.model_fields, head in RouterArgs.model_fields
    if not (in_model or in_router):
        raise ConfigEditError(
            f"args.{dotted}: {head!r} is no field of a model application "
            f"({sorted(ModelAppArgs.model_fields)}) nor of the router ({sorted(RouterArgs.model_fields)})"
        )
    targets = (_apps(config, MODEL_BUILDER) if in_model else []) + (
        _apps(config, ROUTER_BUILDER) if in_router else []
    )
    if not targets:
        kind = MODEL_BUILDER if in_model else ROUTER_BUILDER
        raise ConfigEditError(
            f"args.{dotted}: no application built by {kind} in the config ({_names(config)})"
        )
    return targets


def with_args(config: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` with dotted ``args`` overrides (``{"runtime.parallel_passes": 1}``) set in
    the applications the rule in the module docstring names."""
    cfg = copy.deepcopy(config)
    for dotted, value in args.items():
        *parents, leaf = dotted.split(".")
        for app in args_targets(cfg, dotted):
            node = app.get("args")
            node = app["args"] = dict(node) if node else {}  # its own: YAML anchors may share one
            for part in parents:
                child = node.get(part)
                if child is not None and not isinstance(child, dict):
                    raise ConfigEditError(f"args.{dotted}: {part!r} of {app.get('name')!r} is no mapping")
                node[part] = dict(child or {})
                node = node[part]
            node[leaf] = value
    return cfg


def with_env(config: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """A copy of ``config`` whose controller and every application get ``env`` on top of the env_vars
    they set: a config's runtime_env wins over the processes' inherited environment."""
    cfg = copy.deepcopy(config)
    if not env:
        return cfg
    for holder in [cfg.setdefault("controller_options", {}), *(cfg.get("applications") or [])]:
        runtime_env = dict(holder.get("runtime_env") or {})  # its own: YAML anchors may share one
        runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), **env}
        holder["runtime_env"] = runtime_env
    return cfg


def _yaml() -> Any:
    from ruamel.yaml import YAML

    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096  # never re-wrap long lines
    yaml.indent(mapping=2, sequence=4, offset=2)
    # Keep ``null`` spelled out (ruamel's default writes nothing after the colon).
    yaml.representer.add_representer(
        type(None), lambda rep, _: rep.represent_scalar("tag:yaml.org,2002:null", "null")
    )
    return yaml


def rewrite_text(
    text: str, values: dict[str, Any], deployment: str = "Inference", app_name: str | None = None
) -> str:
    """``text`` (a Serve config) with the deployment's user_config keys set to ``values``."""
    yaml = _yaml()
    doc = yaml.load(text)
    dep = _deployment(doc, deployment, app_name)
    if dep.get("user_config") is None:
        dep["user_config"] = {}
    for key, value in values.items():
        dep["user_config"][key] = value
    buf = io.StringIO()
    yaml.dump(doc, buf)
    return buf.getvalue()


def write_user_config(
    path: Path, values: dict[str, Any], deployment: str = "Inference", app_name: str | None = None
) -> str:
    """Rewrite ``path`` in place (atomically); returns the new text."""
    new = rewrite_text(path.read_text(), values, deployment, app_name)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(new)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return new
