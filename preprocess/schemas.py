"""Request bodies of the HTTP API, validated strictly (no type coercion, no unknown fields)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# A text must hold at least one character; whitespace-only text is a valid (if odd) input.
Text = Annotated[str, Field(min_length=1)]
Texts = Annotated[list[Text], Field(min_length=1)]
# Token ids as OpenAI's API allows them: the text's own tokens, without the model's special tokens.
TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary"]
EmbeddingTypes = Annotated[list[EmbeddingType], Field(min_length=1)]
_PROMPT_NAME = Field(default=None, description="One of the model's prompts (GET /v1/models lists them).")
_INPUT_TYPE = Field(
    default=None,
    description="Cohere's input type (search_query, search_document, classification, clustering) or a "
    "prompt name: the model's matching prompt is prepended. A model without prompts ignores it.",
)


class _StrictRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class EmbeddingsRequest(_StrictRequest):
    """OpenAI-compatible ``POST /v1/embeddings`` body."""

    input: Text | Texts | TokenIds | Annotated[list[TokenIds], Field(min_length=1)] = Field(
        description="A text, a list of texts, token ids (one input) or a list of token-id lists."
    )
    model: str | None = Field(default=None, description="Served model name, optionally `name:version`.")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = Field(
        default=None,
        description="Keep the first N dimensions and re-normalize: only for models whose manifest declares "
        "matryoshka_dimensions, and N must be one of them.",
    )
    user: str | None = Field(default=None, description="Accepted for OpenAI compatibility; unused.")
    truncate: bool = Field(
        default=False, description="Truncate inputs over the model's token limit instead of 400."
    )
    embedding_types: EmbeddingTypes | None = Field(
        default=None, description="Extension: compact types too (each item's `embeddings`), as in /v2/embed."
    )
    input_type: str | None = _INPUT_TYPE
    prompt_name: str | None = _PROMPT_NAME

    @property
    def texts(self) -> list[str]:
        if isinstance(self.input, str):
            return [self.input]
        return [t for t in self.input if isinstance(t, str)]

    @property
    def token_ids(self) -> list[list[int]] | None:
        """The inputs as token-id lists, when they were sent as ids."""
        if isinstance(self.input, str) or not self.input or isinstance(self.input[0], str):
            return None
        if isinstance(self.input[0], int):
            return [list(self.input)]  # type: ignore[arg-type]
        return [list(ids) for ids in self.input]  # type: ignore[union-attr]


class PredictRequest(_StrictRequest):
    """``POST /predict`` body: exactly one of ``text`` or ``texts``."""

    text: Text | None = None
    texts: Annotated[list[Text], Field(min_length=1)] | None = None
    model: str | None = None
    truncate: bool = False

    @model_validator(mode="after")
    def _exactly_one_input(self) -> PredictRequest:
        if (self.text is None) == (self.texts is None):
            raise ValueError("give exactly one of 'text' (a string) or 'texts' (a list of strings)")
        return self

    @property
    def inputs(self) -> list[str]:
        return [self.text] if self.text is not None else list(self.texts or [])


class RerankRequest(_StrictRequest):
    """``POST /v1/rerank`` and ``/v2/rerank``: Cohere v2's and Jina's rerank body."""

    query: Text
    documents: Texts
    model: str | None = None
    top_n: Annotated[int, Field(ge=1)] | None = Field(default=None, description="Return the best N only.")
    return_documents: bool = Field(default=False, description="Each result also holds its document.")
    max_tokens_per_doc: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="Cut each document to this many tokens (the model's limit applies too)."
    )
    priority: int | None = Field(default=None, description="Accepted for Cohere compatibility; unused.")


class TeiRerankRequest(_StrictRequest):
    """``POST /rerank``: TEI's rerank body."""

    query: Text
    texts: Texts
    model: str | None = None
    raw_scores: bool = Field(default=False, description="A cross-encoder's logit, without its activation.")
    return_text: bool = False
    truncate: bool = Field(default=False, description="Cut texts over the model's limit instead of 400.")
    truncation_direction: Literal["Right"] = "Right"


class CohereEmbedRequest(_StrictRequest):
    """``POST /v2/embed``: Cohere's embed body (texts only)."""

    texts: Texts
    model: str | None = None
    input_type: str | None = _INPUT_TYPE
    embedding_types: EmbeddingTypes | None = Field(default=None, description="Default: float.")
    truncate: Literal["NONE", "END"] = Field(
        default="END", description="END cuts an input over the model's limit; NONE answers 400."
    )
    max_tokens: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="Cut each input to this many tokens."
    )
    output_dimension: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="One of the model's matryoshka_dimensions."
    )
    priority: int | None = Field(default=None, description="Accepted for Cohere compatibility; unused.")


class TokenizeRequest(_StrictRequest):
    """``POST /tokenize``: the served model's tokenizer (and prompt) on texts."""

    input: Text | Texts
    model: str | None = None
    input_type: str | None = _INPUT_TYPE
    prompt_name: str | None = _PROMPT_NAME
    return_offsets: bool = Field(default=False, description="Character offsets into prompt + text per token.")
    truncate: bool = False

    @property
    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class SparseEmbedRequest(_StrictRequest):
    """``POST /embed_sparse``: TEI's sparse embedding body."""

    inputs: Text | Texts
    model: str | None = None
    truncate: bool = False
    prompt_name: str | None = _PROMPT_NAME

    @property
    def texts(self) -> list[str]:
        return [self.inputs] if isinstance(self.inputs, str) else list(self.inputs)
