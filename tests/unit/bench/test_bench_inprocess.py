"""The in-process rows: how texts are grouped into calls and cut into forward passes, and a real run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.cli import Options, parse
from bench.embedder import plan_passes
from bench.inprocess import RowPlan, default_micro_batch, measure_model, rows_for
from bench.inprocess_plan import InprocessSpec, inprocess_specs, served_torch_spec, service_micro_batch
from bench.runner import workload_plan
from deployments.config import RuntimeConfig
from deployments.repository.manifest import ResolvedModel
from deployments.tools.corpus import build_corpus
from deployments.user_config import BatchingConfig

TEXTS = [f"text {i} " + "word " * (i % 7) for i in range(70)]
LENGTHS = [3 + (i % 7) for i in range(70)]


def test_rows_group_texts_as_described() -> None:
    b1, sorted32, requests = rows_for(TEXTS, LENGTHS, 256, seed=0, request_texts=32, micro_batch=(16, 384))
    assert b1.workload == "b1" and sorted(t for [t] in b1.groups) == sorted(TEXTS)
    assert (b1.pass_sequences, b1.pass_tokens) == (1, 256)
    # The limit: the whole corpus sorted by length, groups of 32, one pass per group.
    assert sorted32.workload == "b32-sorted" and (sorted32.pass_sequences, sorted32.pass_tokens) == (
        32,
        32 * 256,
    )
    assert [len(g) for g in sorted32.groups] == [32, 32]
    spans = sorted(
        (min(LENGTHS[TEXTS.index(t)] for t in g), max(LENGTHS[TEXTS.index(t)] for t in g))
        for g in sorted32.groups
    )
    assert spans[0][1] <= spans[1][0]  # one group holds the shortest texts, the other the longest
    # W2's own requests: consecutive groups in corpus order, cut as the service cuts passes.
    assert requests.workload == "b32-requests"
    assert requests.groups == [TEXTS[:32], TEXTS[32:64]]
    assert (requests.pass_sequences, requests.pass_tokens) == (16, 384)


def test_request_row_holds_exactly_what_the_w2_client_sends() -> None:
    corpus = build_corpus(0, 200)
    opts = parse(["run", "--quick", "--no-naive", "--w2-texts", "16"])
    w2 = [groups for workload, groups, _ in workload_plan(opts, corpus) if workload == "W2"]
    lengths = [1] * len(corpus.texts)
    row = rows_for(list(corpus.texts), lengths, 256, 0, opts.w2_texts, (32, 512))[2]
    assert w2 and row.groups == w2[0] and row.workload == "b16-requests"


def test_a_plan_without_the_services_limits_uses_the_codes() -> None:
    defaults = BatchingConfig()
    assert RowPlan(0.0, 1.0).micro_batch == default_micro_batch()
    assert default_micro_batch() == (defaults.micro_batch_size, defaults.micro_batch_tokens)


def _shipped() -> dict[str, Any]:
    return yaml.safe_load(Path("serve_config.yaml").read_text())


def _model_app(config: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    return next(
        a
        for a in config["applications"]
        if a["import_path"] == "deployments.app:build_model" and name in (None, a["name"])
    )


def _inference(app: dict[str, Any]) -> dict[str, Any]:
    return next(d for d in app["deployments"] if d["name"] == "Inference")


def _service(tmp_path: Path, config: dict[str, Any], name: str, extra: str = "") -> Options:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return parse(["run", "--service", f"x={path}{extra}"])


def test_micro_batch_limits_come_from_the_measured_service_config(tmp_path: Path) -> None:
    defaults = BatchingConfig()
    code = (defaults.micro_batch_size, defaults.micro_batch_tokens)
    assert code == (32, 256)
    # serve_config.yaml as shipped writes no micro-batch limits: the code's defaults.
    assert "user_config" not in _inference(_model_app(_shipped()))
    assert service_micro_batch(parse(["run", "--no-naive"])) == code
    # Written in the model application's Inference user_config (the router, listed first, has none).
    config = _shipped()
    _inference(_model_app(config))["user_config"] = {"micro_batch_size": 8, "micro_batch_tokens": 128}
    assert service_micro_batch(_service(tmp_path, config, "both")) == (8, 128)
    _inference(_model_app(config))["user_config"] = {"micro_batch_size": 8}
    assert service_micro_batch(_service(tmp_path, config, "size")) == (8, 256)  # tokens from the code
    assert service_micro_batch(parse(["run", "--no-service"])) == code


def test_the_default_models_application_is_the_one_measured(tmp_path: Path) -> None:
    config = yaml.safe_load(Path("examples/multi-model.yaml").read_text())
    router = next(a for a in config["applications"] if a["import_path"] == "deployments.app:build_router")
    router["args"]["default_model"] = "demo-mini-embedder"  # not the first model application
    mini = _model_app(config, "demo-mini-embedder")
    _inference(mini)["user_config"] = {"micro_batch_size": 4}
    mini["args"]["runtime"] = {"torch_graph": "eager", "parallel_passes": 3}
    opts = _service(tmp_path, config, "multi")
    assert service_micro_batch(opts) == (4, 256)
    assert served_torch_spec(opts) == InprocessSpec("torch-fp32-eager", opts.model_dir, "fp32", "eager", 1, 3)


def test_served_torch_settings_get_their_own_in_process_row(tmp_path: Path) -> None:
    # serve_config.yaml: torch bf16 written; traced, 2 passes x 1 thread from the code's RuntimeConfig.
    assert "runtime" not in _model_app(_shipped())["args"]
    runtime = RuntimeConfig()
    assert (runtime.torch_graph, runtime.intra_op_threads, runtime.parallel_passes) == ("trace", 1, 2)
    shipped = parse(["run", "--no-naive"])
    spec = served_torch_spec(shipped)
    assert spec == InprocessSpec("torch-bf16-trace", shipped.model_dir, "bf16", "trace", 1, 2)
    onnx = _shipped()
    _model_app(onnx)["args"]["model"].update(backend="onnx", precision="fp32")
    assert served_torch_spec(_service(tmp_path, onnx, "onnx")) is None
    plain = _shipped()
    _model_app(plain)["args"]["model"]["precision"] = "fp32"
    _model_app(plain)["args"]["runtime"] = {
        "torch_graph": "eager",
        "parallel_passes": 1,
        "intra_op_threads": None,
    }
    assert served_torch_spec(_service(tmp_path, plain, "plain")) is None  # = torch row
    # A variant's args edits reach the model application, as the service run applies them.
    edited = served_torch_spec(
        parse(["run", "--service", "x=serve_config.yaml,args.runtime.parallel_passes=1"])
    )
    assert edited == InprocessSpec("torch-bf16-trace", shipped.model_dir, "bf16", "trace", 1, 1)
    assert served_torch_spec(parse(["run", "--no-service"])) is None
    labels = [s.label for s in inprocess_specs(parse(["run", "--no-naive", "--no-onnx"]), None, tmp_path)]
    assert labels == ["torch", "torch-bf16-trace"]


def test_three_rows_measured_on_the_real_model(onnx_model: ResolvedModel) -> None:
    texts = list(build_corpus(0, 80).texts)
    model_dir = onnx_model.manifest_path.parent
    plan = RowPlan(0.0, 0.3, seed=0, request_texts=8, micro_batch=(4, 128))
    points = measure_model("onnx", model_dir, texts, plan)
    assert [p.workload for p in points] == ["b1", "b32-sorted", "b8-requests"]
    assert all(p.system == "inprocess-onnx" and p.requests > 0 and p.errors == 0 for p in points)
    assert [p.texts_per_request for p in points] == [1, 32, 8]
    assert all(p.seq_per_s == pytest.approx(p.req_per_s * p.texts_per_request, rel=0.05) for p in points)


def test_passes_are_length_sorted_within_the_limits() -> None:
    lengths = [10, 3, 7, 3, 50, 9]
    passes = plan_passes(lengths, max_sequences=2, max_tokens=20)
    assert sorted(i for p in passes for i in p) == list(range(6))  # every text, once
    assert all(len(p) <= 2 and (len(p) == 1 or max(lengths[i] for i in p) * len(p) <= 20) for p in passes)
    assert [lengths[p[0]] for p in passes] == sorted(lengths[p[0]] for p in passes)
    assert [4] in passes  # longer than the token budget: alone
    assert len(plan_passes([5] * 8, 32, 10_000, at_least=2)) == 2  # parallel passes get a share each
