"""The retrieval routes on the live service: the official cohere client against the shipped config
(all-MiniLM-L6-v2: rerank by cosine, compact embeddings), token-id inputs, /tokenize; then a router over
locally built demo models (a cross-encoder, a SPLADE model, an embedder with prompts and Matryoshka sizes)
checked against sentence-transformers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import cohere
import httpx
import numpy as np
import pytest
from ray import serve
from transformers import AutoTokenizer

from deployments.repository.manifest import load_manifest
from deployments.tools.demo_models import DEMOS, VERSION, build
from tests.integration.conftest import DEFAULT_MODEL, ROOT, ServeHarness, app_named, model_app, router_app
from tests.integration.matrix import BULK_CLIENTS, LARGEST, fire, passes, rerank_body, rows, texts

pytestmark = pytest.mark.integration

QUERY = "What is the capital of the United States?"
DOCS = [
    "Carson City is the capital city of the American state of Nevada.",
    "The Commonwealth of the Northern Mariana Islands is a group of islands in the Pacific Ocean.",
    "Washington, D.C. is the capital of the United States. It is a federal district.",
    "Capital gains are profits from the sale of an asset such as stocks or real estate.",
]
ROUTE = "/retrieval"
SPECS = {s.task: s for s in DEMOS}


@pytest.fixture(scope="module")
def co(base_url: str) -> cohere.ClientV2:
    return cohere.ClientV2(api_key="not-needed", base_url=base_url)


def test_cohere_rerank_matches_sentence_transformers_cos_sim(co, reference_model):
    from sentence_transformers import util

    result = co.rerank(model=DEFAULT_MODEL, query=QUERY, documents=DOCS)
    want = util.cos_sim(reference_model.encode([QUERY]), reference_model.encode(DOCS)).numpy()[0]
    assert [r.index for r in result.results] == np.argsort(-want).tolist()
    got = {r.index: r.relevance_score for r in result.results}
    np.testing.assert_allclose([got[i] for i in range(len(DOCS))], want, atol=2e-3)
    top = co.rerank(model=DEFAULT_MODEL, query=QUERY, documents=DOCS, top_n=1)
    assert [r.index for r in top.results] == [int(np.argmax(want))]


def test_cohere_embed_types_equal_quantize_embeddings(co, http):
    import base64

    from sentence_transformers.util.quantization import quantize_embeddings

    texts = ["hello world", "a second, longer text about nothing much", "ünïcödé 🚀"]
    types = ["float", "int8", "uint8", "binary", "ubinary"]
    result = co.embed(model=DEFAULT_MODEL, texts=texts, input_type="search_document", embedding_types=types)
    assert np.asarray(result.embeddings.float_).shape == (3, 384)
    # The same vectors unrounded (base64 float32): what quantize_embeddings is given.
    data = http.post("/v1/embeddings", json={"input": texts, "encoding_format": "base64"}).json()["data"]
    floats = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in data])
    np.testing.assert_allclose(np.asarray(result.embeddings.float_), floats, atol=1e-6)
    manifest = load_manifest(ROOT / "models" / DEFAULT_MODEL / "1" / "manifest.json")
    assert manifest.quantization is not None
    ranges = np.asarray(manifest.quantization.ranges, dtype=np.float32)
    for kind in types[1:]:
        want = quantize_embeddings(floats, precision=kind, ranges=ranges)
        np.testing.assert_array_equal(np.asarray(getattr(result.embeddings, kind)), want, err_msg=kind)


def test_a_rerank_of_100_documents_is_batched_not_looped(http):
    inference = serve.get_deployment_handle("Inference", app_name=DEFAULT_MODEL)
    before = inference.batching.remote().result(timeout_s=30)
    docs = [f"document {i}: " + "a sentence of filler words about capitals " * 3 for i in range(100)]
    resp = http.post("/v1/rerank", json={"query": QUERY, "documents": docs, "top_n": 5})
    assert resp.status_code == 200 and len(resp.json()["results"]) == 5
    after = inference.batching.remote().result(timeout_s=30)
    assert after["sequences"] - before["sequences"] == 101  # the query and every document
    assert after["batches"] - before["batches"] <= 4


def test_tei_rerank_shape_and_return_text(http):
    resp = http.post("/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True})
    assert resp.status_code == 200
    body = resp.json()
    assert [r["text"] for r in body] == [DOCS[r["index"]] for r in body]
    assert [r["score"] for r in body] == sorted((r["score"] for r in body), reverse=True)


def test_token_ids_embed_like_their_text_and_tokenize_agrees(http, reference_model):
    hf = AutoTokenizer.from_pretrained(reference_model[0].auto_model.name_or_path)
    ids = hf("hello world", add_special_tokens=False)["input_ids"]
    by_ids = http.post("/v1/embeddings", json={"input": [ids, ids[:1]]}).json()["data"]
    by_text = http.post("/v1/embeddings", json={"input": ["hello world", "hello"]}).json()["data"]
    assert [d["embedding"] for d in by_ids] == [d["embedding"] for d in by_text]
    tokens = http.post("/tokenize", json={"input": "hello world", "return_offsets": True}).json()
    assert tokens["data"][0]["ids"] == hf("hello world")["input_ids"]
    assert tokens["data"][0]["offsets"] == [[0, 0], [0, 5], [6, 11], [0, 0]]
    bad = http.post("/v1/embeddings", json={"input": [[1, 2], [10**6]]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input[1]"


@pytest.fixture(scope="module")
def demos(serve_harness: ServeHarness, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A router at /retrieval over three demo models, served in fp32 (the parity bars are fp32's)."""
    repo = tmp_path_factory.mktemp("retrieval-models")
    template = app_named(serve_harness.base_config, DEFAULT_MODEL)
    apps = []
    for task in ("embed", "rerank", "sparse_embed"):
        spec = SPECS[task]
        build(spec, repo, onnx=False)
        args = {"repository": str(repo), "name": spec.name, "task": task, "precision": "fp32"}
        apps.append(model_app(args, template))
    names = [a["name"] for a in apps]
    router = router_app("retrieval-router", ROUTE, names, app_named(serve_harness.base_config, "textserve"))
    serve_harness.deploy_extra(*apps, router)
    yield f"{serve_harness.url}{ROUTE}"
    serve_harness.remove_extras()


