"""The router's table: which model and version answers a request (no Ray)."""

from __future__ import annotations

import pytest

from contracts.errors import ModelNotFoundError, NotReadyError
from deployments.config import LimitsConfig
from deployments.ingress.routing import ModelRouter
from deployments.pipeline.card import LaneCard, ModelCard, Role, model_entries


def _lane(version: str, role: Role = "stable", share: float = 1.0, task: str = "embed") -> LaneCard:
    return LaneCard(
        version=version,
        role=role,
        share=share,
        task=task,
        max_tokens=256,
        dimension=384 if task == "embed" else None,
        labels=() if task == "embed" else ("neg", "pos"),
    )


def _router(draw: float = 0.5) -> ModelRouter:
    router = ModelRouter(["embedder", "classifier"], "embedder", draw=lambda: draw)
    router.update(ModelCard("embedder", (_lane("1", share=0.75), _lane("2", "candidate", 0.25))))
    router.update(ModelCard("classifier", (_lane("7", task="classify"),)))
    return router


def test_no_model_goes_to_the_default_and_a_name_to_that_model():
    router = _router()
    assert router.route(None).model == "embedder"
    assert router.route("").model == "embedder"
    route = router.route("classifier")
    assert (route.model, route.lane.version, route.lane.task) == ("classifier", "7", "classify")


@pytest.mark.parametrize(("draw", "version"), [(0.1, "2"), (0.24, "2"), (0.25, "1"), (0.9, "1")])
def test_unpinned_requests_split_by_the_candidate_share(draw, version):
    assert _router(draw).route("embedder").lane.version == version


def test_a_pin_wins_over_the_split():
    router = _router(draw=0.0)  # every unpinned request would go to the candidate
    assert router.route("embedder:1").lane.version == "1"
    assert router.route("embedder:2").lane.role == "candidate"
    assert router.route("embedder:1").pinned and not router.route("embedder").pinned
    assert not router.route(None).pinned


@pytest.mark.parametrize("requested", ["nope", "nope:1", "embedder:3", "classifier:1", "embed", ":1"])
def test_unknown_model_or_version_is_a_404_naming_what_is_served(requested):
    with pytest.raises(ModelNotFoundError) as info:
        _router().route(requested)
    message = str(info.value)
    assert requested in message and "'embedder'" in message and "'classifier'" in message
    assert info.value.param == "model"


def test_an_unknown_version_names_the_versions_served():
    with pytest.raises(ModelNotFoundError, match=r"\['1', '2'\]"):
        _router().route("embedder:3")


def test_a_model_whose_card_is_not_read_yet_is_not_ready():
    router = ModelRouter(["a", "b"], "a")
    router.update(ModelCard("a", (_lane("1"),)))
    assert router.route("a").model == "a"
    with pytest.raises(NotReadyError, match="'b'"):
        router.route("b")
    assert [e["id"] for e in router.entries(LimitsConfig())] == ["a", "a:1"]


def test_a_new_card_replaces_the_old_one():
    router = _router()
    router.update(ModelCard("classifier", (_lane("8", task="classify"),)))
    assert router.route("classifier").lane.version == "8"
    with pytest.raises(ModelNotFoundError):
        router.route("classifier:7")


def test_router_refuses_a_default_it_does_not_serve_and_foreign_cards():
    with pytest.raises(ValueError, match="default"):
        ModelRouter(["a"], "b")
    with pytest.raises(ValueError, match="does not serve"):
        ModelRouter(["a"], "a").update(ModelCard("z", (_lane("1"),)))


def test_listing_has_every_model_by_name_then_by_version_with_the_default_marked():
    entries = _router().entries(LimitsConfig())
    assert [(e["id"], e["role"], e["traffic_share"], e["default"]) for e in entries] == [
        ("embedder", "stable", 0.75, True),
        ("embedder:1", "stable", 0.75, True),
        ("embedder:2", "candidate", 0.25, True),
        ("classifier", "stable", 1.0, False),
        ("classifier:7", "stable", 1.0, False),
    ]
    embed, classify = entries[0], entries[3]
    assert (embed["task"], embed["dimension"], embed["max_tokens"]) == ("embed", 384, 256)
    assert "labels" not in embed
    assert (classify["task"], classify["labels"]) == ("classify", ["neg", "pos"])
    assert "dimension" not in classify
    assert embed["limits"]["max_documents_per_rerank"] == 256  # embedding models rerank too
    assert "max_documents_per_rerank" not in classify["limits"]  # a classifier does not


def test_card_lanes_name_their_deployments_by_role():
    card = ModelCard("m", (_lane("1"), _lane("2", "candidate", 0.1)))
    assert (card.stable.tokenizer, card.stable.inference) == ("Tokenizer", "Inference")
    assert (card.candidate.tokenizer, card.candidate.inference) == (
        "CandidateTokenizer",
        "CandidateInference",
    )
    assert card.versions == ["1", "2"] and card.lane("3") is None
    assert [e["id"] for e in model_entries(card, default=False)] == ["m", "m:1", "m:2"]
