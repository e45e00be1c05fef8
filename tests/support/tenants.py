"""Fixtures: a tenants file written with the real tool (search: one model, 2 req/s; bulk: batch, 600
input tokens/min), and a clock the tests move by hand."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from deployments.tools import keys


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class TenantsSetup:
    path: Path
    search_key: str
    bulk_key: str


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def tenants(tmp_path: Path) -> TenantsSetup:
    path = tmp_path / "tenants.yaml"
    keys.set_policy(path, "search", {"models": ("all-MiniLM-L6-v2",), "requests_per_s": 2.0})
    keys.set_policy(path, "bulk", {"priority": "batch", "input_tokens_per_min": 600.0})
    return TenantsSetup(path, keys.add_key(path, "search", None), keys.add_key(path, "bulk", "bulk-a"))
