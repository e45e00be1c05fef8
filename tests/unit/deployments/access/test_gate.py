"""401 for a missing or wrong key, 403 for a model outside the tenant's list, 429 past its buckets."""

from __future__ import annotations

import os

import pytest

from contracts.errors import AuthenticationError, PermissionDeniedError, RateLimitedError
from deployments.access.buckets import TokenBucket
from deployments.access.gate import ANONYMOUS, AccessGate
from deployments.tools import keys


def _bearer(key: str) -> str:
    return f"Bearer {key}"


def test_without_a_tenants_file_everyone_is_anonymous_and_unlimited():
    gate = AccessGate(None)
    assert not gate.enabled
    for _ in range(100):
        assert gate.admit(None).tenant == ANONYMOUS


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer  ", "Basic abc", "ts-x", "Bearer ts-wrong"])
def test_a_missing_or_wrong_key_is_refused_without_echoing_it(tenants, clock, header):
    gate = AccessGate(tenants.path, clock)
    with pytest.raises(AuthenticationError) as refused:
        gate.admit(header)
    assert refused.value.headers()["WWW-Authenticate"].startswith("Bearer")
    assert "ts-wrong" not in refused.value.message


def test_a_key_admits_its_tenant_with_its_priority(tenants, clock):
    gate = AccessGate(tenants.path, clock)
    search = gate.admit(_bearer(tenants.search_key))
    bulk = gate.admit(f"bearer  {tenants.bulk_key} ")  # the scheme is case-insensitive
    assert (search.tenant, search.policy.priority) == ("search", "interactive")
    assert (bulk.tenant, bulk.policy.priority) == ("bulk", "batch")
    assert not hasattr(search.policy, "keys")  # what travels with the request holds no hashes


def test_a_model_outside_the_list_is_forbidden(tenants, clock):
    gate = AccessGate(tenants.path, clock)
    search = gate.admit(_bearer(tenants.search_key))
    gate.check_model(search, "all-MiniLM-L6-v2")
    gate.check_model(search, "all-MiniLM-L6-v2:1")
    with pytest.raises(PermissionDeniedError) as refused:
        gate.check_model(search, "demo-classifier")
    assert refused.value.param == "model"
    gate.check_model(gate.admit(_bearer(tenants.bulk_key)), "demo-classifier")  # bulk: any model


def test_requests_past_the_rate_get_429_with_retry_after_and_the_budget(tenants, clock):
    gate = AccessGate(tenants.path, clock)
    first = gate.admit(_bearer(tenants.search_key))
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    gate.admit(_bearer(tenants.search_key))
    with pytest.raises(RateLimitedError) as refused:
        gate.admit(_bearer(tenants.search_key))
    headers = refused.value.headers()
    assert headers["Retry-After"] == "1" and headers["x-ratelimit-remaining-requests"] == "0"
    clock.now += 0.5  # 2/s: one request's worth refilled
    gate.admit(_bearer(tenants.search_key))
    gate.admit(_bearer(tenants.bulk_key))  # another tenant's bucket is its own


def test_input_tokens_are_charged_after_the_answer_and_a_debt_is_refused(tenants, clock):
    gate = AccessGate(tenants.path, clock)  # bulk: 600 tokens/min, 10/s
    bulk = gate.admit(_bearer(tenants.bulk_key))
    gate.charge(bulk.tenant, 900)  # one answer may overdraw
    with pytest.raises(RateLimitedError) as refused:
        gate.admit(_bearer(tenants.bulk_key))
    assert int(refused.value.headers()["Retry-After"]) == 31  # 300 in debt + 1 at 10 tokens/s
    clock.now += 31
    assert gate.admit(_bearer(tenants.bulk_key)).headers["x-ratelimit-remaining-tokens"] == "10"


def test_limits_are_split_across_ingress_replicas(tenants, clock):
    gate = AccessGate(tenants.path, clock)
    gate.set_replicas(2)  # search: 2 req/s in all, 1 per replica
    first = gate.admit(_bearer(tenants.search_key))
    assert first.headers["x-ratelimit-remaining-requests"] == "0"  # scaled back to the whole service
    with pytest.raises(RateLimitedError):
        gate.admit(_bearer(tenants.search_key))


def test_a_changed_file_is_read_again_and_a_broken_one_keeps_the_last(tenants, clock):
    gate = AccessGate(tenants.path, clock)
    assert not gate.reload_if_changed()
    new = keys.add_key(tenants.path, "search", "search-2")
    keys.revoke(tenants.path, "search", "search-1")
    assert gate.reload_if_changed()
    gate.admit(_bearer(new))
    with pytest.raises(AuthenticationError):
        gate.admit(_bearer(tenants.search_key))  # rotated out, no restart
    good = tenants.path.read_bytes()
    tenants.path.write_text("tenants: {search: {priority: urgent}}")
    os.utime(tenants.path, ns=(1, 1))
    assert not gate.reload_if_changed()
    gate.admit(_bearer(new))
    tenants.path.write_bytes(good)


def test_a_missing_tenants_file_refuses_to_start(tmp_path):
    with pytest.raises(FileNotFoundError):
        AccessGate(tmp_path / "absent.yaml")


def test_a_bucket_refills_to_its_capacity_and_keeps_its_fill_when_rescaled():
    bucket = TokenBucket.full(rate=2.0, capacity=4.0, now=0.0)
    assert all(bucket.try_take(1.0, 0.0) for _ in range(4)) and not bucket.try_take(1.0, 0.0)
    assert bucket.wait_s(1.0, 0.0) == pytest.approx(0.5)
    assert bucket.reset_s(1.0) == pytest.approx(1.0)
    bucket.try_take(0.0, 100.0)
    assert bucket.level == 4.0  # never past its capacity
    bucket.rescale(1.0, 2.0, 100.0)
    assert (bucket.level, bucket.rate) == (2.0, 1.0)
