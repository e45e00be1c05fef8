"""The prepared accelerator run, exercised end to end on the CPU: what travels, and what comes back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu_check import VARIANTS, main, pack
from deployments.repository.manifest import load_manifest, weights_dir_of
from deployments.repository.weights_check import check_weights

TRAVEL_LIMIT = 64 * 2**20  # what the device tool carries per call


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, default_model) -> Path:
    return pack(tmp_path_factory.mktemp("gpu-pack"))


def test_pack_fits_the_carry_limit_and_checks_out(packed: Path, default_model) -> None:
    size = sum(f.stat().st_size for f in packed.rglob("*") if f.is_file())
    assert size < TRAVEL_LIMIT
    original = sum(f.stat().st_size for f in default_model.weights_dir.glob("*.safetensors"))
    assert sum(f.stat().st_size for f in packed.glob("*.safetensors")) < 0.6 * original
    manifest = load_manifest(packed / "manifest.json")
    assert manifest.weights == "." and manifest.name == default_model.manifest.name
    check_weights(manifest, weights_dir_of(manifest, packed / "manifest.json"), packed, hash_files=True)


def test_every_variant_is_measured_or_explained(packed: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert (
        main(
            [
                "--model-dir",
                str(packed),
                "--out",
                str(out),
                "--device",
                "cpu",
                "--warmup",
                "0",
                "--duration",
                "0.2",
            ]
        )
        == 0
    )
    result = json.loads((out / "gpu_check.json").read_text())
    assert [(v["backend"], v["precision"]) for v in result["variants"]] == list(VARIANTS)
    ran = [v for v in result["variants"] if v["ran"]]
    assert len(ran) == len(VARIANTS)  # on a CPU every variant can run
    assert all(v["cosine_min_vs_torch_fp32"] >= 0.999 for v in ran)
    systems = {p["system"] for p in result["points"]}
    assert systems == {f"inprocess-{b}-{p}-cpu" for b, p in VARIANTS}
    assert {p["workload"] for p in result["points"]} == {"b1", "b32-sorted", "b32-requests"}
    table = (out / "gpu_check.md").read_text()
    assert "| onnx fp16 | yes |" in table and "inprocess-torch-bf16-cpu" in table
    assert sorted(f.name for f in out.iterdir()) == ["gpu_check.json", "gpu_check.md"]  # what comes back
