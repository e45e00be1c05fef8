"""Isolation between models, measured: one model's overload, rollout and replica death leave another alone.

One router at ``/iso`` serves two model applications, ``iso-a`` (A) and ``iso-b`` (B), both the tiny test
classifier, each its own application with its own replicas. A few clients send steady traffic to A through
all phases while B is disturbed:

1. baseline: A alone;
2. B overloaded: many clients flood B with lists of texts (B may refuse: 503/504 are fine for B);
3. B rolled v1 -> v2, then v2 -> v1, by config (as ``serve deploy`` does); each roll ends when B answers with
   the new ``X-Model-Version`` and its application has settled;
4. B's Inference replica actor killed (``ray.kill``), until B answers again (a request sent after the
   replica's process exited), then a few seconds more.

Asserted: A fails no request in any phase (every answer a 200; client timeouts above the service's 30 s
deadline, so a hang shows as a failure, not as a stuck test); A's replicas and the router's are the same
before and after (B's rollout and death touch B only); A's p99 latency in each disturbed phase stays within
``P99_FACTOR`` x its baseline p99 + ``P99_SLACK_S``, at most ``P99_CEILING_S``. A table of the phases is
printed (run with ``-s``) for docs/reliability.md ("Isolation between models").
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ray import serve

from deployments.user_config import PipelineConfig
from tests.integration.conftest import (
    APP,
    DEFAULT_MODEL,
    ServeHarness,
    app_named,
    deployment_named,
    model_app,
    router_app,
)
from tests.integration.traffic import Answer, Traffic

# slow: ~4.5 minutes (the default suite keeps under 20); bash .ci/run -m slow
pytestmark = [pytest.mark.integration, pytest.mark.slow]

A, B, ROUTER = "iso-a", "iso-b", "iso-router"
ROUTE = "/iso"
PHASE_S = 6.0  # A traffic per undisturbed stretch (baseline, flood, after the kill's recovery)
A_CLIENTS = 3  # steady traffic at A: two texts per request, each client pausing A_PAUSE_S between requests
A_PAUSE_S = 0.05  # ~30 req/s in all: samples enough for a p99, CPU left for B's rollouts on 2 cores
WARM_S = 2.0  # A traffic before the baseline starts
B_FLOOD_CLIENTS = 40  # the overload: closed loop, 32 texts per request
B_FLOOD_TEXTS = 32
CLIENT_TIMEOUT_S = 45.0  # above the service's 30 s deadline: a hang is a failure, not a stuck test
ROLLOUT_TIMEOUT_S = 120.0
RECOVERY_TIMEOUT_S = 60.0
MIN_A_ANSWERS = 10  # per phase: fewer and the phase's p99 says nothing
# A's p99 in a disturbed phase must stay within P99_FACTOR x its baseline p99 + P99_SLACK_S. Both models, the
# router, HAProxy and this test's 40+ client threads share the same 2 cores (often with other jobs), so B's
# flood and B's new replicas starting take CPU from A: A is slower, not isolated in time. What isolation
# promises is that A keeps answering, and is never held by B. Measured (docs/reliability.md): baseline p99
# 62-78 ms, but single stalls of 1.4-2.0 s in every run, even in the baseline with A alone (machine noise);
# a flood phase with 50-90 A requests has its slowest as its p99, so the slack sits above one such stall.
# Disturbed p99s measured 0.14-1.8 s. The bound (~2.8-2.9 s) still fails A held by B's outage (B's requests
# waited 23-31 s for the new replica here) or by the 30 s deadline.
# A baseline caught in such a stall has a p99 of ~2 s itself (one run of four): P99_CEILING_S caps the bound,
# so a noisy baseline cannot make it lax.
P99_FACTOR = 5.0
P99_SLACK_S = 2.5
P99_CEILING_S = 5.0


@dataclass
class Phase:
    name: str
    start: float
    end: float = math.inf

    def holds(self, answer: Answer) -> bool:
        return self.start <= answer.sent < self.end


def _quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile (q in [0, 1]) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _replica_ids(*apps: str) -> dict[str, set[str]]:
    """Every replica id of each deployment of ``apps``, as Serve reports them."""
    from ray.serve.context import _get_global_client

    details = _get_global_client().get_serve_details()["applications"]
    return {
        f"{app}/{name}": {r["replica_id"] for r in deployment["replicas"]}
        for app in apps
        for name, deployment in details[app]["deployments"].items()
    }


def _settled(app: str) -> bool:
    status = serve.status().applications.get(app)
    return (
        status is not None
        and status.status == "RUNNING"
        and all(d.status == "HEALTHY" for d in status.deployments.values())
    )


def _inference_replicas(app: str) -> list[dict[str, Any]]:
    """Serve's details of each replica of ``app``'s Inference deployment (id, state, actor name, pid)."""
    from ray.serve.context import _get_global_client

    details = _get_global_client().get_serve_details()["applications"]
    return list(details[app]["deployments"]["Inference"]["replicas"])


def _one_running_inference(app: str, timeout_s: float = 30) -> dict[str, Any]:
    """``app``'s Inference replica, once it is the only one (rolled-away replicas may still be stopping)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        replicas = _inference_replicas(app)
        if len(replicas) == 1 and replicas[0]["state"] == "RUNNING":
            return replicas[0]
        time.sleep(0.5)
    raise TimeoutError(f"{app} has not one running Inference replica: {_inference_replicas(app)}")


