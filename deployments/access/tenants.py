"""The tenants file: each tenant's policy and API keys, the keys stored as salted hashes only.

    tenants:
      search:                       # the tenant's name: metrics and logs carry it, never a key
        priority: interactive       # or batch: queued behind interactive work, with a guaranteed share
        models: ["all-MiniLM-L6-v2"] # names it may call ("*": any); a name covers its pinned versions
        requests_per_s: 50          # token bucket; null: no limit
        input_tokens_per_min: 200000
        keys:
          - {id: search-2026-12, salt: 9f0c..., sha256: 4b1e...}

API keys are 256-bit random tokens made by ``python -m deployments.tools.keys``, so one salted SHA-256 is
enough to store them (a slow password hash protects guessable secrets; these are not guessable) and cheap
enough to check on every request. The file is written 0600 and never holds a key in clear.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from contracts.tokenized import Priority

KEY_PREFIX = "ts-"
ANY_MODEL = "*"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class StoredKey(_Frozen):
    id: str = Field(min_length=1, description="A label to rotate or revoke the key by; never the key.")
    salt: str = Field(pattern=r"^[0-9a-f]{32}$")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class TenantPolicy(_Frozen):
    priority: Priority = "interactive"
    models: tuple[str, ...] = (ANY_MODEL,)
    requests_per_s: float | None = Field(default=None, gt=0)
    burst_requests: float | None = Field(
        default=None, gt=0, description="The requests bucket's size; null: one second's worth (at least 1)."
    )
    input_tokens_per_min: float | None = Field(default=None, gt=0)

    def allows(self, model: str) -> bool:
        """``model`` as the client named it (``name`` or ``name:version``)."""
        name = model.split(":", 1)[0]
        return ANY_MODEL in self.models or name in self.models or model in self.models


class Tenant(TenantPolicy):
    keys: tuple[StoredKey, ...] = ()


class TenantsFile(_Frozen):
    tenants: dict[str, Tenant] = Field(default_factory=dict)

    @staticmethod
    def read(path: Path) -> TenantsFile:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        return TenantsFile.model_validate(data)

    def write(self, path: Path) -> None:
        """Atomically, readable by its owner only."""
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yaml.safe_dump(self.model_dump(mode="json", exclude_defaults=False), f, sort_keys=False)
        os.replace(tmp, path)


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str, salt: str) -> str:
    return hashlib.sha256(bytes.fromhex(salt) + key.encode("utf-8")).hexdigest()


def store_key(key: str, key_id: str) -> StoredKey:
    salt = secrets.token_hex(16)
    return StoredKey(id=key_id, salt=salt, sha256=hash_key(key, salt))


def matches(key: str, stored: StoredKey) -> bool:
    """Constant time in the key's content: the digests are compared with ``hmac.compare_digest``."""
    return hmac.compare_digest(hash_key(key, stored.salt), stored.sha256)