def test_models_list_tasks_and_routes(demos):
    entries = {e["id"]: e for e in httpx.get(f"{demos}/v1/models").json()["data"]}
    assert entries["demo-cross-encoder"]["task"] == "rerank"
    assert entries["demo-cross-encoder"]["routes"] == ["/v1/rerank", "/v2/rerank", "/rerank", "/tokenize"]
    assert entries["demo-splade"]["routes"] == ["/embed_sparse", "/tokenize"]
    embedder = entries["demo-mini-embedder"]
    assert embedder["prompts"] == {"document": "passage: ", "query": "query: "}
    assert embedder["matryoshka_dimensions"] == [64, 128]


def test_cross_encoder_rerank_equals_crossencoder_predict(demos, serve_harness):
    from sentence_transformers import CrossEncoder

    co = cohere.ClientV2(api_key="x", base_url=demos)
    result = co.rerank(model="demo-cross-encoder", query=QUERY, documents=DOCS)
    weights = _model_dir(serve_harness, "demo-cross-encoder")
    want = CrossEncoder(str(weights), device="cpu").predict([(QUERY, d) for d in DOCS])
    got = {r.index: r.relevance_score for r in result.results}
    np.testing.assert_allclose([got[i] for i in range(len(DOCS))], want, atol=1e-4)
    assert [r.index for r in result.results] == np.argsort(-want, kind="stable").tolist()
    raw = httpx.post(
        f"{demos}/rerank",
        json={"query": QUERY, "texts": DOCS, "raw_scores": True, "model": "demo-cross-encoder"},
    )
    logits = {r["index"]: r["score"] for r in raw.json()}
    np.testing.assert_allclose(
        1 / (1 + np.exp(-np.array([logits[i] for i in range(len(DOCS))]))), want, atol=1e-4
    )


