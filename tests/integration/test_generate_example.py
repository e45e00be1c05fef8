"""examples/generate.yaml as a user runs it (`serve run`, its own local Ray; tests/integration/examples.py):
a demo causal LM streams chat completions to the official openai client beside the default embedder."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from openai import OpenAI

from tests.integration.conftest import ROOT
from tests.integration.examples import serve_example

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

EXAMPLE = ROOT / "examples" / "generate.yaml"
MODELS = ["all-MiniLM-L6-v2", "demo-gpt2-lm"]


@pytest.fixture(scope="module")
def example_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serve_example(EXAMPLE, MODELS, tmp_path_factory.mktemp("generate-example")) as url:
        yield url


def test_the_openai_client_streams_chat_completions(example_url: str) -> None:
    client = OpenAI(base_url=f"{example_url}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model="demo-gpt2-lm",
        messages=[{"role": "user", "content": "Write a line about the sea."}],
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text and finishes in (["length"], ["stop"])
    assert chunks[-1].usage is not None and 1 <= chunks[-1].usage.completion_tokens <= 16
    completion = client.completions.create(model="demo-gpt2-lm", prompt="The sea", max_tokens=8)
    assert completion.choices[0].text and completion.usage.completion_tokens <= 8


def test_the_embedder_answers_beside_it(example_url: str) -> None:
    client = OpenAI(base_url=f"{example_url}/v1", api_key="unused", max_retries=0)
    answer = client.embeddings.create(model="all-MiniLM-L6-v2", input="still here")
    assert answer.model == "all-MiniLM-L6-v2" and len(answer.data[0].embedding) == 384
    listed = {m["id"]: m for m in httpx.get(f"{example_url}/v1/models", timeout=10).json()["data"]}
    assert listed["demo-gpt2-lm"]["task"] == "generate"
