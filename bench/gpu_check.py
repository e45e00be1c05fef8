"""The accelerator run, prepared: the model in process on a GPU, torch and ONNX Runtime, fp32 and fp16.

A session lent a GPU machine has minutes of it, a bare Python with torch there and nothing to download, so
this is one short script with everything it needs carried along (docs/benchmarks.md "On a GPU"):

    # here: the model (weights stored in fp16, under 64 MiB) and the wheels the device lacks
    python -m bench.gpu_check --pack .bench/gpu-pack --wheels
    # there (device `run`, carry [".bench/gpu-pack"]):
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .bench/gpu-pack/wheels/*.whl \
      && PYTHONPATH=/tmp/site:. python3 -m bench.gpu_check --model-dir .bench/gpu-pack/model --out "$OUT"

Per variant (torch fp32 / fp16 / bf16, ONNX Runtime fp32 / fp16) it measures the in-process rows of
``bench.inprocess`` (b1, b32-sorted, b32-requests) and the lowest cosine of its vectors against torch fp32
on the same device, and writes ``gpu_check.json`` and ``gpu_check.md``. A variant that cannot run there
(ONNX Runtime without its CUDA execution provider, say) is reported with the reason, never dropped.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from bench.corpus import build_corpus
from bench.inprocess import RowPlan, load_model_dir, make_runner, measure_runner
from bench.report import points_table
from bench.results import Point
from bench.systems import min_cosine

# What the GPU machine's Python lacks of what this script imports (it has torch, transformers, tokenizers,
# onnx, onnxruntime and numpy): pydantic and its dependencies, for the project's config and manifests.
WHEELS = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection")
DEVICE_PYTHON = "3.12"
VARIANTS = (("torch", "fp32"), ("torch", "fp16"), ("torch", "bf16"), ("onnx", "fp32"), ("onnx", "fp16"))
PARITY_TEXTS = 64


def _device_info(device: str) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "device": device}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    try:
        import onnxruntime as ort

        info["onnxruntime"] = ort.__version__
        info["ort_providers"] = ort.get_available_providers()
    except ImportError:
        info["onnxruntime"] = None
    return info


def _model_dir_for(backend: str, precision: str, model_dir: Path, work: Path) -> Path:
    """The directory a variant loads: the HF weights for torch, an export made here for ONNX Runtime."""
    if backend == "torch":
        return model_dir
    from deployments.runtime.export_onnx import export

    out = work / f"onnx-{precision}"
    if not (out / "manifest.json").is_file():
        export(model_dir, out, precision=precision)
    return out


def _load(model_dir: Path, precision: str, device: str) -> tuple[Any, Any]:
    """A runner for ``model_dir`` in ``precision`` on ``device``, and the model's tokenizer."""
    from preprocess.tokenize import TextTokenizer

    model = load_model_dir(model_dir, precision)
    return make_runner(model, device), TextTokenizer(model.tokenizer_file, model.manifest.input.max_tokens)


def _vectors(runner: Any, tok: Any, texts: list[str]) -> np.ndarray:
    return runner.run(list(tok.encode(texts, truncate=True).sequences())).values


def run_check(model_dir: Path, out: Path, device: str, warmup_s: float, duration_s: float) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:  # the ONNX exports made on the way
        return _run_variants(model_dir, out, Path(tmp), device, warmup_s, duration_s)