def test_sparse_embeddings_equal_splade(demos, serve_harness):
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    resp = httpx.post(f"{demos}/embed_sparse", json={"inputs": DOCS[:2], "model": "demo-splade"})
    assert resp.status_code == 200
    weights = _model_dir(serve_harness, "demo-splade")
    reference = SparseEncoder(modules=[MLMTransformer(str(weights)), SpladePooling("max")], device="cpu")
    want = reference.encode(DOCS[:2], convert_to_tensor=True).to_dense().numpy()
    for row, entries in zip(want, resp.json(), strict=True):
        got = np.zeros_like(row)
        got[[e["index"] for e in entries]] = [e["value"] for e in entries]
        np.testing.assert_allclose(got, row, atol=1e-4)


def test_prompts_by_input_type_equal_encode_prompt_name(demos, serve_harness):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(_model_dir(serve_harness, "demo-mini-embedder")), device="cpu")
    co = cohere.ClientV2(api_key="x", base_url=demos)
    result = co.embed(
        model="demo-mini-embedder", texts=DOCS, input_type="search_query", embedding_types=["float"]
    )
    want = model.encode(DOCS, prompt_name="query")
    np.testing.assert_allclose(np.asarray(result.embeddings.float_), want, atol=1e-5)
    unknown = httpx.post(
        f"{demos}/v1/embeddings", json={"input": "x", "model": "demo-mini-embedder", "prompt_name": "title"}
    )
    assert unknown.status_code == 400 and "'document', 'query'" in unknown.json()["error"]["message"]
    counted = httpx.post(
        f"{demos}/tokenize", json={"input": "x", "model": "demo-mini-embedder", "input_type": "search_query"}
    )
    assert counted.json()["data"][0]["count"] == 5  # [CLS] query : x [SEP]: the prompt's tokens count


def test_matryoshka_sizes_only(demos):
    def embed(dims: int) -> httpx.Response:
        return httpx.post(
            f"{demos}/v1/embeddings", json={"input": "x", "model": "demo-mini-embedder", "dimensions": dims}
        )

    full = np.asarray(embed(256).json()["data"][0]["embedding"])
    short = np.asarray(embed(64).json()["data"][0]["embedding"])
    np.testing.assert_allclose(short, full[:64] / np.linalg.norm(full[:64]), atol=1e-5)
    refused = embed(100)
    assert refused.status_code == 400 and "64, 128, 256" in refused.json()["error"]["message"]


def test_a_route_the_models_task_lacks_is_a_400(demos):
    resp = httpx.post(f"{demos}/v1/embeddings", json={"input": "x", "model": "demo-cross-encoder"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "unsupported_task"
    assert "/v1/rerank" in resp.json()["error"]["message"]


def _model_dir(harness: ServeHarness, name: str) -> Path:
    from ray.serve.context import _get_global_client

    details = _get_global_client().get_serve_details()["applications"][name]
    repository = details["deployed_app_config"]["args"]["model"]["repository"]
    return Path(repository) / name / VERSION


# The traffic matrix's cases for the demo models (tests/integration/test_traffic_matrix.py has the rest):
# the largest request from BULK_CLIENTS clients at once, only answers within the promise.
def test_sparse_embeddings_at_the_largest_request_from_many_clients(demos):
    splade = SPECS["sparse_embed"].name
    body = lambda: {"model": splade, "inputs": texts(LARGEST)}  # noqa: E731
    outcome = asyncio.run(fire(f"{demos}/embed_sparse", body, BULK_CLIENTS, check=rows("", LARGEST)))
    passes(outcome, BULK_CLIENTS)


def test_cross_encoder_rerank_of_the_most_documents_from_many_clients(demos):
    body = lambda: rerank_body(LARGEST) | {"model": SPECS["rerank"].name}  # noqa: E731
    outcome = asyncio.run(fire(f"{demos}/v2/rerank", body, BULK_CLIENTS, check=rows("results", 10)))
    passes(outcome, BULK_CLIENTS)
