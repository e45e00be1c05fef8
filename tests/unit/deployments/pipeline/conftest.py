"""Fixtures for the pipeline's deployments run as plain classes (no Ray cluster)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import ray.serve.batching

from deployments.link.server import LinkServer
from deployments.pipeline.inference import InferenceDeployment


@pytest.fixture
def serve_batch_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lets ``Inference``'s real ``@serve.batch`` queue run outside a replica, on the test's own loop."""
    # The queue reads its replica's max_ongoing_requests (for a warning) when it starts.
    context = SimpleNamespace(_deployment_config=SimpleNamespace(max_ongoing_requests=128))
    monkeypatch.setattr(ray.serve.batching.serve, "get_replica_context", lambda: context)
    # That stand-in context is the batch queue's only: the replica listens on no link socket here.
    monkeypatch.setattr(LinkServer, "for_replica", classmethod(lambda cls, *args, **kwargs: None))
    # Serve makes the queue once per class (a replica holds one instance), on the loop of its first call:
    # each test, on a loop of its own, needs a new one.
    lazy = InferenceDeployment.func_or_class._infer_batch.set_max_batch_size.__self__
    monkeypatch.setattr(lazy, "_queue", None)
