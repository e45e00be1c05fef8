"""The layers point one way (docs/architecture.md, "Layers"), checked on the source: every import of every
module, read with ``ast`` (imports under ``if TYPE_CHECKING:`` are annotations only and not counted)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# package (folder) -> module prefixes it must never import
_WEB = ("ray", "fastapi", "starlette")
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "contracts": ("deployments", "preprocess", "postprocess", "bench", "torch", *_WEB),
    "preprocess": ("deployments", "bench", *_WEB),
    "postprocess": ("deployments", "bench", *_WEB),
    "deployments/runtime": ("deployments.pipeline", "deployments.ingress", "deployments.tools", "bench"),
    "deployments/repository": (
        "deployments.runtime",
        "deployments.pipeline",
        "deployments.ingress",
        "deployments.tools",
        "bench",
    ),
    "deployments": ("bench",),
}


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        test = node.test if isinstance(node, ast.If) else None
        if test is not None and "TYPE_CHECKING" in ast.unparse(test):
            skipped.update(id(n) for n in ast.walk(node))
    names: list[str] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _violations(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for name in _imports(path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                found.append(f"{path.relative_to(ROOT)} imports {name}")
    return found


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_no_layer_imports_one_above_it(folder: str) -> None:
    assert (ROOT / folder).is_dir()
    assert _violations(folder, FORBIDDEN[folder]) == []


def test_the_check_sees_a_wrong_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from typing import TYPE_CHECKING\nimport ray\nif TYPE_CHECKING:\n    import fastapi\n")
    assert _imports(module) == ["typing", "ray"]