def _exited(pid: int, timeout_s: float) -> float:
    """Until process ``pid`` (a replica on this machine) has exited; returns when it had."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return time.monotonic()
        time.sleep(0.05)
    raise TimeoutError(f"replica process {pid} still runs {timeout_s} s after ray.kill")


def _entries(harness: ServeHarness, repo: Path, b_version: str) -> list[dict[str, Any]]:
    """A and B (the tiny classifier, B at ``b_version``) and one router over both. Built the same way each
    time, so that applying them again changes B's version only."""
    template = app_named(harness.base_config, DEFAULT_MODEL)
    model = {"repository": str(repo), "name": "tiny-sentiment", "task": "classify", "backend": "torch"}
    a = model_app({**model, "version": "1"}, template, name=A)
    b = model_app({**model, "version": b_version}, template, name=B)
    router = router_app(ROUTER, ROUTE, [A, B], app_named(harness.base_config, APP))
    # No degraded answers from the cache: they would hide a failed request.
    deployment_named(router, "Ingress")["user_config"] = {"fallback_cache_mb": 0}
    return [a, b, router]


def _apply(harness: ServeHarness, entries: list[dict[str, Any]]) -> None:
    config = harness.config()
    config["applications"].extend(entries)
    harness.apply(config)


@pytest.fixture
def iso_apps(serve_harness: ServeHarness, model_repo: Path) -> Iterator[None]:
    serve_harness.deploy_extra(*_entries(serve_harness, model_repo, "1"))
    yield
    serve_harness.remove_extras()