def _run_variants(
    model_dir: Path, out: Path, work: Path, device: str, warmup_s: float, duration_s: float
) -> dict[str, Any]:
    texts = list(build_corpus().texts)
    result: dict[str, Any] = {"machine": _device_info(device), "variants": [], "points": []}
    reference = _vectors(*_load(model_dir, "fp32", device), texts[:PARITY_TEXTS])
    for backend, precision in VARIANTS:
        entry: dict[str, Any] = {"backend": backend, "precision": precision}
        try:
            if backend == "onnx" and device == "cuda":
                import onnxruntime as ort

                if "CUDAExecutionProvider" not in ort.get_available_providers():
                    raise RuntimeError(f"onnxruntime {ort.__version__} here has no CUDA execution provider")
            runner, tok = _load(_model_dir_for(backend, precision, model_dir, work), precision, device)
            entry["cosine_min_vs_torch_fp32"] = min_cosine(
                _vectors(runner, tok, texts[:PARITY_TEXTS]), reference
            )
            plan = RowPlan(warmup_s, duration_s)
            points = measure_runner(f"{backend}-{precision}-{device}", runner, tok, texts, plan)
            result["points"] += [asdict(p) for p in points]
            entry["ran"] = True
        except Exception as exc:  # one variant failing must not hide the others
            entry.update(ran=False, reason=f"{type(exc).__name__}: {exc}")
        print(json.dumps(entry), flush=True)
        result["variants"].append(entry)
    (out / "gpu_check.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / "gpu_check.md").write_text(render(result))
    return result


def render(result: dict[str, Any]) -> str:
    lines = [
        f"Machine: {json.dumps(result['machine'])}",
        "",
        "| variant | ran | cosine min vs torch fp32 | note |",
    ]
    lines.append("|---|---|---|---|")
    for v in result["variants"]:
        cos = v.get("cosine_min_vs_torch_fp32")
        shown = "-" if cos is None else f"{cos:.5f}"
        ran = "yes" if v.get("ran") else "no"
        lines.append(f"| {v['backend']} {v['precision']} | {ran} | {shown} | {v.get('reason', '')} |")
    lines += ["", points_table([Point(**p) for p in result["points"]]), ""]
    return "\n".join(lines)


def pack(dest: Path) -> Path:
    """The default model with its weights stored in fp16 (half the size, so it travels) and a manifest
    whose checksums match the new files; the device run reads it with ``--model-dir dest/model``."""
    from safetensors.torch import load_file, save_file

    from deployments.config import ModelConfig
    from deployments.repository.manifest import sha256_of
    from deployments.repository.resolve import resolve_model

    model = resolve_model(ModelConfig(), hash_files=True)
    target = dest / "model"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(
        model.weights_dir, target, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "onnx*")
    )
    for weights in model.weights_dir.glob("*.safetensors"):
        tensors = load_file(str(weights))
        half = {k: (v.half() if v.is_floating_point() else v) for k, v in tensors.items()}
        save_file({k: v.contiguous() for k, v in half.items()}, str(target / weights.name), {"format": "pt"})
    files = {name: sha256_of(target / name) for name in model.manifest.files if (target / name).is_file()}
    manifest = model.manifest.model_copy(update={"weights": ".", "files": files})
    (target / "manifest.json").write_text(json.dumps(manifest.model_dump(mode="json"), indent=2) + "\n")
    return target


def download_wheels(dest: Path) -> list[Path]:
    """The versions installed here of ``WHEELS``, as x86-64 wheels for the device's Python."""
    import importlib.metadata
    import subprocess

    dest.mkdir(parents=True, exist_ok=True)
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in WHEELS]
    platforms = [f"--platform=manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28)] + [
        "--platform=manylinux2014_x86_64"
    ]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest)]
    cmd += [f"--python-version={DEVICE_PYTHON}", "--implementation=cp", *platforms, *pins]
    subprocess.run(cmd, check=True)
    return sorted(dest.glob("*.whl"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pack", type=Path, help="write the travelling model into this folder and stop")
    parser.add_argument("--wheels", action="store_true", help="with --pack: also the wheels the device lacks")
    parser.add_argument("--model-dir", type=Path, help="model version dir holding manifest.json")
    parser.add_argument("--out", type=Path, default=Path(".bench/gpu-check"))
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--duration", type=float, default=6.0)
    ns = parser.parse_args(argv)
    if ns.pack:
        print(f"packed {pack(ns.pack)}")
        if ns.wheels:
            print("wheels:", *(w.name for w in download_wheels(ns.pack / "wheels")))
        return 0
    if ns.model_dir is None:
        parser.error("--model-dir is required (or --pack)")
    run_check(ns.model_dir, ns.out, ns.device, ns.warmup, ns.duration)
    return 0


if __name__ == "__main__":
    sys.exit(main())
