"""The degraded-answer cache: bounded, keyed by the exact request, marked when used."""

from __future__ import annotations

import orjson
import ormsgpack

from contracts.outputs import JSON, MSGPACK, ResponseOptions, SerializedResponse
from contracts.tokenized import TokenizeJob
from deployments.ingress.fallback import FallbackCache, cache_key, mark_degraded

OPTS = ResponseOptions(route="embeddings")


def _resp(body: dict, media=JSON) -> SerializedResponse:
    raw = orjson.dumps(body) if media == JSON else ormsgpack.packb(body)
    return SerializedResponse(raw, media, "1")


def test_off_by_default_remembers_nothing():
    cache = FallbackCache(0)
    cache.remember(cache_key(OPTS, TokenizeJob(["a"], False)), _resp({"x": 1}))
    assert not cache.enabled and cache.recall(cache_key(OPTS, TokenizeJob(["a"], False))) is None


def test_recall_marks_degraded_and_keeps_the_answer():
    cache = FallbackCache(1 << 20)
    key = cache_key(OPTS, TokenizeJob(["a", "b"], False))
    cache.remember(key, _resp({"data": [1, 2], "model": "m"}))
    hit = cache.recall(key)
    assert hit is not None and orjson.loads(hit.body) == {"degraded": True, "data": [1, 2], "model": "m"}
    assert cache.hits == 1


def test_key_is_the_exact_request():
    cache = FallbackCache(1 << 20)
    cache.remember(cache_key(OPTS, TokenizeJob(["a"], False)), _resp({"v": 1}))
    assert cache.recall(cache_key(OPTS, TokenizeJob(["a"], True))) is None  # truncate differs
    assert cache.recall(cache_key(ResponseOptions(route="predict"), TokenizeJob(["a"], False))) is None
    assert cache.recall(cache_key(OPTS, TokenizeJob(["a", "a"], False))) is None


def test_bounded_by_bytes_least_recent_goes_first():
    cache = FallbackCache(3000)
    big = {"blob": "x" * 900}
    for name in ("a", "b", "c"):
        cache.remember(cache_key(OPTS, TokenizeJob([name], False)), _resp(big))
    assert cache.recall(cache_key(OPTS, TokenizeJob(["a"], False))) is None  # evicted: 3 x ~1.1 KB > 3 KB
    assert cache.recall(cache_key(OPTS, TokenizeJob(["c"], False))) is not None


def test_msgpack_bodies_are_marked_too():
    marked = mark_degraded(ormsgpack.packb({"data": [1.5]}), MSGPACK)
    assert ormsgpack.unpackb(marked) == {"data": [1.5], "degraded": True}
