"""Incremental detokenization (multi-byte characters split over byte-level BPE tokens) and stop strings."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from postprocess.detokenize import IncrementalDetokenizer, StopMatcher, StopResult

EOS = "<|endoftext|>"
CORPUS = [
    "Hello world, the quick brown fox jumps over the lazy dog.",
    "Café crème brûlée à la française, naïve façade.",
    "日本語のテキストと中文文本。",
    "emoji 🙂🎉 party 👩‍💻 time",
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    """A tiny byte-level BPE: few merges, so multi-byte characters span tokens (and tokens span them)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[EOS],
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 3, trainer)
    return tok


def _stream(tok: Tokenizer, ids: list[int], prompt: list[int] | None = None, skip: bool = True) -> list[str]:
    detok = IncrementalDetokenizer(tok, prompt or (), skip_special_tokens=skip)
    pieces = [detok.push(i) for i in ids]
    pieces.append(detok.flush())
    assert detok.text == "".join(pieces)
    return pieces


@pytest.mark.parametrize(
    "text", ["Hello world", "naïve Café crème", "日本語のテキスト", "party 🙂🎉 👩‍💻!", "mixed 中文 é 🎉 end"]
)
def test_pushes_add_up_to_decode(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text).ids
    pieces = _stream(tokenizer, ids)
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)  # split characters come out whole


def test_split_character_is_held_until_complete(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("🎉").ids
    assert len(ids) > 1  # four bytes over several tokens
    detok = IncrementalDetokenizer(tokenizer)
    assert [detok.push(i) for i in ids] == [""] * (len(ids) - 1) + ["🎉"]
    assert detok.flush() == ""


def test_prompt_gives_left_context(tokenizer: Tokenizer) -> None:
    prompt = tokenizer.encode("The quick brown fox jumps over the").ids
    gen = tokenizer.encode(" lazy dog 日本").ids
    pieces = _stream(tokenizer, gen, prompt)
    assert "".join(pieces) == " lazy dog 日本"
    assert pieces[0].startswith(" ")


def test_prompt_ending_in_multibyte_characters(tokenizer: Tokenizer) -> None:
    prompt = tokenizer.encode("日本語のテキスト").ids
    gen = tokenizer.encode("と中文🙂").ids
    assert "".join(_stream(tokenizer, gen, prompt)) == "と中文🙂"


def test_special_tokens_skipped_or_kept(tokenizer: Tokenizer) -> None:
    eos = tokenizer.token_to_id(EOS)
    ids = [*tokenizer.encode("Hello").ids, eos]
    assert "".join(_stream(tokenizer, ids)) == "Hello"
    assert "".join(_stream(tokenizer, ids, skip=False)) == "Hello" + EOS
    prompt = [eos, *tokenizer.encode("Say").ids]
    assert "".join(_stream(tokenizer, tokenizer.encode(" hi").ids, prompt)) == " hi"


def test_incomplete_character_at_the_end_is_flushed(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("ok 🎉").ids[:-1]  # the emoji's last byte never comes
    detok = IncrementalDetokenizer(tokenizer)
    streamed = "".join(detok.push(i) for i in ids)
    assert streamed.startswith("ok") and "\ufffd" not in streamed
    assert streamed + detok.flush() == tokenizer.decode(ids)
    assert detok.text.endswith("\ufffd")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_property_stream_equals_decode(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text).ids
    pieces = _stream(tokenizer, ids)
    assert "".join(pieces) == tokenizer.decode(ids)
    if "\ufffd" not in text:
        assert all("\ufffd" not in p for p in pieces)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.text(max_size=20), text=st.text(max_size=20))
def test_property_with_prompt(tokenizer: Tokenizer, prompt: str, text: str) -> None:
    ids = tokenizer.encode(text).ids
    assert "".join(_stream(tokenizer, ids, tokenizer.encode(prompt).ids)) == tokenizer.decode(ids)


# --- stop strings -----------------------------------------------------------------------------------


def _run(stops: list[str], pushes: list[str]) -> tuple[list[StopResult], str]:
    matcher = StopMatcher(stops)
    results = [matcher.push(p) for p in pushes]
    return results, matcher.flush()


def test_no_stops_pass_through() -> None:
    results, rest = _run([], ["Hel", "lo", ""])
    assert results == [StopResult("Hel", False), StopResult("lo", False), StopResult("", False)]
    assert rest == ""


def test_stop_spanning_three_pushes() -> None:
    results, rest = _run(["<END>"], ["Hello <E", "N", "D> trailing"])
    assert results == [StopResult("Hello ", False), StopResult("", False), StopResult("", True)]
    assert rest == ""


def test_partial_match_released_when_it_is_not_a_stop() -> None:
    matcher = StopMatcher(["###"])
    assert matcher.push("a #") == StopResult("a ", False)
    assert matcher.push("#") == StopResult("", False)
    assert matcher.push("b") == StopResult("##b", False)
    assert not matcher.stopped
    assert matcher.flush() == ""


def test_text_before_stop_in_the_same_push() -> None:
    results, _ = _run(["\n\n"], ["one\n", "two\n\nthree"])
    assert results == [StopResult("one", False), StopResult("\ntwo", True)]


def test_stop_that_is_a_prefix_of_another() -> None:
    # "ab" completes first; generation stops there, not waiting to see whether "abc" follows.
    results, _ = _run(["abc", "ab"], ["x a", "b", "c"])
    assert results == [StopResult("x ", False), StopResult("", True), StopResult("", True)]
    # The longer one held back, then released when it does not complete.
    results, rest = _run(["abc", "xyz"], ["1 ab", "d"])
    assert results == [StopResult("1 ", False), StopResult("abd", False)]
    assert rest == ""


def test_earliest_match_wins() -> None:
    results, _ = _run(["world", "lo w"], ["hello world"])
    assert results == [StopResult("hel", True)]


def test_stop_at_the_very_start() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.push("ST") == StopResult("", False)
    assert matcher.push("OP and more") == StopResult("", True)
    assert matcher.stopped
    assert matcher.push("ignored") == StopResult("", True)
    assert matcher.flush() == ""


def test_flush_without_stop_releases_held_text() -> None:
    results, rest = _run(["</s>"], ["the end <", "/"])
    assert results == [StopResult("the end ", False), StopResult("", False)]
    assert rest == "</"


def test_empty_stop_strings_are_ignored() -> None:
    results, _ = _run(["", "zz"], ["abc"])
    assert results == [StopResult("abc", False)]


def test_detokenizer_into_stop_matcher(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("Café 🎉 party time").ids
    detok, matcher = IncrementalDetokenizer(tokenizer), StopMatcher(["🎉"])
    out = []
    for i in ids:
        result = matcher.push(detok.push(i))
        out.append(result.text)
        if result.stopped:
            break
    assert "".join(out) == "Café "
    assert matcher.stopped
