"""The official openai client works unmodified (it asks for base64 by default)."""

from __future__ import annotations

import numpy as np
import openai
import pytest

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="not-needed", max_retries=0)


@pytest.mark.parametrize("encoding_format", [None, "float"])
def test_openai_embeddings(client, reference_model, encoding_format):
    texts = ["The cat sat on the mat.", "Les chats dorment beaucoup.", "🚀 launch"]
    kwargs = {} if encoding_format is None else {"encoding_format": encoding_format}
    result = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts, **kwargs)
    assert result.model == "all-MiniLM-L6-v2"
    assert [d.index for d in result.data] == [0, 1, 2]
    ours = np.array([d.embedding for d in result.data], dtype=np.float32)
    ref = reference_model.encode(texts, normalize_embeddings=False)
    cos = (ours * ref).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1))
    assert cos.min() >= 0.999
    assert result.usage.prompt_tokens > len(texts)


def test_openai_client_sees_errors(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.embeddings.create(model="gpt-unknown", input="x")
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="all-MiniLM-L6-v2", input="x", dimensions=1000)
