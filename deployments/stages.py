"""The tokenizer and serializer deployments: thin Ray Serve adapters over preprocess/ and postprocess/.

Both take a group of requests per call (the ingress groups concurrent requests) and answer each
one with a result or its own error, so one bad request never fails the others.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ray import serve

from deployments.config import SerializerConfig
from deployments.manifest import ResolvedModel
from postprocess.contracts import ModelOutput, ResponseOptions, SerializedResponse
from postprocess.render import serialize
from preprocess.contracts import EncodedTexts, TokenizeJob
from preprocess.errors import InternalError, ServiceError
from preprocess.tokenize import TextTokenizer

log = logging.getLogger("ray.serve")


@serve.deployment(name="Tokenizer", ray_actor_options={"num_cpus": 0.2}, max_ongoing_requests=64)
class TokenizerDeployment:
    def __init__(self, model: ResolvedModel) -> None:
        self._tokenizer = TextTokenizer(model.tokenizer_file, model.manifest.input.max_tokens)

    def encode(self, jobs: list[TokenizeJob]) -> list[EncodedTexts | ServiceError]:
        results: list[EncodedTexts | ServiceError] = []
        for job in jobs:
            try:
                encoded = self._tokenizer.encode(job.texts, job.truncate)
                results.append(
                    dataclasses.replace(encoded, deadline=job.deadline) if job.deadline else encoded
                )
            except ServiceError as exc:
                results.append(exc)
            except Exception:  # a bug on one request's input must not fail the others in its group
                log.exception("tokenizer failed on a request")
                results.append(InternalError("tokenization failed for this request"))
        return results


@serve.deployment(name="Serializer", ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=64)
class SerializerDeployment:
    def __init__(self) -> None:
        self._config = SerializerConfig()

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        self._config = SerializerConfig.model_validate(user_config)

    def serialize(
        self, outputs: list[ModelOutput | ServiceError], options: list[ResponseOptions]
    ) -> list[SerializedResponse | ServiceError]:
        if len(outputs) != len(options):
            raise RuntimeError(f"{len(outputs)} outputs for {len(options)} requests")
        results: list[SerializedResponse | ServiceError] = []
        for output, opts in zip(outputs, options, strict=True):
            if isinstance(output, ServiceError):
                results.append(output)
                continue
            try:
                results.append(serialize(output, opts, self._config.float_decimals))
            except ServiceError as exc:
                results.append(exc)
            except Exception:
                log.exception("serializer failed on a request")
                results.append(InternalError("serialization failed for this request"))
        return results
