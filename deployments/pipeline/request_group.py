"""Requests grouped by a model's pipeline, and what happens when their clients stop waiting.

A request is abandoned when its client disconnects or its deadline passes: the router's call is cancelled,
and Serve cancels this pipeline's handler for it. Between stages the pipeline swaps abandoned members for an
error that later stages pass on untouched,
so they cost no model time; when every member of a group is gone, the stage call in flight is
cancelled, which Serve propagates to the replica (a cancelled call never joins a batch). No Ray here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from contracts.errors import ServiceError
from contracts.outputs import ResponseOptions
from contracts.tokenized import TokenizeJob
from deployments.pipeline.card import Role
from deployments.pipeline.priority import Priority


class Cancellable(Protocol):
    def cancel(self) -> None: ...


T = TypeVar("T")
C = TypeVar("C", bound=Cancellable)


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One request as the router hands it to its model's pipeline: which version, what to tokenize, how
    to answer. ``version`` is the one on the router's card; unless the client pinned it, the pipeline may
    answer with the version that now holds ``role`` (the card predates a rollout)."""

    tokenize: TokenizeJob
    options: ResponseOptions
    version: str
    role: Role = "stable"
    pinned: bool = False
    priority: Priority = "interactive"  # the tenant's class: which of its groups form first


@dataclass(slots=True, eq=False)
class PipelineJob:
    """One request inside the pipeline (never crosses a process boundary, hence mutable)."""

    tokenize: TokenizeJob
    options: ResponseOptions
    version: str = ""  # the model version (lane) this request goes to
    request_id: str = ""
    priority: Priority = "interactive"
    abandoned: bool = False
    group: RequestGroup | None = field(default=None, repr=False)

    def abandon(self) -> None:
        if not self.abandoned:
            self.abandoned = True
            if self.group is not None:
                self.group.member_left()


class RequestGroup:
    """The members of one pipeline group and the stage call currently in flight for them."""

    __slots__ = ("_in_flight", "_live", "jobs")

    def __init__(self, jobs: list[PipelineJob]) -> None:
        self.jobs = jobs
        self._live = sum(not j.abandoned for j in jobs)
        self._in_flight: Cancellable | None = None
        for job in jobs:
            job.group = self

    @property
    def all_gone(self) -> bool:
        return self._live == 0

    def member_left(self) -> None:
        self._live -= 1
        if self._live == 0 and self._in_flight is not None:
            self._in_flight.cancel()

    def sending(self, call: C) -> C:
        """Track ``call`` (a stage's DeploymentResponse) so it is cancelled if every member leaves."""
        self._in_flight = call
        if self.all_gone:
            call.cancel()
        return call

    def keep_live(self, results: list[T | ServiceError], gone: ServiceError) -> list[T | ServiceError]:
        """Results for the next stage, with abandoned members replaced by ``gone``."""
        if len(results) != len(self.jobs):
            raise RuntimeError(f"stage returned {len(results)} results for {len(self.jobs)} requests")
        return [gone if job.abandoned else r for job, r in zip(self.jobs, results, strict=True)]

    def release(self) -> None:
        self._in_flight = None
        for job in self.jobs:
            job.group = None
