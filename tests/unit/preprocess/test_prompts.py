"""Choosing a prompt by Cohere's input_type or TEI's prompt_name."""

from __future__ import annotations

import pytest

from contracts.errors import InvalidRequestError
from preprocess.prompts import rerank_job, resolve_prompt, role_prompt

PROMPTS = {"query": "query: ", "document": "passage: "}


@pytest.mark.parametrize(
    ("input_type", "prompt_name", "want"),
    [
        (None, None, ""),
        ("search_query", None, "query: "),
        ("search_document", None, "passage: "),
        ("query", None, "query: "),
        (None, "document", "passage: "),
    ],
)
def test_prompts_by_name_or_cohere_input_type(input_type, prompt_name, want):
    assert resolve_prompt(PROMPTS, None, input_type, prompt_name) == want


def test_the_default_prompt_applies_when_none_is_named():
    assert resolve_prompt(PROMPTS, "query") == "query: "
    assert resolve_prompt(PROMPTS, "query", prompt_name="document") == "passage: "


@pytest.mark.parametrize(("input_type", "prompt_name"), [("classification", None), (None, "passage")])
def test_an_unknown_name_is_a_400_listing_the_known_ones(input_type, prompt_name):
    with pytest.raises(InvalidRequestError, match="this model's prompts: 'document', 'query'") as err:
        resolve_prompt(PROMPTS, None, input_type, prompt_name)
    assert err.value.param == ("input_type" if input_type else "prompt_name")


def test_a_model_without_prompts_ignores_input_type_but_not_prompt_name():
    assert resolve_prompt({}, None, input_type="search_document") == ""
    with pytest.raises(InvalidRequestError, match="prompts: none"):
        resolve_prompt({}, None, prompt_name="query")


def test_both_fields_at_once_are_refused():
    with pytest.raises(InvalidRequestError, match="not both"):
        resolve_prompt(PROMPTS, None, "search_query", "query")


def test_rerank_jobs_take_role_prompts_on_embedding_models_only():
    assert role_prompt(PROMPTS, "search_query") == "query: " and role_prompt({}, "search_query") == ""
    bi = rerank_job("embed", PROMPTS, "q", ["d"], True, 7)
    assert (bi.query, bi.query_prompt, bi.prompt, bi.max_tokens, bi.texts) == (
        "q",
        "query: ",
        "passage: ",
        7,
        ["d"],
    )
    cross = rerank_job("rerank", PROMPTS, "q", ["d"], False, None)
    assert (cross.query_prompt, cross.prompt, cross.truncate) == ("", "", False)


@pytest.mark.parametrize("task", ["embed", "rerank"])
def test_rerank_jobs_name_the_field_their_documents_came_in(task):
    assert rerank_job(task, PROMPTS, "q", ["d"], True, None).field == "documents"  # Cohere / Jina
    assert rerank_job(task, PROMPTS, "q", ["d"], False, None, "texts").field == "texts"  # TEI
