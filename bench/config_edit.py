"""Read and change a deployment's ``user_config`` in a Serve config, in memory or in the file itself.

The file is rewritten with ruamel.yaml's round-trip mode, so comments, key order and the rest of
the file survive; only the named deployment's ``user_config`` keys change.
"""

from __future__ import annotations

import copy
import io
import os
import tempfile
from pathlib import Path
from typing import Any

BUILDER = "deployments.app:build_app"


class ConfigEditError(ValueError):
    pass


def find_app(config: Any, app_name: str | None) -> Any:
    """The named application, or the first one built by this project's builder."""
    apps = config.get("applications") or []
    for app in apps:
        if app_name is not None and app.get("name") == app_name:
            return app
        if app_name is None and app.get("import_path") == BUILDER:
            return app
    names = [a.get("name") for a in apps]
    raise ConfigEditError(f"no application {app_name or 'built by ' + BUILDER} in the config (apps: {names})")


def find_deployment(app: Any, deployment: str) -> Any:
    for dep in app.get("deployments") or []:
        if dep.get("name") == deployment:
            return dep
    raise ConfigEditError(f"application {app.get('name')!r} lists no deployment {deployment!r}")


def user_config_of(config: Any, deployment: str = "Inference", app_name: str | None = None) -> dict[str, Any]:
    return dict(find_deployment(find_app(config, app_name), deployment).get("user_config") or {})


def with_user_config(
    config: dict[str, Any], values: dict[str, Any], deployment: str = "Inference", app_name: str | None = None
) -> dict[str, Any]:
    """A deep copy of ``config`` whose deployment's user_config has ``values`` merged in."""
    out = copy.deepcopy(config)
    dep = find_deployment(find_app(out, app_name), deployment)
    dep["user_config"] = {**(dep.get("user_config") or {}), **values}
    return out


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
    dep = find_deployment(find_app(doc, app_name), deployment)
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
