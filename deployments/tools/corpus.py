"""A deterministic corpus of real English text of varied length, built from text that ships with Python.

    python -m deployments.tools.corpus      # its statistics and a few texts

What ``deployments.tools.calibrate`` calibrates int8 ranges on, and the texts of the benchmark (``bench/``),
which imports ``build_corpus``, ``Corpus`` and ``batches`` from here. Pure Python, offline, no service code.

The source is ``pydoc_data.topics`` (the language reference's prose, as ``help()`` shows it). Code
blocks, grammar rules, headings and footnotes are dropped; the prose is split into sentences and
consecutive sentences are grouped into texts of 5-120 words (mean about 30, long tail), then shuffled
with a seed. The same seed gives the same corpus on every machine with the same Python minor version.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

MIN_WORDS = 5
MAX_WORDS = 120
# Log-normal target lengths; grouping whole sentences overshoots the target, so the median is set low.
LENGTH_MU = 2.75
LENGTH_SIGMA = 0.75

_HEADING_RULE = re.compile(r"^\s*([*=\-~^\"#])\1{2,}\s*$")
_FOOTNOTE = re.compile(r"^\s*(\[\d+\]|-\[ .* \]-)")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"“(])")
_WORDLIKE = re.compile(r"^[\"\u201c(]?[A-Za-z][A-Za-z'\u2019\-]*[\"\u201d)]?[.,;:!?)]*$")
_CODE_MARKERS = (">>>", "::=", "...:", "{", "}", " = ", "->")


@dataclass(frozen=True)
class Corpus:
    texts: tuple[str, ...]
    seed: int

    def __len__(self) -> int:
        return len(self.texts)

    def word_counts(self) -> list[int]:
        return [len(t.split()) for t in self.texts]

    def stats(self) -> dict[str, float]:
        counts = sorted(self.word_counts())
        n = len(counts)
        return {
            "texts": n,
            "unique": len(set(self.texts)),
            "words_mean": round(sum(counts) / n, 1),
            "words_min": counts[0],
            "words_p50": counts[n // 2],
            "words_p90": counts[min(n - 1, (n * 9) // 10)],
            "words_max": counts[-1],
        }

    def filtered(self, keep: Callable[[str], bool]) -> Corpus:
        """A corpus without the texts ``keep`` rejects (e.g. over a model's token limit)."""
        return Corpus(tuple(t for t in self.texts if keep(t)), self.seed)


def source_documents() -> list[str]:
    """The raw documents, in a fixed order."""
    from pydoc_data.topics import topics

    return [topics[key] for key in sorted(topics)]


def prose_paragraphs(document: str) -> Iterator[str]:
    """Paragraphs of prose, one line each; headings, code, grammar and footnotes left out."""
    lines = document.splitlines()
    block: list[str] = []
    for i, line in enumerate([*lines, ""]):
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if _HEADING_RULE.match(line) or _HEADING_RULE.match(nxt):
            block = []  # a heading or its underline
            continue
        if line.strip():
            block.append(line)
            continue
        if block:
            paragraph = _as_prose(block)
            if paragraph:
                yield paragraph
            block = []


def _as_prose(block: list[str]) -> str | None:
    if _FOOTNOTE.match(block[0]):
        return None
    text = " ".join(line.strip() for line in block)
    text = re.sub(r"^[*•\-] ", "", text)  # bullet marker
    text = re.sub(r"\s+", " ", text).strip()
    if text.endswith("::"):
        text = text[:-1]
    if not text or not (text[0].isupper() or text[0] in '"“'):
        return None
    if not text.endswith((".", ":", "?", "!")):
        return None
    if any(marker in text for marker in _CODE_MARKERS):
        return None
    words = text.split()
    if len(words) < 4 or sum(1 for w in words if _WORDLIKE.match(w)) < 0.75 * len(words):
        return None
    return text


def sentences(paragraph: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(paragraph) if len(s.split()) >= 3]


def _target_lengths(rng: random.Random) -> Iterator[int]:
    while True:
        yield max(MIN_WORDS, min(MAX_WORDS, round(math.exp(rng.gauss(LENGTH_MU, LENGTH_SIGMA)))))


def group_sentences(paragraphs: Iterable[list[str]], rng: random.Random) -> Iterator[str]:
    """Consecutive sentences of one paragraph joined until a drawn target length is reached."""
    targets = _target_lengths(rng)
    for sents in paragraphs:
        current: list[str] = []
        words = 0
        target = next(targets)
        for sent in sents:
            n = len(sent.split())
            if current and words + n > MAX_WORDS:
                yield " ".join(current)
                current, words, target = [], 0, next(targets)
            current.append(sent)
            words += n
            if words >= target:
                yield " ".join(current)
                current, words, target = [], 0, next(targets)
        if current and words >= MIN_WORDS:
            yield " ".join(current)


def _clip(text: str) -> str:
    words = text.split()
    return text if len(words) <= MAX_WORDS else " ".join(words[:MAX_WORDS])


def build_corpus(seed: int = 0, limit: int | None = None) -> Corpus:
    """All texts (or the first ``limit`` after shuffling), de-duplicated, in seeded random order."""
    rng = random.Random(seed)
    paragraphs: list[list[str]] = []
    seen: set[str] = set()
    for document in source_documents():
        # Sentences of one document stay in order, so a text reads as a coherent passage.
        fresh = [s for p in prose_paragraphs(document) for s in sentences(p) if s not in seen]
        seen.update(fresh)
        if fresh:
            paragraphs.append(fresh)
    texts: list[str] = []
    unique: set[str] = set()
    for text in group_sentences(paragraphs, rng):
        text = _clip(text)
        if len(text.split()) >= MIN_WORDS and text not in unique:
            unique.add(text)
            texts.append(text)
    rng.shuffle(texts)
    return Corpus(tuple(texts[:limit] if limit else texts), seed)


def batches(texts: tuple[str, ...] | list[str], size: int) -> list[list[str]]:
    """Consecutive groups of ``size`` texts (the last partial group dropped when there are full ones)."""
    groups = [list(texts[i : i + size]) for i in range(0, len(texts), size)]
    if len(groups) > 1 and len(groups[-1]) < size:
        groups.pop()
    return groups


if __name__ == "__main__":
    corpus = build_corpus()
    print(corpus.stats())
    for text in corpus.texts[:8]:
        print("-", text)
