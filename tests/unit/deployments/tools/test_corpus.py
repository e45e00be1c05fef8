"""deployments/tools/corpus.py (the benchmark and calibration corpus): real prose, varied lengths, no
duplicates, deterministic."""

from __future__ import annotations

from collections import Counter

from deployments.tools.corpus import MAX_WORDS, MIN_WORDS, batches, build_corpus, prose_paragraphs, sentences


def test_deterministic_for_a_seed_and_shuffled_by_it() -> None:
    a, b, c = build_corpus(seed=0), build_corpus(seed=0), build_corpus(seed=1)
    assert a.texts == b.texts
    assert a.texts != c.texts
    assert len(a) > 500


def test_lengths_are_varied_with_a_long_tail() -> None:
    stats = build_corpus().stats()
    assert stats["words_min"] >= MIN_WORDS
    assert stats["words_max"] <= MAX_WORDS
    assert 25 <= stats["words_mean"] <= 40
    assert stats["words_p90"] >= 2 * stats["words_p50"] * 0.9  # a tail, not one length
    buckets = Counter(min(n // 10, 10) for n in build_corpus().word_counts())
    assert len(buckets) >= 8
    assert max(buckets.values()) < 0.4 * sum(buckets.values())


def test_no_duplicates_dominate() -> None:
    corpus = build_corpus()
    assert len(set(corpus.texts)) == len(corpus)
    first_words = Counter(" ".join(t.split()[:4]) for t in corpus.texts)
    assert first_words.most_common(1)[0][1] < 0.02 * len(corpus)


def test_prose_only_no_code_or_grammar() -> None:
    for text in build_corpus().texts:
        assert ">>>" not in text and "::=" not in text
        assert text[0].isupper() or text[0] in '"\u201c('
    doc = "Title\n*****\n\nSome prose here that ends well. And a second sentence follows it.\n\n   x = 1\n"
    assert list(prose_paragraphs(doc)) == [
        "Some prose here that ends well. And a second sentence follows it."
    ]


def test_sentence_split() -> None:
    text = 'It works well. The "if" statement runs. Ok. (A note in brackets.)'
    assert sentences(text) == ["It works well.", 'The "if" statement runs.', "(A note in brackets.)"]


def test_batches_drop_only_a_trailing_partial_group() -> None:
    assert batches(["a", "b", "c", "d", "e"], 2) == [["a", "b"], ["c", "d"]]
    assert batches(["a"], 32) == [["a"]]
    assert batches(["a", "b"], 1) == [["a"], ["b"]]


def test_filtered_keeps_seed() -> None:
    corpus = build_corpus(seed=5)
    short = corpus.filtered(lambda t: len(t.split()) < 20)
    assert short.seed == 5 and 0 < len(short) < len(corpus)
