"""The tenants file keeps keys only as salted hashes, and the tool that writes it keeps them that way."""

from __future__ import annotations

import stat

import pytest
from pydantic import ValidationError

from deployments.access.tenants import TenantPolicy, TenantsFile, hash_key, matches, store_key
from deployments.tools import keys


def test_a_stored_key_is_a_salted_hash_that_matches_only_its_key():
    a, b = store_key("ts-secret", "a"), store_key("ts-secret", "b")
    assert a.salt != b.salt and a.sha256 != b.sha256  # the same key, two salts: two hashes
    assert matches("ts-secret", a) and matches("ts-secret", b)
    assert not matches("ts-secreT", a) and not matches("", a)
    assert a.sha256 == hash_key("ts-secret", a.salt)


def test_the_file_holds_no_key_in_clear_and_only_its_owner_reads_it(tenants):
    text = tenants.path.read_text()
    assert tenants.search_key not in text and tenants.bulk_key not in text
    assert tenants.search_key.startswith("ts-") and len(tenants.search_key) > 40
    assert stat.S_IMODE(tenants.path.stat().st_mode) == 0o600
    loaded = TenantsFile.read(tenants.path)
    assert [k.id for k in loaded.tenants["search"].keys] == ["search-1"]
    assert loaded.tenants["bulk"].priority == "batch"


def test_revoke_removes_one_key_and_refuses_an_unknown_one(tenants):
    second = keys.add_key(tenants.path, "search", "search-2")
    keys.revoke(tenants.path, "search", "search-1")
    stored = TenantsFile.read(tenants.path).tenants["search"].keys
    assert [k.id for k in stored] == ["search-2"] and matches(second, stored[0])
    with pytest.raises(SystemExit):
        keys.revoke(tenants.path, "search", "search-1")
    with pytest.raises(SystemExit):
        keys.add_key(tenants.path, "search", "search-2")  # ids are unique per tenant


def test_a_policy_is_validated_before_it_is_written(tenants):
    before = tenants.path.read_bytes()
    with pytest.raises(ValidationError):
        keys.set_policy(tenants.path, "search", {"priority": "urgent"})
    with pytest.raises(ValidationError):
        keys.set_policy(tenants.path, "search", {"requests_per_s": -1})
    assert tenants.path.read_bytes() == before


def test_model_lists_cover_pinned_versions_and_the_wildcard():
    policy = TenantPolicy(models=("embedder",))
    assert policy.allows("embedder") and policy.allows("embedder:2")
    assert not policy.allows("reranker") and not policy.allows("embedder-large")
    assert TenantPolicy().allows("anything")


def test_list_shows_names_and_key_ids_never_keys_or_hashes(tenants, capsys):
    keys.main(["list", "--file", str(tenants.path)])
    out = capsys.readouterr().out
    assert "search-1" in out and "bulk-a" in out and "batch" in out
    stored = TenantsFile.read(tenants.path).tenants["search"].keys[0]
    assert stored.sha256 not in out and stored.salt not in out and tenants.search_key not in out
