"""Request ids, JSON access logs and sampled traces, end to end through the running service.

Replicas write their JSON lines to stderr, which Ray keeps in the session's log directory.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray

pytestmark = pytest.mark.integration

WAIT_S = 30  # log lines leave through a queue, spans through a batch processor (5 s schedule)


def _json_lines_with(needle: str) -> list[dict[str, Any]]:
    logs = Path(ray._private.worker.global_worker.node.get_session_dir_path()) / "logs"
    found = []
    for path in logs.glob("worker-*"):
        with path.open(errors="replace") as f:
            for line in f:
                if needle in line and line.startswith("{"):
                    try:
                        found.append(json.loads(line))
                    except ValueError:
                        continue
    return found


def _wait_lines(needle: str, enough: Any) -> list[dict[str, Any]]:
    deadline = time.monotonic() + WAIT_S
    lines: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        lines = _json_lines_with(needle)
        if enough(lines):
            return lines
        time.sleep(0.5)
    return lines


def test_request_id_is_echoed_or_generated(http: httpx.Client) -> None:
    mine = f"client-{uuid.uuid4().hex}"
    r = http.post("/v1/embeddings", json={"input": "hello"}, headers={"X-Request-Id": mine})
    assert r.status_code == 200 and r.headers["x-request-id"] == mine
    generated = http.post("/v1/embeddings", json={"input": "hello"}).headers["x-request-id"]
    bad = http.post("/v1/embeddings", content=b"{", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.headers["x-request-id"]  # errors carry one too
    assert generated and generated != mine


def test_access_log_is_json_and_carries_the_request_id(http: httpx.Client) -> None:
    rid = f"access-{uuid.uuid4().hex}"
    assert (
        http.post("/v1/embeddings", json={"input": "logged"}, headers={"X-Request-Id": rid}).status_code
        == 200
    )
    lines = _wait_lines(rid, lambda found: any(d.get("logger") == "textserve.access" for d in found))
    access = [d for d in lines if d.get("logger") == "textserve.access"]
    assert len(access) == 1, lines
    line = access[0]
    assert (line["request_id"], line["route"], line["status"], line["level"]) == (
        rid,
        "embeddings",
        200,
        "INFO",
    )
    assert line["deployment"] == "Ingress" and line["ms"] > 0


def test_a_sampled_request_has_one_span_per_stage_in_one_trace(http: httpx.Client) -> None:
    rid = f"traced-{uuid.uuid4().hex}"
    r = http.post(
        "/predict", json={"model": "tiny-sentiment", "texts": ["a", "b"]}, headers={"X-Request-Id": rid}
    )
    assert r.status_code == 200
    stages = {"request", "tokenize", "queue_wait", "inference", "serialize"}

    def complete(found: list[dict[str, Any]]) -> bool:
        return stages <= {d["span"]["name"] for d in found if "span" in d}

    spans = {d["span"]["name"]: d["span"] for d in _wait_lines(rid, complete) if "span" in d}
    assert set(spans) == stages, sorted(spans)
    root = spans["request"]
    assert {s["trace_id"] for s in spans.values()} == {root["trace_id"]}
    for name in stages - {"request"}:
        assert spans[name]["parent_id"] == root["span_id"], name
        assert spans[name]["attributes"]["request_id"] == rid
        assert root["start_ns"] <= spans[name]["start_ns"] <= spans[name]["end_ns"] <= root["end_ns"] + 10**6
