"""The generation benchmark's pure parts: SSE parsing, the prompt mix, the command line, the load loops,
the systems' configs (the figures and the report: test_bench_generate_stats.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web

from bench import generate, generate_load, generate_systems
from bench.generate_load import Prompt, StreamRecord, chat_body, prompt_mix
from bench.generate_stats import (
    summarize_closed,
    summarize_open,
)
from bench.naive_generate_server import sse_events


def _chunk(
    content: str | None = None,
    finish: str | None = None,
    usage: dict | None = None,
    role: str | None = None,
    choices: bool = True,
) -> str:
    delta = {k: v for k, v in (("role", role), ("content", content)) if v is not None}
    body: dict = {"object": "chat.completion.chunk"}
    body["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}] if choices else []
    if usage is not None:
        body["usage"] = usage
    return "data: " + json.dumps(body)


def _feed(record: StreamRecord, lines: list[tuple[str, float]]) -> StreamRecord:
    for line, t in lines:
        record.feed(line.encode(), t)
    record.ended = lines[-1][1] if lines else record.sent
    return record


# ---- SSE parsing ----


def test_openai_style_stream_with_a_separate_usage_chunk_and_done() -> None:
    r = _feed(
        StreamRecord(sent=10.0),
        [
            (_chunk(role="assistant", content=""), 10.05),  # role only: not a token
            (": keep-alive comment", 10.06),
            (_chunk("Hel"), 10.1),
            ("", 10.1),
            (_chunk("lo"), 10.2),
            (_chunk(" you"), 10.5),
            (_chunk(finish="length"), 10.5),
            (_chunk(usage={"prompt_tokens": 7, "completion_tokens": 4}, choices=False), 10.5),
            ("data: [DONE]", 10.5),
        ],
    )
    assert r.ok and r.done_marker and r.finish_reason == "length"
    assert r.chunks == 3 and r.tokens == 4 and r.prompt_tokens == 7 and not r.usage_missing
    assert r.ttft == pytest.approx(0.1)
    assert r.itl == pytest.approx(0.4 / 3)  # first to last chunk over completion_tokens - 1
    assert r.max_gap == pytest.approx(0.3)


def test_transformers_serve_style_stream_usage_on_the_finish_chunk_and_no_done() -> None:
    r = _feed(
        StreamRecord(sent=0.0),
        [
            (_chunk(role="assistant"), 0.01),
            (_chunk("ab"), 0.1),
            (_chunk("cd"), 0.3),
            (_chunk(finish="stop", usage={"prompt_tokens": 3, "completion_tokens": 5}), 0.3),
        ],
    )
    assert r.ok and not r.done_marker and r.tokens == 5
    assert r.itl == pytest.approx(0.2 / 4)  # coalesced chunks: tokens come from usage


def test_completions_text_field_counts_as_content() -> None:
    line = "data: " + json.dumps({"choices": [{"index": 0, "text": "x", "finish_reason": None}]})
    r = _feed(StreamRecord(sent=0.0), [(line, 0.2), ("data: [DONE]", 0.3)])
    assert r.chunks == 1 and r.ttft == pytest.approx(0.2) and r.ok


def test_one_chunk_answer_has_no_inter_token_latency_and_missing_usage_falls_back_to_chunks() -> None:
    r = _feed(StreamRecord(sent=0.0), [(_chunk("whole answer"), 1.0), (_chunk(finish="stop"), 1.0)])
    assert r.ok and r.usage_missing and r.tokens == 1 and r.itl is None and r.ttft == 1.0


def test_errors_in_the_stream_and_unfinished_streams_are_not_ok() -> None:
    r = _feed(StreamRecord(sent=0.0), [(_chunk("a"), 0.1), ('data: {"error": "boom"}', 0.2)])
    assert not r.ok and "boom" in (r.error or "")
    r = _feed(StreamRecord(sent=0.0), [("data: {not json", 0.1)])
    assert not r.ok and "not JSON" in (r.error or "")
    r = _feed(StreamRecord(sent=0.0), [(_chunk("a"), 0.1)])
    assert not r.ok  # no finish reason, no [DONE]
    assert StreamRecord(sent=0.0).ttft is None


def test_the_naive_servers_events_parse_as_one_chunk_with_usage() -> None:
    usage = {"prompt_tokens": 4, "completion_tokens": 9, "total_tokens": 13}
    r = StreamRecord(sent=0.0, keep_text=True)
    for event in sse_events("id", "m", "some text", "length", usage, include_usage=True):
        for line in event.splitlines():
            r.feed(line, 0.5)
    r.ended = 0.5
    assert r.ok and r.done_marker and r.tokens == 9 and "".join(r.text) == "some text" and r.itl is None
    events = list(sse_events("id", "m", "t", "stop", usage, include_usage=False))
    assert all("usage" not in e for e in events)


# ---- prompts and bodies ----


def test_prompt_mix_is_deterministic_and_in_range() -> None:
    texts = [" ".join(["w"] * n) for n in range(3, 60)]
    count = len  # one token per character: a stand-in tokenizer

    def mix(seed: int) -> list[Prompt]:
        return prompt_mix(texts, 50, seed, (32, 128), count_tokens=count, prompt_tokens=(10, 300))

    a = mix(3)
    assert a == mix(3) and a != mix(4)
    assert all(32 <= p.max_tokens <= 128 and 10 <= (p.prompt_tokens or 0) <= 300 for p in a)
    assert len({p.max_tokens for p in a}) > 10 and len({p.text for p in a}) > 10
    no_count = prompt_mix(texts, 5, 0)
    assert all(p.prompt_tokens is None for p in no_count)
    with pytest.raises(ValueError):
        prompt_mix(["x"], 3, 0, count_tokens=count, prompt_tokens=(10, 20))
    with pytest.raises(ValueError):
        prompt_mix([], 3, 0)


def test_chat_body_is_greedy_streamed_with_usage_and_may_leave_the_model_out() -> None:
    body = json.loads(chat_body(Prompt("hi", 40), "m"))
    assert body == {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 40,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "model": "m",
    }
    assert "model" not in json.loads(chat_body(Prompt("hi", 40), None))


# ---- command line and commands ----


def test_cli_lists_are_checked() -> None:
    assert generate._systems("naive,transformers-serve") == ["naive", "transformers-serve"]
    assert generate._systems("service,vllm") == ["service", "vllm"]
    with pytest.raises(argparse.ArgumentTypeError):
        generate._systems("naive,sglang")
    assert generate._workloads("unique,speculative") == ["unique", "speculative"]
    with pytest.raises(argparse.ArgumentTypeError):
        generate._workloads("mix")
    assert generate._floats("0.5,1,2") == [0.5, 1.0, 2.0]
    with pytest.raises(argparse.ArgumentTypeError):
        generate._floats("0,1")
    ns = generate.build_parser().parse_args(["--quick", "--no-design-rows"])
    assert ns.systems == list(generate_systems.SYSTEMS) and ns.warmup is None and ns.quick


def test_transformers_serve_command_is_pinned_loopback_and_continuous_batching(tmp_path: Path) -> None:
    env = generate_systems.ServingEnv(tmp_path / "venv")
    cmd = generate_systems.transformers_serve_command(env, tmp_path / "m", 1234, ["--log-level", "error"])
    assert cmd[:2] == [str(tmp_path / "venv/bin/transformers"), "serve"]
    assert "--continuous-batching" in cmd and cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--device") + 1] == "cpu" and cmd[-1] == str((tmp_path / "m").resolve())


# ---- the load loops against a fake streaming server on loopback ----


async def _fake_server(tokens: int = 3, gap_s: float = 0.01) -> web.AppRunner:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(tokens):
            await asyncio.sleep(gap_s)
            await resp.write((_chunk("t") + "\n\n").encode())
        usage = {"prompt_tokens": 1, "completion_tokens": tokens}
        await resp.write((_chunk(finish="length", usage=usage) + "\n\ndata: [DONE]\n\n").encode())
        assert body["stream"] is True
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


def _url(runner: web.AppRunner) -> str:
    port = runner.addresses[0][1]
    return f"http://127.0.0.1:{port}/v1/chat/completions"


def test_closed_and_open_loop_against_a_fake_server() -> None:
    async def run() -> tuple[generate_load.LoopResult, generate_load.OpenLoopResult]:
        runner = await _fake_server()
        try:
            bodies = [chat_body(Prompt("x", 3), None)]
            # 2 s: long enough for > 10 requests on a machine still busy (0.6 s once gave 8)
            closed = await generate_load.closed_loop(_url(runner), bodies, 2, 0.2, 2.0, 10.0)
            opened = await generate_load.open_loop(_url(runner), bodies, 20.0, 0.2, 0.6, 10.0, seed=1)
        finally:
            await runner.cleanup()
        return closed, opened

    closed, opened = asyncio.run(run())
    p = summarize_closed("fake", 2, closed.records, closed.window)
    assert p.requests > 10 and p.errors == 0 and p.output_tokens == 3 * p.requests
    assert p.itl_p50_ms is not None and 5.0 < p.itl_p50_ms < 200.0
    q = summarize_open("fake", 20.0, opened.records, opened.lateness, opened.window)
    assert q.requests > 3 and q.errors == 0 and q.extra["sustained"]


def _slow_answers(duration_s: float) -> generate_load.LoopResult:
    """Three clients for ~0.5 s answers (5 tokens, 0.1 s apart), 0.1 s of warm-up, a ``duration_s`` window."""

    async def run() -> generate_load.LoopResult:
        runner = await _fake_server(tokens=5, gap_s=0.1)
        try:
            bodies = [chat_body(Prompt("x", 5), None)]
            return await generate_load.closed_loop(_url(runner), bodies, 3, 0.1, duration_s, 10.0)
        finally:
            await runner.cleanup()

    return asyncio.run(run())


def test_a_closed_loop_window_opens_once_every_client_has_had_an_answer() -> None:
    """Answers (0.5 s) that outlast the warm-up (0.1 s): the window waits for the first wave, so it
    measures a steady state and requests sent inside it finish in it."""
    closed = _slow_answers(1.2)
    first_wave = sorted(r.ended for r in closed.records if r.ended is not None)[:3]
    assert closed.window[0] >= first_wave[-1] - 1e-6 > min(r.sent for r in closed.records) + 0.4
    p = summarize_closed("fake", 3, closed.records, closed.window)
    assert p.requests >= 3 and p.ttft_p50_ms is not None and p.errors == 0


def test_a_closed_loop_window_holds_several_lives_of_an_answer() -> None:
    """Answers of ~0.5 s and a 0.6 s window: a window of about one answer's life would measure one phase
    of a wave; it stretches to WINDOW_LIVES lives, so each client ends at least two answers inside it."""
    closed = _slow_answers(0.6)
    lives = sorted(closed.records, key=lambda r: r.ended or 0.0)[:3]
    slowest = max(r.ended - r.sent for r in lives if r.ended is not None)
    length = closed.window[1] - closed.window[0]
    assert slowest > 0.4 and length >= generate_load.WINDOW_LIVES * slowest - 1e-6 > 0.6
    start, end = closed.window
    answered = [r for r in closed.records if r.error is None and start <= (r.ended or 0.0) <= end]
    assert len(answered) >= 2 * 3


def _config() -> dict:
    return {
        "applications": [
            {"name": "textserve", "args": {"models": ["emb", "demo-lm"], "default_model": "emb"}},
            {"name": "emb", "args": {"model": {"name": "emb", "task": "embed"}}},
            {"name": "demo-lm", "args": {"model": {"name": "demo-lm", "version": "1", "task": "generate"}}},
        ]
    }


def test_retarget_config_points_the_generate_app_at_the_model_dir(tmp_path: Path) -> None:
    config = _config()
    same, change = generate_systems.retarget_config(config, "demo-lm", tmp_path / "x" / "demo-lm" / "1")
    assert same is config and change == ""
    model_dir = tmp_path / "repo" / "bench-lm" / "2"
    cfg, change = generate_systems.retarget_config(config, "bench-lm", model_dir)
    assert "demo-lm -> bench-lm" in change and config == _config()  # the input is left alone
    router, emb, gen = cfg["applications"]
    assert router["args"] == {"models": ["emb", "bench-lm"], "default_model": "emb"}
    assert emb == _config()["applications"][1]
    assert gen["name"] == "bench-lm"
    assert gen["args"]["model"] == {
        "name": "bench-lm",
        "version": "2",
        "task": "generate",
        "repository": str(tmp_path / "repo"),
    }
    bf16, change = generate_systems.retarget_config(config, "bench-lm", model_dir, "bf16")
    assert bf16["applications"][2]["args"]["model"]["precision"] == "bf16"
    same, change = generate_systems.retarget_config(cfg, "bench-lm", model_dir, "fp32")  # fp32: the default
    assert same is cfg and change == ""
    pinned, change = generate_systems.retarget_config(cfg, "bench-lm", model_dir, "bf16")  # served: set only
    assert change == "precision bf16" and pinned["applications"][2]["args"]["model"]["precision"] == "bf16"
    assert "precision" not in cfg["applications"][2]["args"]["model"]
    with pytest.raises(ValueError, match="not <repository>/other"):
        generate_systems.retarget_config(config, "other", model_dir)
    with pytest.raises(ValueError, match="no application with task: generate"):
        generate_systems.retarget_config({"applications": [config["applications"][1]]}, "x", model_dir)


def test_model_name_comes_from_the_manifest_else_the_directory(tmp_path: Path) -> None:
    version = tmp_path / "some-lm" / "1"
    version.mkdir(parents=True)
    assert generate.model_name(version) == "some-lm"
    (version / "manifest.json").write_text(json.dumps({"name": "named-lm"}))
    assert generate.model_name(version) == "named-lm"
    with pytest.raises(SystemExit):
        generate.ensure_model(tmp_path / "missing", print)
