"""Graceful degradation: answer a failed request from a bounded LRU of recent answers, marked degraded.

Keyed by the response options, the truncate flag and a digest of the exact inputs, so a degraded answer
is the answer this service gave to the same request recently (its X-Model-Version says which model
version produced it). Bounded in bytes; ``fallback_cache_mb: 0`` turns it off.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable

import orjson
import ormsgpack
from cachetools import LRUCache

from contracts.outputs import MSGPACK, ResponseOptions, SerializedResponse
from contracts.tokenized import TokenizeJob

DEGRADED_HEADER = "X-Degraded"


def cache_key(options: ResponseOptions, job: TokenizeJob) -> Hashable:
    # A digest, not the inputs: the cache is bounded by its answers' bytes and must not keep inputs alive.
    inputs = [job.texts, job.token_ids, job.query, job.prompt, job.query_prompt, job.max_tokens]
    return (options, job.truncate, hashlib.blake2b(orjson.dumps(inputs), digest_size=16).digest())


class FallbackCache:
    def __init__(self, max_bytes: int) -> None:
        self.enabled = max_bytes > 0
        self._cache: LRUCache[Hashable, SerializedResponse] = LRUCache(
            maxsize=max(max_bytes, 1), getsizeof=lambda r: len(r.body) + 256
        )
        self.hits = 0

    def remember(self, key: Hashable, response: SerializedResponse) -> None:
        if self.enabled and len(response.body) + 256 <= self._cache.maxsize:
            self._cache[key] = response

    def recall(self, key: Hashable) -> SerializedResponse | None:
        """The last good answer to this request, with ``"degraded": true`` added to its body."""
        if not self.enabled:
            return None
        cached = self._cache.get(key)
        if cached is None:
            return None
        self.hits += 1
        return SerializedResponse(
            mark_degraded(cached.body, cached.media_type), cached.media_type, cached.model_version
        )


def mark_degraded(body: bytes, media_type: str) -> bytes:
    if media_type == MSGPACK:
        payload = ormsgpack.unpackb(body)
        if not isinstance(payload, dict):  # TEI's list bodies: the X-Degraded header says it
            return body
        payload["degraded"] = True
        return ormsgpack.packb(payload)
    # An object gets the flag as its first member without re-parsing; TEI's list bodies keep the header.
    return b'{"degraded":true,' + body[1:] if body.startswith(b"{") and body != b"{}" else body
