"""Generate the KubeRay RayServices, so that a cluster serves exactly what a Serve config serves.

    python -m deployments.tools.k8s_manifest            # print k8s/rayservice.yaml (from serve_config.yaml)
    python -m deployments.tools.k8s_manifest --write    # rewrite k8s/rayservice.yaml
    python -m deployments.tools.k8s_manifest --check    # exit 1 with a unified diff when it is out of date
    python -m deployments.tools.k8s_manifest --write --config examples/multi-model.yaml
                                                        # k8s/rayservice.multi-model.yaml
    python -m deployments.tools.k8s_manifest --check --all   # every committed manifest (GENERATED)

Inputs: ``k8s/rayservice.base.yaml`` (the RayService without ``serveConfigV2``), a Serve config
(``serve_config.yaml`` unless ``--config``) and ``k8s/overlay.yaml`` (the cluster-only differences). The
output is ``k8s/rayservice.yaml`` for serve_config.yaml, ``k8s/rayservice.<config name>.yaml`` for another
(``--out`` to choose). The overlay is merged like a JSON merge patch (RFC 7386: mappings merge recursively,
``null`` removes a key, anything else replaces), except that ``applications`` and their ``deployments`` merge
item by item: an overlay item selects by ``name`` and, for applications, ``import_path`` (shell-style
patterns, all given must match; ``"*"`` is every application, ``"*Inference"`` both Inference and
CandidateInference), and merges into every item it selects. An application item may also select by ``task``,
the model's task (``args.model.task``; a ``build_model`` application that names none has ModelConfig's
default), where a pattern starting with ``!`` selects every other task. Its ``defaults`` mapping fills in only
what the config leaves unset. A selector matching nothing is an error, so a renamed deployment cannot silently
lose its cluster settings; only an application item that selects by ``task`` may match none (a config that
serves no model of that task). YAML anchors and merge keys in the inputs come out resolved: plain YAML.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import sys
from collections.abc import Callable
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import yaml

from deployments.config import PROJECT_ROOT, ModelConfig

SERVE_CONFIG = Path("serve_config.yaml")
MULTI_MODEL_CONFIG = Path("examples/multi-model.yaml")
GENERATE_CONFIG = Path("examples/generate.yaml")
BASE = Path("k8s/rayservice.base.yaml")
OVERLAY = Path("k8s/overlay.yaml")
OUTPUT = Path("k8s/rayservice.yaml")
# The Serve configs whose manifests are committed (``--all``); each one's output is ``output_for(config)``.
GENERATED = (SERVE_CONFIG, MULTI_MODEL_CONFIG, GENERATE_CONFIG)
# Keys of an overlay item that select items (patterns) or fill them in, never values to merge.
SELECTORS = ("name", "import_path", "task")
TASK = "task"
MODEL_APP = "deployments.app:build_model"
DEFAULTS = "defaults"
# Wide enough that no scalar is folded over lines: the file stays diffable line by line.
_WIDTH = 4096

Merge = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]


def output_for(config: Path) -> Path:
    """The manifest made from ``config`` (relative to the project root)."""
    return OUTPUT if config == SERVE_CONFIG else OUTPUT.with_name(f"rayservice.{config.stem}.yaml")


def command_for(config: Path, out: Path | None = None) -> str:
    """The command line that regenerates the manifest of ``config``."""
    cmd = "python -m deployments.tools.k8s_manifest --write"
    if config != SERVE_CONFIG:
        cmd += f" --config {config.as_posix()}"
    if out is not None and out != output_for(config):
        cmd += f" --out {out.as_posix()}"
    return cmd


def deep_merge(base: Any, patch: Any) -> Any:
    """Merge ``patch`` into a copy of ``base``: mappings recursively, ``None`` deletes, the rest replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = copy.deepcopy(base) if isinstance(base, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
            continue
        value = deep_merge(merged.get(key), value)
        if value == {} and key not in merged and patch[key]:
            continue  # a patch that only deletes creates no empty mapping where there was none
        merged[key] = value
    return merged


def fill_in(item: Any, defaults: Any) -> Any:
    """A copy of ``item`` with what ``defaults`` has and ``item`` lacks (mappings recursively)."""
    if not isinstance(item, dict) or not isinstance(defaults, dict):
        return copy.deepcopy(item)
    filled = copy.deepcopy(item)
    for key, value in defaults.items():
        filled[key] = fill_in(filled[key], value) if key in filled else copy.deepcopy(value)
    return filled


def task_of(app: dict[str, Any]) -> str | None:
    """The task of a model application (``args.model.task``, else ModelConfig's default); None for others."""
    model = (app.get("args") or {}).get("model")
    if isinstance(model, dict) and TASK in model:
        return str(model[TASK])
    return str(ModelConfig.model_fields[TASK].default) if app.get("import_path") == MODEL_APP else None


def _matches(value: Any, pattern: str) -> bool:
    if pattern.startswith("!"):
        return value is not None and not fnmatchcase(str(value), pattern[1:])
    return value is not None and fnmatchcase(str(value), pattern)


def selects(patch: dict[str, Any], item: dict[str, Any]) -> bool:
    """Whether the overlay item ``patch`` selects ``item`` (an application or a deployment)."""
    for key in SELECTORS:
        if key in patch:
            value = task_of(item) if key == TASK else item.get(key)
            if not _matches(value, str(patch[key])):
                return False
    return True


def merge_by_name(
    items: list[dict[str, Any]], patches: list[dict[str, Any]], merge: Merge, where: str
) -> list:
    """Merge each patch into every item its selectors (patterns) match; keep the order."""
    merged = copy.deepcopy(items)
    for patch in patches:
        targets = [i for i, item in enumerate(items) if selects(patch, item)]
        if not targets and TASK not in patch:
            wanted = ", ".join(f"{key} {patch[key]!r}" for key in SELECTORS if key in patch) or "nothing"
            raise ValueError(f"overlay selects {wanted} in {where}, which the serve config does not have")
        for i in targets:
            merged[i] = merge(merged[i], patch)
    return merged


def _merge_item(item: dict[str, Any], patch: dict[str, Any], nested: str = "") -> dict[str, Any]:
    own = {k: v for k, v in patch.items() if k not in (*SELECTORS, DEFAULTS, nested)}
    return deep_merge(fill_in(item, patch.get(DEFAULTS) or {}), own)


def _merge_app(app: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    merged = _merge_item(app, patch, "deployments")
    if "deployments" in patch:
        where = f"the deployments of application {app.get('name')!r}"
        merged["deployments"] = merge_by_name(
            merged.get("deployments") or [], patch["deployments"], _merge_item, where
        )
    return merged


def merge_serve_config(serve_config: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """The cluster's Serve config: ``serve_config`` with ``overlay`` merged in (inputs are not modified)."""
    merged = deep_merge(serve_config, {k: v for k, v in overlay.items() if k != "applications"})
    if "applications" in overlay:
        merged["applications"] = merge_by_name(
            serve_config.get("applications") or [], overlay["applications"], _merge_app, "applications"
        )
    return merged


class _Dumper(yaml.SafeDumper):
    """Plain YAML: multi-line strings as literal blocks (``|``, the form KubeRay's samples give
    serveConfigV2), and no anchors or aliases even where the inputs' anchors left one object in two places."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def _dump(data: dict[str, Any]) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=_WIDTH, allow_unicode=True)


def header(config: Path, out: Path | None = None) -> str:
    return (
        f"# GENERATED by `{command_for(config, out)}`\n"
        f"# from {BASE.as_posix()}, {config.as_posix()} and {OVERLAY.as_posix()}.\n"
        "# Edit those, not this file: a unit test fails when it drifts.\n"
    )


def render_rayservice(
    serve_config: dict[str, Any], base: dict[str, Any], overlay: dict[str, Any], head: str = ""
) -> str:
    """The RayService to apply: ``base`` with the merged Serve config as its ``serveConfigV2`` string."""
    if base.get("kind") != "RayService" or not isinstance(base.get("spec"), dict):
        raise ValueError("the base manifest must be a RayService with a spec")
    if "serveConfigV2" in base["spec"]:
        raise ValueError("the base manifest must not set serveConfigV2: it is generated from a serve config")
    # KubeRay takes the Serve config as one YAML string, not as structured fields.
    serve_text = _dump(merge_serve_config(serve_config, overlay))
    doc = copy.deepcopy(base)
    doc["spec"] = {"serveConfigV2": serve_text, **doc["spec"]}
    return head + _dump(doc)


def load_yaml(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a YAML mapping")
    return data


def render_files(root: Path, config: Path = SERVE_CONFIG, out: Path | None = None) -> str:
    """``render_rayservice`` of the files under ``root`` (the project root), ``config`` relative to it."""
    serve = load_yaml(root / config)
    return render_rayservice(serve, load_yaml(root / BASE), load_yaml(root / OVERLAY), header(config, out))


def _relative(path: Path, root: Path) -> Path:
    """``path`` as the header and the output name see it: relative to ``root`` where it lies inside."""
    try:
        return path.resolve().relative_to(root.resolve()) if path.is_absolute() else path
    except ValueError:
        return path


def _check(root: Path, config: Path, out: Path, rendered: str) -> bool:
    target = root / out
    current = target.read_text(encoding="utf-8") if target.exists() else ""
    if current == rendered:
        return True
    diff = difflib.unified_diff(
        current.splitlines(keepends=True), rendered.splitlines(keepends=True), out.as_posix(), "generated"
    )
    sys.stdout.writelines(diff)
    print(f"\n{out.as_posix()} is out of date: run {command_for(config, out)}", file=sys.stderr)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the manifest")
    mode.add_argument("--check", action="store_true", help="exit 1 with a diff when the manifest is stale")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--config", type=Path, default=SERVE_CONFIG, help=f"default {SERVE_CONFIG}")
    which.add_argument(
        "--all", action="store_true", help=f"every committed manifest: {', '.join(map(str, GENERATED))}"
    )
    parser.add_argument("--out", type=Path, help="manifest (default k8s/rayservice[.<config name>].yaml)")
    parser.add_argument("--root", type=Path, default=PROJECT_ROOT, help="project root (default: this one)")
    ns = parser.parse_args(argv)
    if ns.all and ns.out is not None:
        parser.error("--out names one manifest: not with --all")
    if ns.all and not (ns.write or ns.check):
        parser.error("--all needs --write or --check")
    configs = list(GENERATED) if ns.all else [_relative(ns.config, ns.root)]
    ok = True
    for config in configs:
        out = _relative(ns.out, ns.root) if ns.out is not None else output_for(config)
        try:
            rendered = render_files(ns.root, config, out)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            print(f"error: {config}: {exc}", file=sys.stderr)
            return 2
        if ns.write:
            (ns.root / out).write_text(rendered, encoding="utf-8")
            print(f"wrote {out.as_posix()}")
        elif ns.check:
            ok = _check(ns.root, config, out, rendered) and ok
        else:
            sys.stdout.write(rendered)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
