"""The tokenizer and serializer deployments: thin Ray Serve adapters over stage_work (preprocess/ and
postprocess/ underneath).

Both take a group of requests per call from the model's pipeline, which sends them only groups too large
to handle on its own loop (deployments/pipeline/model.py), and answer each request with a result or its
own error, so one bad request never fails the others.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from ray import serve

from contracts.errors import ServiceError
from contracts.outputs import ModelOutput, ResponseOptions, SerializedResponse
from contracts.tokenized import EncodedTexts, TokenizeJob
from deployments.config import ObservabilityConfig
from deployments.observability.setup import setup_replica
from deployments.pipeline.stage_work import SerializeWork, TokenizeWork, group_chars
from deployments.repository.manifest import ResolvedModel

# A small group is tokenized or serialized on the replica's event loop: a few texts take tens of
# microseconds, less than the hop to a worker thread and back. Bounded by size, not count, so one huge
# text never holds the loop; larger groups go to the stage's own threads.
ON_LOOP_CHARS = 16384  # characters to tokenize
ON_LOOP_VALUES = 32768  # floats to serialize (64 embeddings of 384 or more of smaller ones)
STAGE_THREADS = 2


@serve.deployment(  # max_surge_percent: blue-green, deployments/pipeline/model.py says why
    name="Tokenizer",
    ray_actor_options={"num_cpus": 0.2},
    max_ongoing_requests=64,
    max_queued_requests=256,
    max_surge_percent=100,
)
class TokenizerDeployment:
    def __init__(self, model: ResolvedModel, observability: ObservabilityConfig) -> None:
        self._work = TokenizeWork(model, setup_replica(observability))
        self._threads = ThreadPoolExecutor(max_workers=STAGE_THREADS, thread_name_prefix="tokenize")

    async def encode(self, jobs: list[TokenizeJob]) -> list[EncodedTexts | ServiceError]:
        if group_chars(jobs) <= ON_LOOP_CHARS:
            return self._work.encode(jobs)
        return await asyncio.get_running_loop().run_in_executor(self._threads, self._work.encode, jobs)


@serve.deployment(  # max_surge_percent: blue-green, deployments/pipeline/model.py says why
    name="Serializer",
    ray_actor_options={"num_cpus": 0.1},
    max_ongoing_requests=64,
    max_queued_requests=256,
    max_surge_percent=100,
)
class SerializerDeployment:
    def __init__(self, observability: ObservabilityConfig, models: list[ResolvedModel]) -> None:
        """``models``: the served versions, whose manifests hold their int8 ranges."""
        self._work = SerializeWork(setup_replica(observability), models)
        self._threads = ThreadPoolExecutor(max_workers=STAGE_THREADS, thread_name_prefix="serialize")

    async def serialize(
        self,
        outputs: list[ModelOutput | ServiceError],
        options: list[ResponseOptions],
        float_decimals: int | None,
    ) -> list[SerializedResponse | ServiceError]:
        """``float_decimals``: the model pipeline's (its user_config), so both places render alike."""
        if sum(o.values.size for o in outputs if not isinstance(o, ServiceError)) <= ON_LOOP_VALUES:
            return self._work.serialize(outputs, options, float_decimals)
        return await asyncio.get_running_loop().run_in_executor(
            self._threads, self._work.serialize, outputs, options, float_decimals
        )
