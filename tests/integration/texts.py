"""Varied inputs for parity checks: plain, non-ASCII, odd Unicode, and near the 256-token limit."""

from __future__ import annotations

from functools import cache

from tokenizers import Tokenizer

from tests.support.models import DEFAULT_WEIGHTS

VARIED = [
    "The quick brown fox jumps over the lazy dog.",
    "A short one",
    "Ça va très bien, merci ! Où est la bibliothèque ?",
    "Der Bundestag hat heute über die Änderung des Straßenverkehrsgesetzes abgestimmt.",
    "東京は日本の首都であり、世界で最も人口の多い都市圏の一つです。",
    "Москва — столица России, крупнейший по численности населения город страны.",
    "مرحبا بالعالم، هذا نص باللغة العربية من اليمين إلى اليسار",
    "Emoji test 🚀🔥 with combining marks: é (e\u0301) and ñ (n\u0303)",
    "    leading and trailing whitespace    ",
    "x",
]

_PROSE = (
    "Transformer models encode text into dense vectors that capture meaning, so that similar "
    "sentences end up close together in the embedding space while unrelated ones stay apart. "
    "Serving them well means batching requests, avoiding padding and keeping latency low. "
)


@cache
def _tokenizer() -> Tokenizer:
    tok = Tokenizer.from_file(str(DEFAULT_WEIGHTS / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def token_count(text: str) -> int:
    return len(_tokenizer().encode(text).ids)


def near_limit(tokens: int) -> str:
    """Real-looking English prose of at most ``tokens`` tokens, special tokens included."""
    words = (_PROSE * (tokens // 20 + 2)).split()
    lo, hi = 1, len(words)
    while lo < hi:  # longest prefix that fits
        mid = (lo + hi + 1) // 2
        if token_count(" ".join(words[:mid])) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])
