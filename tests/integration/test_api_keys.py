"""API keys and tenants on a running service: 401, 403 and 429 with their headers, the openai client with
a key, rotation with no restart, and no key (nor its hash) in any log line, trace or metric afterwards.

A router of its own at /secure, over the session's models, with a tenants file made by the real tool.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import ray

from deployments.access.tenants import TenantsFile
from deployments.tools import keys
from tests.integration.conftest import APP, CLASSIFIER, DEFAULT_MODEL, ServeHarness, app_named, router_app
from tests.integration.test_metrics import metrics_ports

pytestmark = pytest.mark.integration

ROUTER = "secure-router"
ROUTE = "/secure"
RELOAD_S = 0.5
LONG_TEXT = " ".join(["tokens for the metered tenant"] * 25)  # ~125 tokens


@dataclass
class Secure:
    url: str
    path: Path
    search: str  # the default model only, 3 requests/s
    bulk: str  # any model, batch priority, no limits
    metered: str  # 100 input tokens/min

    def get(self, route: str, key: str | None = None) -> httpx.Response:
        return httpx.get(self.url + route, headers=_auth(key), timeout=30)

    def embed(self, key: str | None, model: str = DEFAULT_MODEL, text: str = "hello") -> httpx.Response:
        body = {"model": model, "input": [text]}
        return httpx.post(self.url + "/v1/embeddings", json=body, headers=_auth(key), timeout=30)


def _auth(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key is not None else {}


@pytest.fixture(scope="module")
def secure(serve_harness: ServeHarness, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    path = tmp_path_factory.mktemp("auth") / "tenants.yaml"
    keys.set_policy(path, "search", {"models": (DEFAULT_MODEL,), "requests_per_s": 3.0})
    keys.set_policy(path, "bulk", {"priority": "batch"})
    keys.set_policy(path, "metered", {"input_tokens_per_min": 100.0})
    made = {name: keys.add_key(path, name, None) for name in ("search", "bulk", "metered")}
    router = router_app(ROUTER, ROUTE, [DEFAULT_MODEL, CLASSIFIER], app_named(serve_harness.base_config, APP))
    router["args"]["auth"] = {"keys_file": str(path), "reload_interval_s": RELOAD_S}
    for deployment in router["deployments"]:  # nothing to drain at teardown: go at once
        deployment.update(graceful_shutdown_timeout_s=1, graceful_shutdown_wait_loop_s=0.2)
    config = serve_harness.config()
    config["applications"].append(router)
    serve_harness.apply(config)
    serve_harness.wait({ROUTER: "RUNNING"})
    secure = Secure(serve_harness.url + ROUTE, path, made["search"], made["bulk"], made["metered"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until the router has read both models' cards
        answer = secure.get("/v1/models", secure.bulk)
        if answer.status_code == 200 and {DEFAULT_MODEL, CLASSIFIER} <= {
            m["id"] for m in answer.json()["data"]
        }:
            break
        time.sleep(0.3)
    yield secure
    serve_harness.remove_extras()


def test_no_key_or_a_wrong_one_is_401_with_www_authenticate(secure: Secure) -> None:
    for key in (None, "ts-not-a-key", secure.search + "x"):
        answer = secure.embed(key)
        assert answer.status_code == 401, answer.text
        assert answer.headers["www-authenticate"] == 'Bearer realm="textserve"'
        assert answer.json()["error"]["code"] == "invalid_api_key"
        assert secure.search not in answer.text
    assert secure.get("/v1/models").status_code == 401  # every model route, listing included
    assert secure.get("/healthz").status_code == 200  # health stays open


def test_a_model_outside_the_tenants_list_is_403_and_not_listed(secure: Secure) -> None:
    answer = secure.embed(secure.search, model=CLASSIFIER)
    assert answer.status_code == 403
    assert answer.json()["error"] == {
        "message": f"tenant 'search' may not use model '{CLASSIFIER}'",
        "type": "permission_error",
        "code": "model_not_allowed",
        "param": "model",
    }
    listed = {m["id"] for m in secure.get("/v1/models", secure.search).json()["data"]}
    assert DEFAULT_MODEL in listed and CLASSIFIER not in listed
    assert (
        secure.embed(secure.bulk, model=CLASSIFIER).status_code == 400
    )  # allowed; a classifier: no embeddings


def test_past_the_requests_rate_is_429_with_retry_after_and_the_budget(secure: Secure) -> None:
    time.sleep(1.5)  # a full bucket: 3
    answers = [secure.embed(secure.search) for _ in range(8)]
    codes = [a.status_code for a in answers]
    assert codes[:3] == [200, 200, 200] and 429 in codes, codes
    assert answers[0].headers["x-ratelimit-limit-requests"] == "3"
    refused = answers[codes.index(429)]
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.json()["error"]["type"] == "rate_limit_error"


def test_input_tokens_past_the_minute_budget_are_429_until_it_refills(secure: Secure) -> None:
    first = secure.embed(secure.metered, text=LONG_TEXT)  # ~125 tokens: overdraws the 100/min bucket
    assert first.status_code == 200
    refused = secure.embed(secure.metered)
    assert refused.status_code == 429
    assert refused.headers["x-ratelimit-remaining-tokens"] == "0"
    assert int(refused.headers["retry-after"]) > 10  # ~25 tokens in debt at 100/min


def test_the_openai_client_works_with_a_key_and_fails_without(secure: Secure) -> None:
    client = openai.OpenAI(base_url=f"{secure.url}/v1", api_key=secure.bulk, max_retries=0)
    result = client.embeddings.create(model=DEFAULT_MODEL, input=["a key opens the door"])
    assert len(result.data[0].embedding) == 384
    wrong = openai.OpenAI(base_url=f"{secure.url}/v1", api_key="ts-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.embeddings.create(model=DEFAULT_MODEL, input=["no"])


def test_a_key_is_rotated_with_no_restart(secure: Secure) -> None:
    new = keys.add_key(secure.path, "bulk", "bulk-2")
    assert _eventually(lambda: secure.embed(new).status_code == 200)
    keys.revoke(secure.path, "bulk", "bulk-1")
    assert _eventually(lambda: secure.embed(secure.bulk).status_code == 401)
    assert secure.embed(new).status_code == 200
    secure.bulk = new


def _eventually(check: Callable[[], bool], timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.3)
    return False


def test_no_key_or_hash_in_logs_traces_or_metrics(secure: Secure) -> None:
    """Last in the module: after good and bad keys, every secret is searched for everywhere."""
    stored = [k for t in TenantsFile.read(secure.path).tenants.values() for k in t.keys]
    secrets = [secure.search, secure.metered, secure.bulk, "ts-not-a-key"]
    secrets += [k.sha256 for k in stored] + [k.salt for k in stored]
    secure.embed("ts-not-a-key")
    secure.embed(secure.search)
    metrics = _metrics_with("ray_tenant_requests_total", 'tenant="search"')
    logs = Path(ray._private.worker.global_worker.node.get_session_dir_path()) / "logs"
    time.sleep(6)  # log lines leave through a queue, spans through a batch processor (5 s)
    leaks = [s[:6] for s in secrets if s in metrics]
    for path in logs.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            leaks += [f"{s[:6]}… in {path.name}" for s in secrets if s in text]
    assert not leaks, leaks


def _metrics_with(name: str, label: str, timeout_s: float = 30.0) -> str:
    """All of Ray's metrics text, once it has the series (exported every few seconds)."""
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        text = "\n".join(_scrape(port) for port in metrics_ports())
        if any(name in line and label in line for line in text.splitlines()):
            return text
        time.sleep(1)
    raise AssertionError(f"no {name}{{{label}}} in the metrics")


def _scrape(port: int) -> str:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5, trust_env=False).text
    except httpx.HTTPError:
        return ""
