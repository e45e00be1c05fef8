"""The synthetic text the speculative-decoding pair (``demo_pair``) learns: seeded, structured, small.

A document is a one-turn chat in demo_lm's ChatML template, as the service feeds a chat request to the model:
a user's message (its random part: which entity, which numbers, which record) and the assistant's reply,
which the message mostly determines: counting, fixed sequences, a memorised fact sheet about an invented
entity, a record summarised back, a phrase repeated, a times table. A model learns it in minutes, and two
models that learned it agree on most greedy next tokens, as speculative decoding wants. The invented world
(entities, their facts) is fixed by ``WORLD_SEED``; ``corpus(seed)`` and ``prompts(n, seed)`` sample
documents from it.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass

WORLD_SEED = 52


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


SYLLABLES = _words(
    "ka lo ven mir tho zu rel bas quin dor fa nel os pra sil tor ga mu ri be cha lun dre vok ta si "
    "wen hal ur pes ko ma ni"
)
KINDS = ("city", "river", "mountain", "forest", "creature", "star", "island", "tower")
COLORS = ("red", "blue", "green", "amber", "grey", "violet", "white", "black", "teal", "golden")
WORDS = _words(
    "old bright quiet river stone window garden silver morning lamp bridge small green cold wind "
    "road happy seven yellow market paper heavy open north tall soft winter bell glass slow honey "
    "iron"
)
MONTHS = _words("January February March April May June July August September October November December")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
LETTERS = tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
GREEK = _words("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi")


def chat(user: str) -> str:
    """``user``'s turn and the assistant's opening as demo_lm's ChatML template renders them (no system
    message): what the service feeds the pair for a one-message chat request."""
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


@dataclass(frozen=True, slots=True)
class Doc:
    """One document: a one-turn chat, ``prompt`` the user's message and ``answer`` the assistant's reply,
    which the prompt determines; ``text`` is the chat as the pair is trained on it (the reply ends in
    ``<|im_end|>``, which ends a generation: the pair's generation_config lists it as an EOS)."""

    kind: str
    prompt: str
    answer: str

    @property
    def text(self) -> str:
        return f"{chat(self.prompt)}{self.answer}<|im_end|>\n"


@dataclass(frozen=True, slots=True)
class Entity:
    name: str
    kind: str
    region: str
    color: str
    age: int
    nickname: str
    motto: str


@functools.cache
def world() -> tuple[tuple[Entity, ...], tuple[str, ...]]:
    """The invented world: 24 entities in 8 regions (names distinct), the same on every call."""
    rng = random.Random(WORLD_SEED)
    names: list[str] = []
    while len(names) < 32:
        name = _name(rng, rng.choice((2, 3)))
        if name not in names:
            names.append(name)
    regions, names = tuple(names[:8]), names[8:]
    entities = tuple(
        Entity(
            names[i],
            KINDS[i % len(KINDS)],
            rng.choice(regions),
            rng.choice(COLORS),
            rng.randrange(3, 99),
            f"the {rng.choice(WORDS)} {rng.choice(WORDS)}",
            " ".join(rng.choice(WORDS) for _ in range(4)).capitalize(),
        )
        for i in range(24)
    )
    return entities, regions


def _road() -> tuple[str, ...]:
    return tuple(e.name for e in world()[0])


def _a(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _name(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(syllables)).capitalize()


def _count(rng: random.Random) -> Doc:
    a = rng.randrange(0, 100)
    b = a + rng.randrange(10, 40)
    return Doc("count", f"Count from {a} to {b}.", " ".join(str(i) for i in range(a, b + 1)) + ".")


def _sequence(rng: random.Random) -> Doc:
    title, items = rng.choice(
        (
            ("Months", MONTHS),
            ("Days", DAYS),
            ("Letters", LETTERS),
            ("Greek letters", GREEK),
            ("The road", _road()),
        )
    )
    start = rng.randrange(len(items))
    length = rng.randrange(5, len(items) + 1)  # at most once round: the end is where it first occurs
    run = [items[(start + i) % len(items)] for i in range(length)]
    return Doc("sequence", f"{title} from {run[0]} to {run[-1]}.", " ".join(run) + ".")


def _facts(rng: random.Random) -> Doc:
    e = rng.choice(world()[0])
    answer = (
        f"{e.name} is {_a(e.color)} {e.color} {e.kind} in {e.region}. {e.name} is {e.age} years old. "
        f"The people of {e.region} call {e.name} {e.nickname}."
    )
    return Doc("facts", f"Fact sheet: {e.name}", answer)


def _record(rng: random.Random) -> Doc:
    e = rng.choice(world()[0])
    values = f"kind: {e.kind}\nregion: {e.region}\ncolor: {e.color}\nage: {e.age}\nmotto: {e.motto}\n"
    return Doc("record", f"Record of {e.name}", f"{values}End of record.")


def _motto(rng: random.Random) -> Doc:
    e = rng.choice(world()[0])
    return Doc("motto", f"The motto of {e.name}, three times.", "\n".join([f"{e.motto}."] * 3))


def _region(rng: random.Random) -> Doc:
    entities, regions = world()
    region = rng.choice(regions)
    members = [e for e in entities if e.region == region]
    lines = "".join(f"- {e.name}, {_a(e.color)} {e.color} {e.kind}\n" for e in members)
    return Doc("region", f"Places of {region}", f"{lines}That makes {len(members)} places in {region}.")


def _table(rng: random.Random) -> Doc:
    k = rng.randrange(2, 10)
    return Doc("table", f"Table of {k}", "\n".join(f"{k} times {i} is {k * i}." for i in range(1, 11)))


KINDS_OF_DOC: tuple[tuple[str, Callable[[random.Random], Doc], float], ...] = (
    ("count", _count, 2.0),
    ("sequence", _sequence, 1.5),
    ("facts", _facts, 1.5),
    ("record", _record, 1.5),
    ("motto", _motto, 1.0),
    ("region", _region, 1.0),
    ("table", _table, 1.0),
)


def documents(n: int, seed: int) -> list[Doc]:
    """``n`` documents drawn with ``seed``: the same list for the same arguments."""
    rng = random.Random(seed)
    makers = [make for _, make, _ in KINDS_OF_DOC]
    weights = [w for _, _, w in KINDS_OF_DOC]
    return [rng.choices(makers, weights)[0](rng) for _ in range(n)]


def corpus(n: int, seed: int) -> list[str]:
    """The training text: ``n`` whole chats (separated by ``<|endoftext|>`` when tokenized)."""
    return [doc.text for doc in documents(n, seed)]


def prompts(n: int, seed: int) -> list[str]:
    """``n`` user messages from the corpus's distribution: what a chat client sends the pair."""
    return [doc.prompt for doc in documents(n, seed)]
