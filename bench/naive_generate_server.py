"""The generation endpoint a user would write instead of this service: FastAPI + uvicorn + ``model.generate``.

    python -m bench.naive_generate_server --port 8123 --model-dir .bench/models/bench-gpt2-small/1

``POST /v1/chat/completions`` in the OpenAI shape: the model's chat template, greedy or sampled
``model.generate``, one request at a time (an asyncio lock; the generation runs on one worker thread, the
model's, so the event loop still answers ``/healthz`` and notices clients that left). No streaming of tokens:
with ``stream: true`` the whole answer goes out as one content chunk once it is generated, then a chunk with
``finish_reason`` and ``usage``, then ``data: [DONE]``. A request whose client left while it queued is
skipped; ``GET /v1/models`` lists the model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def load(model_dir: Path, precision: str = "fp32") -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=DTYPES[precision]).eval()
    return tokenizer, model


@torch.inference_mode()
def generate(
    tokenizer: Any,
    model: Any,
    messages: list[dict[str, str]],
    max_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
) -> tuple[str, int, int, str]:
    """(text, prompt tokens, completion tokens, finish reason) of one chat completion."""
    enc = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    sample = temperature > 0
    out = model.generate(
        **enc,
        max_new_tokens=max_tokens,
        do_sample=sample,
        temperature=temperature if sample else None,
        top_p=top_p if sample else None,
        pad_token_id=model.generation_config.pad_token_id,
    )
    new = out[0, enc["input_ids"].shape[1] :].tolist()
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    finish = "length"
    if new and new[-1] in eos_ids:
        new, finish = new[:-1], "stop"
    text = tokenizer.decode(new, skip_special_tokens=True)
    return text, int(enc["input_ids"].shape[1]), len(new), finish


def _chunk(
    cid: str,
    model: str,
    delta: dict[str, Any],
    finish: str | None = None,
    usage: dict[str, int] | None = None,
) -> str:
    body: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        body["usage"] = usage
    return f"data: {json.dumps(body)}\n\n"


def sse_events(
    cid: str, model: str, text: str, finish: str, usage: dict[str, int], include_usage: bool
) -> Iterator[str]:
    yield _chunk(cid, model, {"role": "assistant", "content": text})
    yield _chunk(cid, model, {}, finish, usage if include_usage else None)
    yield "data: [DONE]\n\n"


def create_app(model_dir: Path, model_name: str, precision: str = "fp32") -> Any:
    from fastapi import FastAPI

    # Every torch call (load, warm-up, each generation) on this one thread: a second thread holding an OpenMP
    # pool would make libgomp's workers sleep between operators.
    torch_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate")
    tokenizer, model = torch_thread.submit(load, model_dir, precision).result()
    torch_thread.submit(generate, tokenizer, model, [{"role": "user", "content": "warm-up"}], 4).result()
    lock = asyncio.Lock()
    app = FastAPI()

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ready"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "naive"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise HTTPException(400, "messages must be a non-empty list")
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        temperature = float(body.get("temperature") or 0.0)
        top_p = float(body.get("top_p") or 1.0)
        async with lock:
            if await request.is_disconnected():
                raise HTTPException(499, "client left while queued")
            text, prompt_tokens, completion_tokens, finish = await asyncio.get_running_loop().run_in_executor(
                torch_thread, generate, tokenizer, model, messages, max_tokens, temperature, top_p
            )
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        if body.get("stream"):
            include = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(
                sse_events(cid, model_name, text, finish, usage, include), media_type="text/event-stream"
            )
        return JSONResponse(
            {
                "id": cid,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model_name,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                ],
                "usage": usage,
            }
        )

    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--model-name", default="bench-gpt2-small")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ns = parser.parse_args(argv)
    app = create_app(ns.model_dir, ns.model_name, ns.precision)
    uvicorn.run(app, host="127.0.0.1", port=ns.port, access_log=False, log_level="warning")


if __name__ == "__main__":
    main()
