"""A model application's ingress: its pipeline (tokenize → infer → serialize, in groups) and its card.

The router sends each request here, to its model. Concurrent requests travel the stages as one group per
call, so a hop's fixed cost is shared by the group; batches for the model itself form in Inference, the one
place they do. The one shortcut: a small group (``inline_chars``) is tokenized and serialized right here, as
the hops to the stage replicas cost more than the work; its inference still runs in Inference. The card
tells the router which versions are served and with which share of traffic.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, replace
from typing import Any

from ray import serve
from ray.serve.exceptions import RayServeException

from contracts.errors import DeadlineExceededError, ModelNotFoundError, ServiceError
from contracts.outputs import ModelIdentity, SerializedResponse
from contracts.tokenized import EncodedTexts, TokenizeJob
from deployments.config import ObservabilityConfig
from deployments.link.server import LINK_DRAIN_S, LinkServer
from deployments.observability.setup import setup_replica
from deployments.pipeline.card import LaneCard, ModelCard, Role
from deployments.pipeline.inference_calls import InferenceCalls
from deployments.pipeline.priority import Priority, PriorityPolicy
from deployments.pipeline.remote_errors import as_service_error
from deployments.pipeline.request_group import ModelRequest, PipelineJob, RequestGroup
from deployments.pipeline.slot_batcher import SlotBatcher
from deployments.pipeline.stage_work import SerializeWork, TokenizeWork, group_chars
from deployments.pipeline.transport import carrying_any_size
from deployments.repository.manifest import ResolvedModel
from deployments.user_config import PipelineConfig
from preprocess.tokenize import TokenDetails

READY_TIMEOUT_S = 5.0
# Groups in flight at once, so the stages overlap (one group infers while the next tokenizes); bulk groups
# take at most one of them, so the other is always there for interactive work.
MAX_GROUPS_IN_FLIGHT = 2
_DEFAULTS = PipelineConfig()
# Stands in for a request whose client went away or whose deadline passed: later stages pass errors on
# untouched, so it costs no model time. Nobody reads it (the caller is gone).
_GONE = DeadlineExceededError("the client went away or the deadline passed before the model ran")

Answer = SerializedResponse | ServiceError


@dataclass(frozen=True)
class ServedVersion:
    """One served version's model and its tokenizer and inference deployments (DeploymentHandles in the
    replica; bound Applications while the graph is built)."""

    model: ResolvedModel
    tokenizer: Any
    inference: Any

    @property
    def version(self) -> str:
        return self.model.manifest.version


# max_surge_percent=100 on every deployment of a model application: a new version's replicas start before
# the old ones stop (blue-green). Serve's default (0) stops first: with one replica per stage, a draining
# pipeline replica's groups then wait on stages that have no replica until the new ones load the model.
@serve.deployment(
    name="Model",
    ray_actor_options={"num_cpus": 0.05},
    max_ongoing_requests=1024,
    max_queued_requests=256,
    max_surge_percent=100,
)
class ModelDeployment:
    def __init__(
        self,
        versions: list[ServedVersion],
        serializer: Any,
        observability: ObservabilityConfig,
    ) -> None:
        """``versions``: stable first, then the candidate, if any."""
        # Every stage call carries any group the router accepts (pipeline/transport.py).
        versions = [
            replace(
                v,
                tokenizer=carrying_any_size(v.tokenizer, name="Tokenizer"),
                inference=carrying_any_size(v.inference, name="Inference"),
            )
            for v in versions
        ]
        self._versions = {v.version: v for v in versions}
        self._order = [v.version for v in versions]
        self._serializer = carrying_any_size(serializer, name="Serializer")
        tracing = setup_replica(observability)
        self._tokenize = {v.version: TokenizeWork(v.model, tracing) for v in versions}
        self._serialize = SerializeWork(tracing, [v.model for v in versions])
        self._config = _DEFAULTS
        # Groups form when one of the two slots is free (not Serve's @serve.batch, which forms a group
        # when its window ends and then queues it for a slot: groups of one at a window of 0).
        self._groups: SlotBatcher[PipelineJob, Answer] = SlotBatcher(
            self._pipeline,
            _DEFAULTS.max_group_size,
            _DEFAULTS.group_wait_timeout_s,
            MAX_GROUPS_IN_FLIGHT,
            priority_of=_priority,
            priorities=_priorities(_DEFAULTS),
            cost_of=_inputs,
            max_batch_cost=_DEFAULTS.max_group_inputs,
        )
        # The router's requests from this node come over a Unix socket (deployments/link/), the others
        # by Serve's handle; both end in run(). The calls to Inference go the same way.
        self._link = LinkServer.for_replica(self.run)
        inference = {v.version: v.inference for v in versions}
        self._inference = InferenceCalls(inference, _DEFAULTS.inference_link, _app_name())
        self._start_links()  # Serve runs the constructor on the replica's event loop

    def _start_links(self) -> None:
        if self._link is not None:
            self._link.start()
        self._inference.start()

    def __del__(self) -> Coroutine[Any, Any, None] | None:
        # Serve calls this once its own requests have drained, and awaits what it returns: the link's
        # requests may still be running. (A coroutine, not an async __del__: garbage collection calls it
        # too, outside Serve, and must not leave one unawaited.)
        inference = getattr(self, "_inference", None)
        if inference is not None:
            inference.stop()
        link, self._link = getattr(self, "_link", None), None
        return link.close(LINK_DRAIN_S) if link is not None else None

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        self._config = PipelineConfig.model_validate(user_config)
        self._groups.max_batch_size = self._config.max_group_size
        self._groups.max_batch_cost = self._config.max_group_inputs
        self._groups.wait_s = self._config.group_wait_timeout_s
        self._groups.scheduler.policy = _priorities(self._config)
        self._inference.use_link = self._config.inference_link

    def card(self) -> ModelCard:
        share = self._config.candidate_share if len(self._order) > 1 else 0.0
        roles: list[tuple[Role, float]] = [("stable", 1.0 - share), ("candidate", share)]
        lanes = tuple(
            LaneCard.of(self._versions[v].model.manifest, role, s)
            for v, (role, s) in zip(self._order, roles, strict=False)
        )
        link = self._link.path.name if self._link is not None else None
        return ModelCard(name=self._versions[self._order[0]].model.manifest.name, lanes=lanes, link=link)

    async def ready(self) -> list[ModelIdentity]:
        """Answers once every served version has an inference replica with its model loaded."""
        self._start_links()
        calls = [self._versions[v].inference.ready.remote() for v in self._order]
        try:
            return list(await asyncio.wait_for(asyncio.gather(*calls), READY_TIMEOUT_S))
        except BaseException:
            for call in calls:
                call.cancel()
            raise

    async def run(self, request: ModelRequest) -> Answer:
        """One request through the stages, in a group with whatever else arrives meanwhile."""
        job = PipelineJob(
            request.tokenize,
            request.options,
            self._version_for(request),
            request.tokenize.request_id,
            request.priority,
        )
        try:
            return await self._groups.submit(job)
        except asyncio.CancelledError:  # the router's call was cancelled: its client left or timed out
            job.abandon()
            raise

    def tokenize(self, job: TokenizeJob, version: str) -> list[TokenDetails] | ServiceError:
        """``/tokenize``: the version's tokenizer on the request's texts, here (no other stage is needed)."""
        work = self._tokenize.get(version) or self._tokenize[self._order[0]]
        try:
            return work.details(job)
        except ServiceError as exc:
            return exc

    def _version_for(self, request: ModelRequest) -> str:
        """The router's card can lag a rollout by its refresh period: a request that did not pin its
        version goes to the version that holds its role now (stable, or the candidate while one is served)."""
        if request.version in self._versions or request.pinned:
            return request.version
        return self._order[1] if request.role == "candidate" and len(self._order) > 1 else self._order[0]

    async def _pipeline(self, jobs: list[PipelineJob]) -> list[Answer]:
        """One group: each version's members through that version's stages, concurrently."""
        by_version: dict[str, list[int]] = {}
        for i, job in enumerate(jobs):
            by_version.setdefault(job.version, []).append(i)
        parts = await asyncio.gather(
            *(self._through_stages([jobs[i] for i in idx], version) for version, idx in by_version.items())
        )
        results: list[Answer] = [_GONE] * len(jobs)
        for idx, part in zip(by_version.values(), parts, strict=True):
            for i, result in zip(idx, part, strict=True):
                results[i] = result
        return results

    async def _through_stages(self, jobs: list[PipelineJob], version: str) -> list[Answer]:
        served = self._versions.get(version)
        if served is None:  # the router's card predates a rollout: that version is gone
            gone = ModelNotFoundError(
                f"version {version!r} is not served now; served: {self._order}", "model"
            )
            return [gone] * len(jobs)
        group = RequestGroup(jobs)
        tokenize = [j.tokenize for j in jobs]
        options = [j.options for j in jobs]
        decimals = self._config.float_decimals
        inline = group_chars(tokenize) <= self._config.inline_chars
        priority = jobs[0].priority  # a group holds one class (the SlotBatcher's rule)
        try:
            if inline:
                encoded: list[Any] = self._tokenize[version].encode(tokenize)
            else:
                encoded = await group.sending(served.tokenizer.encode.remote(tokenize))
            outputs: list[Any] = group.keep_live(encoded, _GONE)
            if any(isinstance(e, EncodedTexts) for e in outputs):
                share = self._config.batch_min_share
                answers = await self._inference.infer(version, group, outputs, priority, share)
                outputs = group.keep_live(answers, _GONE)
            if all(isinstance(o, ServiceError) for o in outputs):
                return outputs
            if inline:
                results: list[Answer] = self._serialize.serialize(outputs, options, decimals)
            else:
                results = await group.sending(self._serializer.serialize.remote(outputs, options, decimals))
        except (Exception, asyncio.CancelledError) as exc:
            if group.all_gone:  # cancelled on purpose: nobody is waiting for these answers
                return [_GONE] * len(jobs)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return [as_service_error(exc)] * len(jobs)  # a stage failed as a whole (wrapped by Ray)
        finally:
            group.release()
        return results


def _priority(job: PipelineJob) -> Priority:
    return job.priority


def _inputs(job: PipelineJob) -> int:
    return job.tokenize.inputs


def _priorities(config: PipelineConfig) -> PriorityPolicy:
    """Bulk groups take at most one of the slots: the other is always there for interactive ones."""
    return PriorityPolicy(batch_slots=MAX_GROUPS_IN_FLIGHT - 1, batch_min_share=config.batch_min_share)


def _app_name() -> str | None:
    """This replica's application; None outside Serve (unit tests), where nothing listens."""
    try:
        return serve.get_replica_context().app_name
    except RayServeException:
        return None
