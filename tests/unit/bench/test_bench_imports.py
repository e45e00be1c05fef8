"""bench/ imports the service only through its public surface (issue 51), listed in bench/README.md.

bench is a top-level tool the wheel does not ship; it talks to a running service over HTTP, and to the
service's code only through the modules and functions listed between the ``public-surface`` markers of
bench/README.md, the one place that list lives. This test parses every ``bench/*.py`` and fails on any
other import of ``deployments``, ``preprocess``, ``postprocess`` or ``contracts``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench"
SERVICE_PACKAGES = ("deployments", "preprocess", "postprocess", "contracts")
BEGIN, END = "<!-- public-surface:begin -->", "<!-- public-surface:end -->"
# bench/gpu_check.py is the prepared accelerator run: it measures the service's own runtime (its runners in
# torch and ONNX Runtime, its ONNX export, the model's group path) in process on a GPU, so it and its
# companion module import the runtime by design.
EXEMPT = {
    "gpu_check.py": "in-process GPU checks of the service's own runtime",
    "gpu_check_service.py": "gpu_check's in-process run of the service's group path on the GPU",
}


def public_surface(readme: Path = BENCH / "README.md") -> list[str]:
    """The first backticked name of each list item between the markers: ``pkg.module`` (the module and
    anything in it), ``pkg.module.name`` (that name only) or ``pkg.sub.*`` (every module under pkg.sub)."""
    text = readme.read_text(encoding="utf-8")
    block = text[text.index(BEGIN) + len(BEGIN) : text.index(END)]
    return re.findall(r"^\s*[-*] `([\w.*]+)`", block, flags=re.MULTILINE)


def _allowed(name: str, surface: list[str]) -> bool:
    for entry in surface:
        if entry.endswith(".*") and name.startswith(entry[:-1]):
            return True
        if name == entry or (name.startswith(entry + ".") and _is_module(entry)):
            return True
    return False


def _is_module(entry: str) -> bool:
    """``entry`` names a module (a .py file or a package) in this checkout, not a function in one."""
    path = BENCH.parent.joinpath(*entry.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def service_imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of each service import in ``path``: ``from m import a`` gives ``m.a``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return sorted((line, name) for line, name in found if name.split(".")[0] in SERVICE_PACKAGES)


def violations(path: Path, surface: list[str]) -> list[str]:
    return [
        f"{path.name}:{line}: {name}" for line, name in service_imports(path) if not _allowed(name, surface)
    ]


def test_the_public_surface_is_listed_and_names_what_exists() -> None:
    surface = public_surface()
    assert surface and all(e.split(".")[0] in SERVICE_PACKAGES for e in surface)
    for entry in surface:
        module = entry[:-2] if entry.endswith(".*") else entry
        if not _is_module(module):  # a name: its module exists and defines it
            parent, _, name = module.rpartition(".")
            assert _is_module(parent), entry
            source = BENCH.parent.joinpath(*parent.split(".")).with_suffix(".py").read_text()
            assert re.search(rf"^(def|class) {name}\b|^{name} =", source, re.MULTILINE), entry


def test_bench_imports_only_the_public_surface() -> None:
    surface = public_surface()
    files = sorted(p for p in BENCH.glob("*.py") if p.name not in EXEMPT)
    assert len(files) > 20
    bad = [v for p in files for v in violations(p, surface)]
    assert not bad, "bench imports service internals (bench/README.md lists what it may use):\n" + "\n".join(
        bad
    )


def test_the_check_catches_internals(tmp_path: Path) -> None:
    surface = ["deployments.config", "deployments.repository.manifest.load_manifest", "deployments.tools.*"]
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from deployments.config import ModelConfig\n"
        "from deployments.repository.manifest import load_manifest, ResolvedModel\n"
        "from deployments.tools import keys\n"
        "from deployments.tools.ports import is_free\n"
        "import deployments.runtime.backends\n"
        "def f():\n"
        "    from preprocess.tokenize import TextTokenizer\n"
        "from bench.results import Point\n"
        "import numpy\n"
    )
    assert violations(probe, surface) == [
        "probe.py:2: deployments.repository.manifest.ResolvedModel",
        "probe.py:5: deployments.runtime.backends",
        "probe.py:7: preprocess.tokenize.TextTokenizer",
    ]


def test_only_the_gpu_check_is_exempt() -> None:
    assert set(EXEMPT) == {"gpu_check.py", "gpu_check_service.py"}