def _wait_b(probe: Traffic, since: float, timeout_s: float, version: str | None = None) -> float:
    """Until a B request sent after ``since`` is answered 200 (by ``version``, if given) and B has settled;
    returns when."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        answered = any(
            a.status == 200 and a.sent > since and (version is None or a.version == version)
            for a in probe.snapshot()
        )
        if answered and _settled(B):
            return time.monotonic()
        time.sleep(0.2)
    seen = Counter((a.status, a.version) for a in probe.snapshot() if a.sent > since)
    raise TimeoutError(f"B did not answer (version {version}) in {timeout_s} s: {seen}, {serve.status()}")


def test_model_b_overload_rollout_and_replica_death_leave_model_a_alone(
    serve_harness: ServeHarness, model_repo: Path, iso_apps: None
) -> None:
    import ray

    url = f"{serve_harness.url}{ROUTE}/predict"
    a_body = {"model": A, "texts": ["a fine day", "a bad day"]}
    # B's probe is over the pipeline's inline_chars, so it goes through B's Inference: a small request would
    # be answered by the pipeline's own copy of the model even while B's Inference is dead.
    b_body = {"model": B, "texts": [f"probe text {i}: a fine day, " + "word " * 60 for i in range(32)]}
    assert sum(map(len, b_body["texts"])) > PipelineConfig().inline_chars
    flood_body = {
        "model": B,
        "texts": [f"flood text {i}: " + "word " * (4 + i % 12) for i in range(B_FLOOD_TEXTS)],
    }
    a_replicas = _replica_ids(A, ROUTER)
    b_replicas = _replica_ids(B)

    phases: list[Phase] = []
    b_answers: list[Answer] = []

    def begin(name: str) -> Phase:
        now = time.monotonic()
        if phases:
            phases[-1].end = now
        phases.append(Phase(name, now))
        return phases[-1]

    a_traffic = Traffic(
        url,
        a_body,
        workers=A_CLIENTS,
        limit_s=400,
        timeout_s=CLIENT_TIMEOUT_S,
        tag="iso-a",
        pause_s=A_PAUSE_S,
    )
    with a_traffic:
        assert a_traffic.wait_for(lambda answers: len(answers) >= 2 * A_CLIENTS, 30), "A never answered"
        time.sleep(WARM_S)
        begin("baseline (A alone)")
        time.sleep(PHASE_S)

        begin("B flooded")
        flood = Traffic(
            url,
            flood_body,
            workers=B_FLOOD_CLIENTS,
            limit_s=60,
            timeout_s=CLIENT_TIMEOUT_S,
            tag="iso-b-flood",
        )
        with flood:
            time.sleep(PHASE_S)
        b_answers += flood.snapshot()  # the flood's last requests are answered (or time out) inside the phase

        probe = Traffic(url, b_body, workers=1, limit_s=400, timeout_s=CLIENT_TIMEOUT_S, tag="iso-b-probe")
        with probe:
            for version in ("2", "1"):
                phase = begin(f"B rolled to v{version}")
                _apply(serve_harness, _entries(serve_harness, model_repo, version))
                done = _wait_b(probe, phase.start, ROLLOUT_TIMEOUT_S, version=version)
                print(f"\nB rolled to v{version} in {done - phase.start:.1f} s")

            victim = _one_running_inference(B)
            assert victim["actor_name"].startswith(f"SERVE_REPLICA::{B}#Inference#"), victim
            phase = begin("B Inference killed")
            ray.kill(ray.get_actor(victim["actor_name"], namespace="serve"), no_restart=True)
            # ray.kill returns before the process is gone, and a B request sent meanwhile may still be served
            # by it: B's recovery counts from the moment the replica's process has exited.
            dead_at = _exited(victim["pid"], timeout_s=30)
            done = _wait_b(probe, dead_at, RECOVERY_TIMEOUT_S)
            print(f"B answered again {done - phase.start:.1f} s after the kill of {victim['actor_name']}")
            replaced = _one_running_inference(B)
            assert replaced["replica_id"] != victim["replica_id"], "the killed replica still serves"
            time.sleep(PHASE_S / 2)  # A's traffic keeps flowing after B's recovery
            phases[-1].end = time.monotonic()
        b_answers += probe.snapshot()
    assert not any(t.is_alive() for t in a_traffic._threads), "an A client thread is stuck"

    a_answers = a_traffic.snapshot()
    rows = [_row(phase, a_answers, b_answers) for phase in phases]
    print(
        f"\n{'phase':<20} {'s':>5} {'A req':>6} {'A fail':>6} {'A p50':>7} {'A p99':>7} {'A max':>7}"
        "  B statuses  (latencies in ms)"
    )
    for row in rows:
        print(row)
    baseline_p99 = rows[0].p99
    bound = min(P99_FACTOR * baseline_p99 + P99_SLACK_S, P99_CEILING_S)
    print(
        f"A p99 bound: {P99_FACTOR:g} x baseline p99 {baseline_p99 * 1000:.0f} ms"
        f" + {P99_SLACK_S * 1000:.0f} ms, at most {P99_CEILING_S * 1000:.0f} ms: {bound * 1000:.0f} ms;"
        f" A total {len(a_answers)} requests, {len(b_answers)} to B"
    )
    for phase in phases:  # B may fail (it is the one disturbed): shown for the record, not asserted
        for a in (a for a in b_answers if phase.holds(a) and a.status != 200):
            print(
                f"B {a.status} in {phase.name!r}: {a.request_id}, sent +{a.sent - phase.start:.1f} s,"
                f" answered after {a.latency or 0.0:.1f} s: {a.detail}"
            )

    failed = [a for a in a_answers if a.status != 200]
    assert not failed, [(a.request_id, a.status, a.detail) for a in failed[:10]]
    assert _replica_ids(A, ROUTER) == a_replicas, "A's or the router's replicas changed"
    assert _replica_ids(B) != b_replicas, "B was not rolled (its replicas never changed)"
    for row in rows:
        assert row.a_requests >= MIN_A_ANSWERS, f"{row.name}: only {row.a_requests} A answers"
        assert row.p99 <= bound, (
            f"{row.name}: A p99 {row.p99 * 1000:.0f} ms over the bound {bound * 1000:.0f} ms"
        )
    flood_statuses = Counter(a.status for a in b_answers if phases[1].holds(a))
    assert flood_statuses, "the flood sent nothing"
    assert set(flood_statuses) <= {200, 503, 504}, flood_statuses


@dataclass(frozen=True)
class Row:
    name: str
    seconds: float
    a_requests: int
    a_failures: int
    p50: float
    p99: float
    slowest: float
    b_statuses: dict[int, int]

    def __str__(self) -> str:
        ms = [f"{x * 1000:>7.0f}" for x in (self.p50, self.p99, self.slowest)]
        return (
            f"{self.name:<20} {self.seconds:>5.1f} {self.a_requests:>6} {self.a_failures:>6} {' '.join(ms)}  "
            f"{self.b_statuses or '-'}"
        )


def _row(phase: Phase, a_answers: list[Answer], b_answers: list[Answer]) -> Row:
    """A's requests sent in ``phase`` (count, failures, latency p50 / p99 / max), B's statuses."""
    a_in = [a for a in a_answers if phase.holds(a)]
    latencies = [a.latency or 0.0 for a in a_in] or [math.nan]
    b_statuses = Counter(a.status for a in b_answers if phase.holds(a))
    return Row(
        phase.name,
        phase.end - phase.start,
        len(a_in),
        sum(a.status != 200 for a in a_in),
        _quantile(latencies, 0.5),
        _quantile(latencies, 0.99),
        max(latencies),
        dict(sorted(b_statuses.items())),
    )
