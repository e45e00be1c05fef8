"""The tokenizer and serializer deployments: thin Ray Serve adapters over preprocess/ and postprocess/."""

from __future__ import annotations

from typing import Any

from ray import serve

from deployments.config import SerializerConfig
from deployments.manifest import ResolvedModel
from postprocess.contracts import ModelOutput, ResponseOptions, SerializedResponse
from postprocess.render import serialize
from preprocess.contracts import EncodedTexts
from preprocess.tokenize import TextTokenizer


@serve.deployment(name="Tokenizer", ray_actor_options={"num_cpus": 0.2}, max_ongoing_requests=64)
class TokenizerDeployment:
    def __init__(self, model: ResolvedModel) -> None:
        self._tokenizer = TextTokenizer(model.tokenizer_file, model.manifest.input.max_tokens)

    def encode(self, texts: list[str], truncate: bool) -> EncodedTexts:
        return self._tokenizer.encode(texts, truncate)


@serve.deployment(name="Serializer", ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=64)
class SerializerDeployment:
    def __init__(self) -> None:
        self._config = SerializerConfig()

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        self._config = SerializerConfig.model_validate(user_config)

    def serialize(self, output: ModelOutput, options: ResponseOptions) -> SerializedResponse:
        return serialize(output, options, self._config.float_decimals)
