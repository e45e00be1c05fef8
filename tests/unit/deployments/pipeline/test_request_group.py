"""Abandoned requests (client gone, deadline passed) are dropped between stages and cancel the call."""

from __future__ import annotations

import pytest

from contracts.errors import DeadlineExceededError
from contracts.outputs import ResponseOptions
from contracts.tokenized import TokenizeJob
from deployments.pipeline.request_group import PipelineJob, RequestGroup

GONE = DeadlineExceededError("gone")


class FakeCall:
    def __init__(self) -> None:
        self.cancelled = 0

    def cancel(self) -> None:
        self.cancelled += 1


def _jobs(n: int) -> list[PipelineJob]:
    return [PipelineJob(TokenizeJob([f"text {i}"]), ResponseOptions(route="predict")) for i in range(n)]


def test_abandoned_members_are_replaced_before_the_next_stage():
    jobs = _jobs(3)
    group = RequestGroup(jobs)
    jobs[1].abandon()
    assert group.keep_live(["a", "b", "c"], GONE) == ["a", GONE, "c"]
    assert not group.all_gone


def test_call_in_flight_is_cancelled_only_when_every_member_left():
    jobs = _jobs(2)
    group = RequestGroup(jobs)
    call = group.sending(FakeCall())
    jobs[0].abandon()
    assert call.cancelled == 0
    jobs[0].abandon()  # twice is once
    assert call.cancelled == 0
    jobs[1].abandon()
    assert call.cancelled == 1 and group.all_gone


def test_a_call_sent_for_a_group_already_gone_is_cancelled_at_once():
    jobs = _jobs(1)
    group = RequestGroup(jobs)
    jobs[0].abandon()
    assert group.sending(FakeCall()).cancelled == 1


def test_after_release_leaving_cancels_nothing():
    jobs = _jobs(1)
    group = RequestGroup(jobs)
    call = group.sending(FakeCall())
    group.release()
    jobs[0].abandon()
    assert call.cancelled == 0 and jobs[0].abandoned


def test_a_stage_answering_the_wrong_number_of_results_is_an_error():
    group = RequestGroup(_jobs(2))
    with pytest.raises(RuntimeError, match="1 results for 2 requests"):
        group.keep_live(["only one"], GONE)
