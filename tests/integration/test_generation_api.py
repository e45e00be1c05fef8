"""Task generate on the live service: two demo causal LMs (GPT-2 and Llama, random weights, built by
.ci/setup) behind a router of their own, through the official openai client and plain HTTP.

Greedy output over HTTP, for a concurrent mix of prompts and lengths, is token for token what
``model.generate(do_sample=False)`` gives each prompt alone; seeded sampling repeats; stop strings cut
across token boundaries; a client that leaves mid-stream leaves the batch within one decode step; the
deadline ends a stream with ``finish_reason: length``; a full queue answers 503 with Retry-After.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import torch
from openai import OpenAI
from ray import serve
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.integration.conftest import ROOT, ServeHarness, app_named, quick_draining, router_app
from tests.integration.test_metrics import metrics_ports, scrape

pytestmark = pytest.mark.integration

ROUTE = "/gen"
GPT2, LLAMA = "test-gpt2-lm", "test-llama-lm"
SOURCES = {GPT2: "demo-gpt2-lm", LLAMA: "demo-llama-lm"}
TIGHT = "test-gpt2-tight"  # one running, one waiting: the third request is refused
LIMITS = {"max_running": 8, "kv_cache_tokens": 8192, "prefill_chunk_tokens": 32, "max_tokens_cap": 400}


def _app(name: str, source: str, template: dict[str, Any], generation: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "route_prefix": None,
        "import_path": "deployments.app:build_model",
        "runtime_env": quick_draining(template["runtime_env"]),  # as every test app (conftest.py)
        "args": {
            "model": {
                "name": source,
                "version": "1",
                "task": "generate",
                "repository": str(ROOT / "models"),
            },
            "generation": generation,
        },
        "deployments": [{"name": "Model", "num_replicas": 1, "ray_actor_options": {"num_cpus": 0.25}}],
    }


@pytest.fixture(scope="module")
def gen_url(serve_harness: ServeHarness) -> Iterator[str]:
    router = app_named(serve_harness.base_config, "textserve")
    apps = [_app(name, source, router, LIMITS) for name, source in SOURCES.items()]
    apps.append(
        _app(TIGHT, "demo-gpt2-lm", router, {"max_running": 1, "max_waiting": 1, "max_tokens_cap": 400})
    )
    names = [a["name"] for a in apps]
    serve_harness.deploy_extra(*apps, router_app("gen-router", ROUTE, names, router))
    yield serve_harness.url + ROUTE
    serve_harness.remove_extras()


@pytest.fixture(scope="module")
def client(gen_url: str) -> OpenAI:
    return OpenAI(base_url=f"{gen_url}/v1", api_key="unused", max_retries=0)


def _reference(source: str) -> tuple[Any, Any]:
    path = ROOT / "models" / source / "1"
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def _stats(app: str) -> dict[str, Any]:
    return serve.get_deployment_handle("Model", app_name=app).stats.remote().result(timeout_s=10)


@pytest.mark.parametrize("app", [GPT2, LLAMA])
def test_greedy_output_in_a_concurrent_mix_equals_generate_alone(client: OpenAI, app: str) -> None:
    model, tokenizer = _reference(SOURCES[app])
    gen = torch.Generator().manual_seed(5)
    cases = []
    for i in range(10):
        length = int(torch.randint(1, 90, (1,), generator=gen))
        prompt = torch.randint(5, tokenizer.vocab_size, (length,), generator=gen).tolist()
        cases.append((prompt, 5 + 7 * i))

    def ask(case: tuple[list[int], int]) -> Any:
        prompt, n = case
        return client.completions.create(model=app, prompt=prompt, max_tokens=n, temperature=0)

    with ThreadPoolExecutor(len(cases)) as pool:
        answers = list(pool.map(ask, cases))
    for (prompt, n), answer in zip(cases, answers, strict=True):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
        new = out[0, len(prompt) :].tolist()
        assert answer.usage.completion_tokens == len(new)
        assert answer.choices[0].text == tokenizer.decode(new, skip_special_tokens=True), (prompt, n)
        eos = model.generation_config.eos_token_id
        assert answer.choices[0].finish_reason == ("stop" if new[-1] == eos else "length")


def test_the_openai_client_streams_chat_with_usage(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model=LLAMA,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}],
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    usage = chunks[-1].usage
    whole = client.chat.completions.create(
        model=LLAMA,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}],
        max_tokens=24,
        temperature=0,
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert text == whole.choices[0].message.content and finish == [whole.choices[0].finish_reason]
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens > 10  # the chat template's tokens too


def test_seeded_sampling_repeats_and_other_seeds_differ(client: OpenAI) -> None:
    def ask(seed: int) -> str:
        answer = client.completions.create(
            model=GPT2, prompt="Once upon a time", max_tokens=40, temperature=0.9, top_p=0.95, seed=seed
        )
        return answer.choices[0].text

    with ThreadPoolExecutor(4) as pool:  # the same seed alone and beside other requests
        first, again, other, third = pool.map(ask, [11, 11, 12, 11])
    assert first == again == third
    assert other != first


def test_a_stop_string_across_tokens_cuts_the_text(client: OpenAI) -> None:
    full = client.completions.create(model=GPT2, prompt="The answer is", max_tokens=40, temperature=0)
    text = full.choices[0].text
    assert len(text) > 20
    stop = text[10:16]  # six characters: over a token boundary in this vocabulary
    cut = client.completions.create(
        model=GPT2, prompt="The answer is", max_tokens=40, temperature=0, stop=[stop]
    )
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model=GPT2, prompt="The answer is", max_tokens=40, temperature=0, stop=stop, stream=True
    )
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks) == text[: text.index(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_client_that_leaves_mid_stream_leaves_the_batch_within_a_step(gen_url: str) -> None:
    before = _stats(GPT2)
    body = {
        "model": GPT2,
        "prompt": "Tell me everything",
        "max_tokens": 400,
        "temperature": 0,
        "stream": True,
    }
    with (
        httpx.Client(timeout=30) as http,
        http.stream("POST", f"{gen_url}/v1/completions", json=body) as resp,
    ):
        assert resp.status_code == 200
        lines = resp.iter_lines()
        got = [line for line, _ in zip(lines, range(6), strict=False) if line.startswith("data:")]
        assert got and _stats(GPT2)["running"] >= 1
    # The connection is closed: the generation must leave the batch and free its cache.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        after = _stats(GPT2)
        if after["cancelled"] > before["cancelled"] and after["running"] == 0:
            break
        time.sleep(0.05)
    assert after["cancelled"] == before["cancelled"] + 1, after
    assert after["running"] == 0 and after["kv_slots_used"] == 0, after
    assert after["max_cancel_lag_steps"] <= 1, after
    assert after["steps"] - before["steps"] < 400  # it did not run to max_tokens


def test_the_deadline_ends_a_stream_with_finish_length(gen_url: str) -> None:
    body = {"model": GPT2, "prompt": "x", "max_tokens": 400, "temperature": 0, "stream": True}
    headers = {"X-Request-Timeout": "0.3"}
    start = time.monotonic()
    with httpx.Client(timeout=30) as http:
        resp = http.post(f"{gen_url}/v1/completions", json=body, headers=headers)
        whole = http.post(f"{gen_url}/v1/completions", json={**body, "stream": False}, headers=headers)
    assert time.monotonic() - start < 5
    events = [line[6:] for line in resp.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert '"finish_reason":"length"' in events[-2]
    assert whole.status_code == 200, whole.text
    assert whole.json()["choices"][0]["finish_reason"] == "length"
    assert whole.json()["usage"]["completion_tokens"] < 400


def test_a_full_queue_answers_503_with_retry_after(gen_url: str) -> None:
    body = {"model": TIGHT, "prompt": "Go on", "max_tokens": 400, "temperature": 0}

    def send(_: int) -> httpx.Response:
        return httpx.post(f"{gen_url}/v1/completions", json=body, timeout=60)

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(send, range(4)))
    codes = sorted(a.status_code for a in answers)
    assert codes[0] == 200 and codes[-1] == 503, codes
    refused = next(a for a in answers if a.status_code == 503)
    assert refused.headers["Retry-After"] and refused.json()["error"]["code"] == "overloaded"


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/v1/completions", {"model": GPT2, "prompt": "x", "n": 2}, 400, "invalid_request"),
        ("/v1/completions", {"model": GPT2, "prompt": "x", "max_tokens": 401}, 400, "invalid_request"),
        ("/v1/completions", {"model": GPT2, "prompt": "word " * 600}, 400, "input_too_long"),
        ("/v1/chat/completions", {"model": GPT2, "messages": []}, 400, "invalid_request"),
        ("/v1/completions", {"model": GPT2, "prompt": [999999]}, 400, "invalid_request"),
        ("/v1/embeddings", {"model": GPT2, "input": "x"}, 400, "unsupported_task"),
        ("/v1/completions", {"model": "gpt-4", "prompt": "x"}, 404, "model_not_found"),
    ],
)
def test_bad_generation_requests_get_a_clear_4xx(
    gen_url: str, path: str, body: dict[str, Any], status: int, code: str
) -> None:
    resp = httpx.post(f"{gen_url}{path}", json=body, timeout=30)
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["code"] == code


def test_models_lists_the_generate_task_and_its_routes(gen_url: str) -> None:
    listed = {m["id"]: m for m in httpx.get(f"{gen_url}/v1/models", timeout=10).json()["data"]}
    entry = listed[GPT2]
    assert entry["task"] == "generate" and entry["max_tokens"] == 512
    assert entry["routes"] == ["/v1/completions", "/v1/chat/completions"]
    limits = entry["limits"]
    assert limits["max_context_tokens"] == 512 and limits["truncation"] == "none"
    assert limits["max_new_tokens"] == LIMITS["max_tokens_cap"]  # the app's generation setting


def test_generation_metrics_reach_prometheus(client: OpenAI) -> None:
    client.completions.create(model=GPT2, prompt="metrics", max_tokens=8, temperature=0)
    wanted = {
        "ray_generate_time_to_first_token_ms_bucket",
        "ray_generate_inter_token_latency_ms_bucket",
        "ray_generate_output_tokens_total",
        "ray_generate_running_sequences",
        "ray_generate_kv_cache_blocks_free",
    }
    deadline = time.monotonic() + 40
    names: set[str] = set()
    while time.monotonic() < deadline and not wanted <= names:
        names = scrape(metrics_ports()).names
        time.sleep(2)
    assert wanted <= names, wanted - names
