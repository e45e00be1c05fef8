"""Argument parsing of the benchmark, the ramp and the tuner."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.cli import concurrency_list, inprocess_spec, parse
from bench.loadgen import Target, encode_requests, split_concurrency
from bench.results import summarize
from bench.service import load_config, parse_env_pair, parse_service, with_args, with_env, with_port
from bench.tune import default_grid, parse_grid_arg, pick_best, settings, validate


def test_service_specs() -> None:
    v = parse_service(
        "haproxy=serve_config.yaml,RAY_SERVE_ENABLE_DIRECT_INGRESS=1,RAY_SERVE_ENABLE_HA_PROXY=1"
    )
    assert v.name == "haproxy" and v.config == Path("serve_config.yaml")
    assert v.env == {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1", "RAY_SERVE_ENABLE_HA_PROXY": "1"}
    plain = parse_service("configs/x.yaml", {"RAY_worker_niceness": "0"})
    assert plain.name == "service" and plain.env == {"RAY_worker_niceness": "0"}
    assert parse_service("a=b.yaml,K=1", {"K": "0"}).env == {"K": "1"}  # the variant wins
    with pytest.raises(ValueError):
        parse_service("a=b.yaml,NOVALUE")
    with pytest.raises(ValueError):
        parse_env_pair("=1")


def test_variant_env_wins_over_the_configs_runtime_envs() -> None:
    # A config's runtime_env env_vars override what the Ray processes inherit, so a variant's variables must
    # be written into the controller's and every application's, or `service-proxy` would not switch anything.
    base = load_config(Path(__file__).resolve().parents[3] / "serve_config.yaml")
    cfg = with_env(base, {"RAY_SERVE_ENABLE_HA_PROXY": "0", "EXTRA": "x"})
    controller = cfg["controller_options"]["runtime_env"]["env_vars"]
    app = cfg["applications"][0]["runtime_env"]["env_vars"]
    for env in (controller, app):
        assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "0" and env["EXTRA"] == "x"
        assert env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"  # untouched keys stay
    assert app["RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP"] == "0"
    assert base["controller_options"]["runtime_env"]["env_vars"]["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    bare = with_env({"applications": [{"name": "a"}]}, {"K": "1"})
    assert bare["controller_options"] == {"runtime_env": {"env_vars": {"K": "1"}}}
    assert bare["applications"][0]["runtime_env"] == {"env_vars": {"K": "1"}}
    assert with_env(base, {}) == base


def test_service_spec_args_overrides_reach_the_config() -> None:
    v = parse_service(
        "quiet=serve_config.yaml,args.observability.access_log=false,args.limits.max_body_bytes=2048"
    )
    assert v.env == {} and v.args == {"observability.access_log": False, "limits.max_body_bytes": 2048}
    router = {"name": "a", "import_path": "deployments.app:build_router"}
    base = {"applications": [{**router, "args": {"limits": {"max_inputs_per_request": 8}}}]}
    cfg = with_args(base, v.args)
    assert cfg["applications"][0]["args"] == {
        "limits": {"max_inputs_per_request": 8, "max_body_bytes": 2048},
        "observability": {"access_log": False},
    }
    assert base["applications"][0]["args"] == {"limits": {"max_inputs_per_request": 8}}  # not modified


def test_run_defaults_and_quick() -> None:
    opts = parse(["run"])
    assert opts.mode == "run"
    assert [s.name for s in opts.services] == ["service", "service-proxy"]
    assert opts.services[0].env == {}
    assert opts.services[1].env == {  # serve_config.yaml's high-throughput mode off: Serve's Python proxy
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "0",
        "RAY_SERVE_ENABLE_HA_PROXY": "0",
    }
    assert [s.name for s in parse(["ramp"]).services] == ["service"]  # a ramp measures one system
    assert (opts.warmup_s, opts.duration_s, opts.w1_concurrency, opts.w2_concurrency) == (
        5.0,
        15.0,
        [1, 8, 32],
        [4],
    )
    assert opts.naive and not opts.with_infinity and opts.onnx and opts.inprocess_enabled
    quick = parse(["run", "--quick", "--no-naive", "--no-inprocess", "--service-env", "A=1"])
    assert (quick.warmup_s, quick.duration_s, quick.w1_concurrency) == (1.0, 3.0, [1, 8])
    assert not quick.naive and not quick.inprocess_enabled and not quick.onnx
    assert quick.services[0].env == {"A": "1"}
    assert quick.services[1].env["A"] == "1" and quick.services[1].env["RAY_SERVE_ENABLE_HA_PROXY"] == "0"
    assert quick.command.startswith("python -m bench run --quick")


def test_open_loop_requests_option() -> None:
    assert parse(["run"]).open_loop_requests == 1000  # a p99 from at least 1000 arrivals per rate
    assert parse(["run", "--quick"]).open_loop_requests == 0  # a smoke test keeps its 3-s windows
    assert parse(["run", "--open-loop-requests", "300"]).open_loop_requests == 300


def test_rounds_option() -> None:
    assert parse(["run"]).rounds == 1
    assert parse(["run", "--rounds", "3"]).rounds == 3
    with pytest.raises(SystemExit):
        parse(["run", "--rounds", "0"])
    with pytest.raises(SystemExit):  # a ramp is one system's curve: no rounds
        parse(["ramp", "--rounds", "2"])


def test_two_variants_need_distinct_names() -> None:
    opts = parse(["run", "--service", "a=x.yaml", "--service", "b=x.yaml,K=V"])
    assert [s.name for s in opts.services] == ["a", "b"]
    with pytest.raises(SystemExit):
        parse(["run", "--service", "a=x.yaml", "--service", "a=y.yaml"])


def test_ramp_options() -> None:
    opts = parse(["ramp", "--system", "naive-fastapi", "--p99-target-ms", "300", "--texts-per-request", "32"])
    assert (opts.mode, opts.system, opts.p99_target_ms, opts.texts_per_request) == (
        "ramp",
        "naive-fastapi",
        300,
        32,
    )
    with pytest.raises(SystemExit):
        parse(["ramp", "--system", "unknown"])
    assert parse(["ramp", "--system", "infinity-onnx"]).with_infinity


def test_small_parsers() -> None:
    assert concurrency_list("1,8,32") == [1, 8, 32]
    with pytest.raises(argparse.ArgumentTypeError):
        concurrency_list("0")
    assert inprocess_spec("onnx=/m/1/onnx") == ("onnx", Path("/m/1/onnx"))
    assert split_concurrency(32, 3) == [11, 11, 10]
    assert split_concurrency(2, 8) == [1, 1]


def test_with_port_only_touches_http_options() -> None:
    cfg = {"http_options": {"host": "0.0.0.0", "port": 8000, "request_timeout_s": 5}, "applications": []}
    new = with_port(cfg, 1234)
    assert new["http_options"] == {"host": "127.0.0.1", "port": 1234, "request_timeout_s": 5}
    assert cfg["http_options"]["port"] == 8000


def test_encoded_requests() -> None:
    req = encode_requests(Target("http://x", "m"), [["one"], ["two"]])
    assert req.texts_per_request == 1 and req.counts == (1, 1)
    assert b'"input": "one"' in req.bodies[0]  # a single text goes as a plain string
    group = encode_requests(Target("http://x", "m", "base64"), [["a", "b"]])
    assert b'"input": ["a", "b"]' in group.bodies[0] and b'"base64"' in group.bodies[0]
    with pytest.raises(ValueError):
        encode_requests(Target("http://x", "m"), [["a"], ["b", "c"]])


def test_tuner_grid() -> None:
    assert parse_grid_arg("max_batch_size=8,16") == ("max_batch_size", [8, 16])
    assert parse_grid_arg("batch_wait_timeout_s=0.002,null") == ("batch_wait_timeout_s", [0.002, None])
    with pytest.raises(argparse.ArgumentTypeError):
        parse_grid_arg("max_batch_size")
    grid = {"a": [1, 2], "b": [True, False], "c": [0.5]}
    assert len(settings(grid)) == 4 and settings(grid)[0] == {"a": 1, "b": True, "c": 0.5}
    assert "max_batch_tokens" not in default_grid({"max_batch_size", "batch_wait_timeout_s"})
    assert "max_batch_tokens" in default_grid(None)


def test_tuner_validates_with_the_service_model() -> None:
    assert validate({"max_batch_size": 32}, [{"max_batch_size": 8}]) == []
    problems = validate({"max_batch_size": 32}, [{"max_batch_size": 0}])
    assert len(problems) == 1 and "max_batch_size" in problems[0]


def test_tuner_picks_best_throughput_within_p99() -> None:
    def point(rate: float, p99_s: float, errors: int = 0):
        return summarize("s", "tune", 16, 1, 10.0, [p99_s] * int(rate * 10), errors)

    fast_but_slow_tail, ok, slower = point(90, 0.9), point(70, 0.3), point(50, 0.2)
    assert pick_best([fast_but_slow_tail, ok, slower], 500) is ok
    assert pick_best([fast_but_slow_tail], 500) is None
    assert pick_best([point(80, 0.1, errors=100), slower], 500) is slower


def test_mixed_workload_options() -> None:
    opts = parse(["run"])
    assert (opts.mixed_rate, opts.mixed_requests, opts.mixed_p99_ms) == (2.0, 500, 10_000.0)
    assert opts.w1_concurrency and opts.w2_concurrency and opts.open_loop_rates  # W4 beside the others
    assert parse(["run", "--quick"]).mixed_requests == 0  # a smoke test keeps its 3-s window
    assert parse(["run", "--no-mixed"]).mixed_rate == 0.0
    assert parse(["ramp"]).mixed_rate == 0.0
    only = parse(["run", "--workloads", "mixed", "--mixed-rate", "2.5", "--mixed-requests", "120"])
    assert (only.w1_concurrency, only.w2_concurrency, only.open_loop_rates) == ([], [], [])
    assert (only.mixed_rate, only.mixed_requests) == (2.5, 120)
    some = parse(["run", "--workloads", "w1,open", "--open-loop-rates", "10"])
    assert (some.w1_concurrency, some.w2_concurrency, some.open_loop_rates, some.mixed_rate) == (
        [1, 8, 32],
        [],
        [10],
        0.0,
    )
    for bad in (["--workloads", "W9"], ["--workloads", ""], ["--mixed-rate", "0"], ["--mixed-rate", "51"]):
        with pytest.raises(SystemExit):
            parse(["run", *bad])
