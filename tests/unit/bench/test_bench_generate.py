"""The generation benchmark's pure parts: SSE parsing, the prompt mix, the figures and ratios, the report."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web

from bench import generate, generate_load, generate_report, generate_systems
from bench.generate_load import CANCELLED_AT_END, Prompt, StreamRecord, chat_body, prompt_mix
from bench.generate_stats import (
    CLOSED,
    OPEN,
    DesignRow,
    GenPoint,
    GenReport,
    SystemRun,
    design_ratios,
    http_ratios,
    judge_open,
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


# ---- points ----


def _rec(
    sent: float,
    first: float,
    last: float,
    tokens: int,
    ended: float | None = None,
    error: str | None = None,
    chunks: int | None = None,
) -> StreamRecord:
    r = StreamRecord(
        sent=sent,
        first=first,
        last=last,
        chunks=chunks or tokens,
        completion_tokens=tokens,
        prompt_tokens=10,
        finish_reason="length",
        ended=ended if ended is not None else last,
    )
    r.error = error
    return r


def test_closed_point_counts_requests_ended_in_the_window_and_skips_those_cancelled() -> None:
    records = [
        _rec(0.0, 0.5, 1.5, 11),  # ended before the window
        _rec(1.0, 2.1, 3.1, 11),  # inside: ttft 1.1 s, itl 0.1 s
        _rec(2.0, 2.3, 4.3, 21),  # inside: ttft 0.3 s, itl 0.1 s
        _rec(3.0, 3.5, 4.0, 5, error="HTTP 500"),  # inside, failed
        _rec(4.0, 4.5, 5.5, 9, ended=12.5, error=CANCELLED_AT_END),  # cancelled at the end
    ]
    p = summarize_closed("s", 8, records, (2.0, 12.0), client_cpu=0.05, other_load=0.01)
    assert (p.mode, p.level, p.requests, p.errors, p.output_tokens) == (CLOSED, 8, 2, 1, 32)
    assert p.tokens_per_s == pytest.approx(3.2) and p.req_per_s == pytest.approx(0.2)
    assert p.ttft_p50_ms == pytest.approx(700.0) and p.ttft_p99_ms == pytest.approx(1092.0)
    assert p.itl_p50_ms == pytest.approx(100.0)
    assert p.mean_output_tokens == 16.0 and p.mean_prompt_tokens == 10.0
    assert p.error_examples == ["HTTP 500"]


def test_open_point_counts_arrivals_scheduled_in_the_window_and_judges_them() -> None:
    window = (10.0, 20.0)
    records = [_rec(5.0, 5.2, 6.0, 9)]  # warm-up
    records += [_rec(10.0 + i, 10.2 + i, 11.0 + i, 9) for i in range(8)]
    late = [0.0] * len(records)
    p = summarize_open("s", 1.0, records, late, window, peak_in_flight=2)
    assert p.mode == OPEN and p.requests == 8 and p.errors == 0 and p.extra["arrivals"] == 8
    assert p.extra["sustained"] and p.ttft_p50_ms == pytest.approx(200.0)
    failed = [*records, _rec(19.0, 19.5, 20.5, 9, ended=30.0, error=CANCELLED_AT_END)]
    p2 = summarize_open("s", 1.0, failed, [*late, 0.0], window)
    assert p2.errors == 1 and p2.extra["unfinished"] == 1 and not p2.extra["sustained"]
    # a growing backlog: TTFT 0.2 s at the start, 3 s at the end
    slow = [_rec(10.0 + i, 10.2 + i + (2.8 if i >= 8 else 0.0), 14.0 + i, 9) for i in range(10)]
    p3 = summarize_open("s", 1.0, slow, [0.0] * 10, window)
    assert not p3.extra["sustained"] and "backlog" in p3.extra["why"]
    unsent = summarize_open("s", 1.0, [StreamRecord(sent=11.0, error="unsent")], [float("inf")], window)
    assert unsent.extra["unsent"] == 1 and not judge_open(unsent)[0]


# ---- ratios ----


def _pt(system: str, level: float, tps: float, ttft99: float, mode: str = CLOSED) -> GenPoint:
    return GenPoint(system, mode, level, 60.0, 10, 0, int(tps * 60), tps, 1.0, ttft_p99_ms=ttft99)


def test_http_ratios_judge_throughput_at_8_and_32_and_ttft_everywhere() -> None:
    points = [
        _pt("service", 1, 30, 50),
        _pt("transformers-serve", 1, 25, 40),
        _pt("service", 8, 160, 200),
        _pt("transformers-serve", 8, 100, 400),
        _pt("service", 32, 200, 900),
        _pt("transformers-serve", 32, 150, 800),
        _pt("naive", 8, 20, 9000),
        _pt("service", 1.0, 50, 100, OPEN),
        _pt("transformers-serve", 1.0, 50, 200, OPEN),
    ]
    r = {x.name: x for x in http_ratios(points, "service", "transformers-serve", "naive")}
    c1 = r["output tokens/s service / transformers-serve, c=1"]
    assert c1.target == "context" and c1.met is None and c1.value == pytest.approx(1.2)
    assert r["output tokens/s service / transformers-serve, c=8"].met is True
    c32 = r["output tokens/s service / transformers-serve, c=32"]
    assert c32.met is False and c32.value == pytest.approx(200 / 150, abs=1e-3)
    assert r["TTFT p99 service / transformers-serve, closed loop c=8"].met is True
    assert r["TTFT p99 service / transformers-serve, closed loop c=32"].met is False
    assert r["TTFT p99 service / transformers-serve, open loop req/s=1"].value == pytest.approx(0.5)
    assert r["output tokens/s service / naive, c=8"].value == pytest.approx(8.0)
    assert "output tokens/s service / naive, c=1" not in r
    missing = http_ratios([_pt("transformers-serve", 8, 100, 400)], "service", "transformers-serve", "naive")
    assert missing and all(x.value is None and x.met is None for x in missing)
    assert http_ratios([_pt("naive", 8, 1, 1)], "service", "transformers-serve", "naive") == []


def test_design_ratios_against_the_designs_figures() -> None:
    rows = [
        DesignRow("no-cache", "", 12.0, 1, 100, 8.0),
        DesignRow("cache", "", 3.0, 1, 100, 2.0),
        DesignRow("engine-1", "", 2.5, 1, 100),
        DesignRow("batched-4", "", 4.5, 4, 100, 3.0),
    ]
    values = [r.value for r in design_ratios(rows)]
    assert values == [pytest.approx(4.0), pytest.approx(1.5), pytest.approx(1.8)]
    assert all(r.target == "context" for r in design_ratios(rows))
    assert design_ratios(rows[:1]) == []


# ---- report ----


def _report() -> GenReport:
    rep = GenReport(
        command="python -m bench.generate --quick",
        machine={"git": "abc", "cpu_model": "cpu", "nproc": 2, "ram_gib": 8, "versions": "torch x"},
        options={"warmup_s": 2.0, "duration_s": 8.0},
        model={"describe": "tiny"},
        prompts={"count": 4, "tokens_min": 10, "tokens_max": 90},
        design_rows=[DesignRow("cache", "model.generate()", 2.0, 1, 100, 2.0)],
        systems=[SystemRun("service", "this | service", ran=False, note="did not start: no route")],
        points=[_pt("transformers-serve", 8, 100, 400), _pt("transformers-serve", 1.0, 40, 300, OPEN)],
    )
    rep.points[0].error_examples = ["HTTP 503"]
    rep.points[1].extra = {"drawn_req_per_s": 0.9, "sustained": False, "why": "2 of 9 failed"}
    rep.ratios = http_ratios(rep.points, "service", "transformers-serve", "naive")
    return rep


def test_render_has_every_table_and_escapes_pipes() -> None:
    text = generate_report.render(_report(), "plot.png")
    for heading in ("## The design's rows", "## Systems", "## Closed loop", "## Open loop", "## Ratios"):
        assert heading in text
    assert "this \\| service" in text and "HTTP 503" in text and "**no**: 2 of 9 failed" in text
    assert "| transformers-serve | 8 | 100.0 |" in text and "![" in text
    assert "### Systems" in generate_report.render(_report(), None, level=3)


def test_splice_doc_replaces_its_own_section_and_leaves_the_embedding_one() -> None:
    embedding = "<!-- bench:begin (x) -->\nold embedding\n<!-- bench:end -->"
    doc = f"# Benchmarks\n\n{embedding}\n"
    once = generate_report.splice_doc(doc, "first")
    assert embedding in once and once.count(generate_report.BEGIN_MARK) == 1 and "first" in once
    twice = generate_report.splice_doc(once + "\ntrailer\n", "second")
    assert "first" not in twice and "second" in twice and "trailer" in twice and embedding in twice


def test_report_round_trips_through_json_and_plots(tmp_path: Path) -> None:
    rep = _report()
    rep.save(tmp_path / "results.json")
    again = GenReport.load(tmp_path / "results.json")
    assert again == rep
    png = generate_report.plot(rep.points, tmp_path / "plot.png", "t")
    assert png.stat().st_size > 1000


# ---- command line and commands ----


def test_cli_lists_are_checked() -> None:
    assert generate._systems("naive,transformers-serve") == ["naive", "transformers-serve"]
    with pytest.raises(argparse.ArgumentTypeError):
        generate._systems("naive,vllm")
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
            closed = await generate_load.closed_loop(_url(runner), bodies, 2, 0.2, 0.6, 10.0)
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
