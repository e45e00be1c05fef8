"""Background traffic for the rollout and scaling tests: a few client threads, every answer recorded."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass(frozen=True, slots=True)
class Answer:
    at: float  # monotonic time the answer arrived
    status: int  # HTTP status, or 0 when the request itself failed (connection error, timeout)
    version: str | None  # X-Model-Version


@dataclass
class Traffic:
    """``workers`` threads posting ``body`` to ``url`` back to back until stopped (or ``limit_s``)."""

    url: str
    body: dict[str, Any]
    workers: int = 4
    limit_s: float = 300.0
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> Traffic:
        deadline = time.monotonic() + self.limit_s
        for _ in range(self.workers):
            thread = threading.Thread(target=self._run, args=(deadline,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def _run(self, deadline: float) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set() and time.monotonic() < deadline:
                try:
                    r = client.post(self.url, json=self.body)
                    answer = Answer(time.monotonic(), r.status_code, r.headers.get("x-model-version"))
                except httpx.HTTPError:
                    answer = Answer(time.monotonic(), 0, None)
                with self._lock:
                    self.answers.append(answer)

    def snapshot(self) -> list[Answer]:
        with self._lock:
            return list(self.answers)

    def wait_for(self, predicate: Callable[[list[Answer]], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate(self.snapshot()):
                return True
            time.sleep(0.2)
        return False


def failures(answers: list[Answer]) -> list[Answer]:
    return [a for a in answers if a.status != 200]


def error_code(resp: httpx.Response) -> str | None:
    """The service's error code of a non-200 answer (None for a 200); flags a body not in the error format."""
    if resp.status_code == 200:
        return None
    try:
        return str(resp.json()["error"]["code"])
    except Exception:
        return f"<not the error format: {resp.text[:200]!r}>"
