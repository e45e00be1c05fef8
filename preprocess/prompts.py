"""Which prompt a request's text gets: a model's named prompts (sentence-transformers' ``prompts``),
chosen by Cohere's ``input_type`` or TEI's ``prompt_name``. No Ray, no FastAPI."""

from __future__ import annotations

from collections.abc import Mapping

from contracts.errors import InvalidRequestError
from contracts.tokenized import TokenizeJob

# Cohere's input types and the prompt names models commonly use for them (e5, bge, Qwen3-style).
INPUT_TYPE_ALIASES: dict[str, tuple[str, ...]] = {
    "search_query": ("query", "search_query"),
    "search_document": ("document", "passage", "search_document"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}


def resolve_prompt(
    prompts: Mapping[str, str],
    default: str | None,
    input_type: str | None = None,
    prompt_name: str | None = None,
) -> str:
    """The prefix for every text of the request ("" for none).

    ``prompt_name`` must name one of the model's prompts. ``input_type`` may also be one of Cohere's
    names, matched through its usual aliases; a model without prompts accepts and ignores it (Cohere's
    clients always send one). Anything else is a 400 that lists the model's prompts.
    """
    if input_type is not None and prompt_name is not None:
        raise InvalidRequestError("give input_type or prompt_name, not both", "prompt_name")
    if prompt_name is not None:
        if prompt_name in prompts:
            return prompts[prompt_name]
        raise _unknown("prompt_name", prompt_name, prompts)
    if input_type is not None:
        for name in (input_type, *INPUT_TYPE_ALIASES.get(input_type, ())):
            if name in prompts:
                return prompts[name]
        if not prompts:
            return ""
        raise _unknown("input_type", input_type, prompts)
    return prompts[default] if default is not None else ""


def role_prompt(prompts: Mapping[str, str], input_type: str) -> str:
    """A rerank's query or documents on an embedding model: its prompt for that role, if it has one."""
    return next((prompts[n] for n in INPUT_TYPE_ALIASES[input_type] if n in prompts), "")


def _unknown(field: str, name: str, prompts: Mapping[str, str]) -> InvalidRequestError:
    known = ", ".join(repr(n) for n in sorted(prompts)) or "none"
    hint = f" (or Cohere's {', '.join(INPUT_TYPE_ALIASES)})" if field == "input_type" and prompts else ""
    return InvalidRequestError(f"unknown {field} {name!r}; this model's prompts: {known}{hint}", field)


def rerank_job(
    task: str,
    prompts: Mapping[str, str],
    query: str,
    documents: list[str],
    truncate: bool,
    max_doc_tokens: int | None,
    field: str = "documents",
) -> TokenizeJob:
    """A rerank's inputs. A cross-encoder (task rerank) reads raw pairs; an embedding model embeds the
    query and the documents, each with its prompt for that role when it has one. ``field``: the body's
    field holding the documents (Cohere's ``documents``, TEI's ``texts``), for errors."""
    if task == "rerank":
        return TokenizeJob(documents, truncate, query=query, max_tokens=max_doc_tokens, field=field)
    return TokenizeJob(
        documents,
        truncate,
        prompt=role_prompt(prompts, "search_document"),
        query=query,
        query_prompt=role_prompt(prompts, "search_query"),
        max_tokens=max_doc_tokens,
        field=field,
    )
