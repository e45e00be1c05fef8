"""Request bodies of the HTTP API, validated strictly (no type coercion, no unknown fields)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# A text must hold at least one character; whitespace-only text is a valid (if odd) input.
Text = Annotated[str, Field(min_length=1)]


class _StrictRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class EmbeddingsRequest(_StrictRequest):
    """OpenAI-compatible ``POST /v1/embeddings`` body."""

    input: Text | Annotated[list[Text], Field(min_length=1)]
    model: str | None = Field(default=None, description="Served model name, optionally `name:version`.")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="Keep the first N dimensions and re-normalize."
    )
    user: str | None = Field(default=None, description="Accepted for OpenAI compatibility; unused.")
    truncate: bool = Field(
        default=False, description="Truncate inputs over the model's token limit instead of 400."
    )

    @property
    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


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
