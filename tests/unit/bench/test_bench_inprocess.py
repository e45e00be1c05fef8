"""The in-process rows: how texts are grouped into calls and cut into forward passes, and a real run."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.cli import parse
from bench.corpus import build_corpus
from bench.inprocess import RowPlan, measure_model, rows_for
from bench.inprocess_plan import InprocessSpec, inprocess_specs, served_torch_spec, service_micro_batch
from bench.runner import workload_plan
from deployments.repository.manifest import ResolvedModel

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


def test_micro_batch_limits_come_from_the_measured_service_config(tmp_path: Path) -> None:
    default = parse(["run", "--no-naive"])
    assert service_micro_batch(default) == (32, 256)  # serve_config.yaml as shipped
    text = Path("serve_config.yaml").read_text()
    edited = text.replace("micro_batch_size: 32 ", "micro_batch_size: 8 ").replace(
        "micro_batch_tokens: 256", "micro_batch_tokens: 128"
    )
    assert edited != text
    (tmp_path / "c.yaml").write_text(edited)
    assert service_micro_batch(parse(["run", "--service", f"x={tmp_path / 'c.yaml'}"])) == (8, 128)
    assert service_micro_batch(parse(["run", "--no-service"])) == (32, 512)  # the config defaults


def test_served_torch_settings_get_their_own_in_process_row(tmp_path: Path) -> None:
    shipped = parse(["run", "--no-naive"])  # serve_config.yaml: torch bf16, traced, 2 passes x 1 thread
    spec = served_torch_spec(shipped)
    assert spec == InprocessSpec("torch-bf16-trace", shipped.model_dir, "bf16", "trace", 1, 2)
    text = Path("serve_config.yaml").read_text()
    onnx = text.replace("backend: torch ", "backend: onnx ").replace("precision: bf16 ", "precision: fp32 ")
    assert onnx != text
    (tmp_path / "onnx.yaml").write_text(onnx)
    assert served_torch_spec(parse(["run", "--service", f"x={tmp_path / 'onnx.yaml'}"])) is None
    plain = (
        text.replace("precision: bf16 ", "precision: fp32 ")
        .replace("torch_graph: trace ", "torch_graph: eager ")
        .replace("parallel_passes: 2", "parallel_passes: 1")
        .replace("intra_op_threads: 1 ", "intra_op_threads: null ")
    )
    (tmp_path / "plain.yaml").write_text(plain)
    assert (
        served_torch_spec(parse(["run", "--service", f"x={tmp_path / 'plain.yaml'}"])) is None
    )  # = torch row
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
