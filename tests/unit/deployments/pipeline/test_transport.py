"""Calls between replicas carry any group: gRPC where its limit allows, by reference where it does not."""

from __future__ import annotations

import logging
import pickle
from typing import Any

import numpy as np
import pytest

from contracts.outputs import ModelIdentity, ModelOutput, ResponseOptions, SerializedResponse
from deployments.pipeline import transport
from deployments.pipeline.transport import NEEDED_BYTES, carrying_any_size, grpc_limit
from postprocess.render import serialize


class _Handle:
    def __init__(self, by_reference: bool = False) -> None:
        self.by_reference = by_reference

    def options(self, **kwargs: Any) -> _Handle:
        return _Handle(**{"by_reference": kwargs["_by_reference"]})


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "_warned", set())


def test_a_limit_a_group_may_pass_sends_calls_by_reference_and_says_which_setting(caplog) -> None:
    handle = _Handle()
    with caplog.at_level(logging.WARNING, logger="textserve.transport"):
        chosen = carrying_any_size(handle, limit=4 * 2**20, name="Serializer")
        carrying_any_size(handle, limit=4 * 2**20, name="Serializer")
    assert chosen is not handle and chosen.by_reference
    assert len(caplog.records) == 1 and transport.LIMIT_ENV in caplog.records[0].getMessage()


@pytest.mark.parametrize("limit", [NEEDED_BYTES, 2**31 - 1])
def test_a_limit_every_group_fits_under_keeps_grpc(limit: int) -> None:
    handle = _Handle()
    assert carrying_any_size(handle, limit=limit) is handle


def test_without_grpc_by_default_there_is_no_limit_to_meet(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray.serve._private import constants

    monkeypatch.setattr(constants, "RAY_SERVE_USE_GRPC_BY_DEFAULT", False)
    assert grpc_limit() is None
    handle = _Handle()
    assert carrying_any_size(handle) is handle
    monkeypatch.setattr(constants, "RAY_SERVE_USE_GRPC_BY_DEFAULT", True)
    monkeypatch.setattr(constants, "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH", 4 * 2**20)
    assert grpc_limit() == 4 * 2**20 and carrying_any_size(handle).by_reference


def test_the_largest_default_group_in_every_type_fits_the_bound() -> None:
    """A group at the default cap (512 inputs) of a 4096-wide model, answered in every embedding type,
    pickled as the Serializer's answer travels: well under NEEDED_BYTES."""
    rng = np.random.default_rng(0)
    ranges = np.stack([np.full(4096, -1.0), np.full(4096, 1.0)]).astype(np.float32)
    types = ("float", "int8", "uint8", "binary", "ubinary")
    output = ModelOutput(
        ModelIdentity("wide", "1"), "embed", rng.standard_normal((256, 4096), np.float32), 10
    )
    answer = serialize(output, ResponseOptions(route="cohere_embed", embedding_types=types), 6, ranges)
    assert isinstance(answer, SerializedResponse)
    group_bytes = 2 * len(pickle.dumps(answer))  # two 256-input requests
    assert group_bytes * 4 < NEEDED_BYTES
