"""Application builder named by ``serve_config.yaml`` (``import_path: deployments.app:build_app``)."""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from deployments.config import AppArgs
from deployments.inference import InferenceDeployment
from deployments.ingress import Ingress
from deployments.model_repo import resolve_model
from deployments.stages import SerializerDeployment, TokenizerDeployment


def build_app(args: dict[str, Any]) -> Application:
    """Build the graph. Refuses (raises ManifestError naming the field) when the model does not check out."""
    config = AppArgs.model_validate(args or {})
    model = resolve_model(config.model, hash_files=config.runtime.verify_checksums)
    tokenizer = TokenizerDeployment.bind(model)
    inference = InferenceDeployment.bind(model, config.model.device, config.runtime)
    serializer = SerializerDeployment.bind()
    return Ingress.bind(tokenizer, inference, serializer, model, config.limits)
