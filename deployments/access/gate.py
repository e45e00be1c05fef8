"""Who is calling, what they may call, and how fast: the checks behind the ingress's access middleware.

``admit`` turns an ``Authorization`` header into a tenant (401 otherwise) and takes one request from its
bucket (429 past it); ``check_model`` refuses models outside the tenant's list (403); ``charge`` counts
the input tokens an answer used. No Ray, no HTTP: the ingress (``deployments/ingress/access.py``) wires
it in, and its tests run without either. Errors never carry the key, its hash or its id.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from contracts.errors import AuthenticationError, PermissionDeniedError, RateLimitedError
from deployments.access.buckets import TokenBucket
from deployments.access.tenants import Tenant, TenantPolicy, TenantsFile, matches

log = logging.getLogger("textserve.access")
ANONYMOUS = "anonymous"  # the tenant of every request when no tenants file is configured
_OPEN = TenantPolicy()


@dataclass(frozen=True, slots=True)
class Admission:
    tenant: str
    policy: TenantPolicy
    headers: dict[str, str] = field(default_factory=dict)  # the rate-limit headers of its answer


@dataclass(slots=True)
class _Buckets:
    requests: TokenBucket | None = None
    tokens: TokenBucket | None = None


def _limits(
    policy: TenantPolicy, replicas: int
) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
    """(rate/s, capacity) of the requests and tokens buckets of one replica, or None without a limit."""
    requests = tokens = None
    if policy.requests_per_s is not None:
        burst = policy.burst_requests or max(1.0, policy.requests_per_s)
        requests = (policy.requests_per_s / replicas, max(1.0, burst / replicas))
    if policy.input_tokens_per_min is not None:
        tokens = (policy.input_tokens_per_min / 60.0 / replicas, policy.input_tokens_per_min / replicas)
    return requests, tokens


class AccessGate:
    def __init__(self, keys_file: Path | None, clock: Callable[[], float] = time.monotonic) -> None:
        self._path = keys_file
        self._clock = clock
        self._tenants: dict[str, Tenant] = {}
        self._policies: dict[str, TenantPolicy] = {}  # the tenants without their keys' hashes
        self._stamp: tuple[int, int, int] | None = None
        self._replicas = 1
        self._buckets: dict[str, _Buckets] = {}
        if keys_file is not None:  # a missing or invalid file at start is a refusal to start
            self._load(TenantsFile.read(keys_file), self._stat())

    @property
    def enabled(self) -> bool:
        return self._path is not None

    def _stat(self) -> tuple[int, int, int] | None:
        assert self._path is not None
        try:
            st = os.stat(self._path)  # follows a Kubernetes Secret volume's ..data symlink swap
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def reload_if_changed(self) -> bool:
        """Read the file again if it changed; a broken file keeps the tenants already loaded."""
        if self._path is None:
            return False
        stamp = self._stat()
        if stamp is None or stamp == self._stamp:
            return False
        try:
            tenants = TenantsFile.read(self._path)
        except (OSError, ValueError) as exc:  # never log the content: it holds salts and hashes
            where = [e["loc"] for e in exc.errors()] if isinstance(exc, ValidationError) else []
            log.error(
                "tenants file %s is unreadable (%s %s); keeping the previous one",
                self._path,
                type(exc).__name__,
                where,
            )
            self._stamp = stamp
            return False
        self._load(tenants, stamp)
        log.info("tenants file reloaded: %d tenants", len(self._tenants))
        return True

    def _load(self, tenants: TenantsFile, stamp: tuple[int, int, int] | None) -> None:
        self._tenants, self._stamp = dict(tenants.tenants), stamp
        self._policies = {
            name: TenantPolicy.model_validate(t.model_dump(exclude={"keys"}))
            for name, t in self._tenants.items()
        }
        self._buckets = {name: b for name, b in self._buckets.items() if name in self._tenants}
        self._rescale()

    def set_replicas(self, replicas: int) -> None:
        if replicas >= 1 and replicas != self._replicas:
            self._replicas = replicas
            self._rescale()

    def _rescale(self) -> None:
        now = self._clock()
        for name, buckets in self._buckets.items():
            requests, tokens = _limits(self._policies[name], self._replicas)
            buckets.requests = _rescaled(buckets.requests, requests, now)
            buckets.tokens = _rescaled(buckets.tokens, tokens, now)

    def _buckets_of(self, name: str, policy: TenantPolicy) -> _Buckets:
        buckets = self._buckets.get(name)
        if buckets is None:
            requests, tokens = _limits(policy, self._replicas)
            now = self._clock()
            buckets = self._buckets[name] = _Buckets(
                TokenBucket.full(*requests, now) if requests else None,
                TokenBucket.full(*tokens, now) if tokens else None,
            )
        return buckets

    def authenticate(self, authorization: str | None) -> str:
        """The tenant's name."""
        scheme, _, key = (authorization or "").strip().partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise AuthenticationError("this route needs an API key: send 'Authorization: Bearer <key>'")
        found: str | None = None
        for name, tenant in self._tenants.items():  # every key is hashed: the time does not tell which
            for stored in tenant.keys:
                if matches(key, stored) and found is None:
                    found = name
        if found is None:
            raise AuthenticationError("the API key is not valid")
        return found

    def admit(self, authorization: str | None) -> Admission:
        """The caller's tenant, with one request taken from its bucket."""
        if self._path is None:
            return Admission(ANONYMOUS, _OPEN)
        name = self.authenticate(authorization)
        tenant = self._policies[name]
        buckets = self._buckets_of(name, tenant)
        now = self._clock()
        if buckets.requests is not None and not buckets.requests.try_take(1.0, now):
            raise RateLimitedError(
                f"tenant {name!r} is over its {tenant.requests_per_s:g} requests/s",
                buckets.requests.wait_s(1.0, now),
                self._headers(buckets, tenant, now),
            )
        if buckets.tokens is not None and not buckets.tokens.has_credit(now):
            raise RateLimitedError(
                f"tenant {name!r} is over its {tenant.input_tokens_per_min:g} input tokens/min",
                buckets.tokens.wait_s(1.0, now),
                self._headers(buckets, tenant, now),
            )
        return Admission(name, tenant, self._headers(buckets, tenant, now))

    def check_model(self, admission: Admission, model: str) -> None:
        if not admission.policy.allows(model):
            raise PermissionDeniedError(f"tenant {admission.tenant!r} may not use model {model!r}", "model")

    def charge(self, tenant: str, input_tokens: int) -> None:
        buckets = self._buckets.get(tenant)
        if buckets is not None and buckets.tokens is not None and input_tokens > 0:
            buckets.tokens.charge(float(input_tokens), self._clock())

    def _headers(self, buckets: _Buckets, policy: TenantPolicy, now: float) -> dict[str, str]:
        """OpenAI's x-ratelimit-* names; the remaining budget is this replica's, scaled to the whole."""
        headers: dict[str, str] = {}
        for kind, bucket, limit in (
            ("requests", buckets.requests, policy.requests_per_s),
            ("tokens", buckets.tokens, policy.input_tokens_per_min),
        ):
            if bucket is None or limit is None:
                continue
            headers[f"x-ratelimit-limit-{kind}"] = f"{limit:g}"
            headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, math.floor(bucket.level * self._replicas)))
            headers[f"x-ratelimit-reset-{kind}"] = f"{bucket.reset_s(now):.3g}s"
        return headers


def _rescaled(
    bucket: TokenBucket | None, limits: tuple[float, float] | None, now: float
) -> TokenBucket | None:
    if limits is None:
        return None
    if bucket is None:
        return TokenBucket.full(*limits, now)
    bucket.rescale(*limits, now)
    return bucket
