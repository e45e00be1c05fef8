"""Background traffic for the rollout and scaling tests: a few client threads, every answer recorded."""

from __future__ import annotations

import itertools
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
    # Added for the isolation test; defaulted, so ``Answer(at, status, version)`` still works.
    latency: float | None = None  # seconds from sending the request to its answer (or failure)
    request_id: str | None = None  # the X-Request-Id sent, when ``Traffic.tag`` is set
    detail: str | None = None  # a failure's body (first 300 characters) or the client's exception

    @property
    def sent(self) -> float:
        """Monotonic time the request was sent (``at`` when the latency is unknown)."""
        return self.at - (self.latency or 0.0)


@dataclass
class Traffic:
    """``workers`` threads posting ``body`` to ``url`` back to back until stopped (or ``limit_s``)."""

    url: str
    body: dict[str, Any]
    workers: int = 4
    limit_s: float = 300.0
    timeout_s: float = 30.0  # client timeout per request
    tag: str | None = None  # set: every request carries X-Request-Id "{tag}-{worker}-{n}", recorded
    pause_s: float = 0.0  # each worker waits this long after an answer before its next request
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> Traffic:
        deadline = time.monotonic() + self.limit_s
        for worker in range(self.workers):
            thread = threading.Thread(target=self._run, args=(deadline, worker), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def _run(self, deadline: float, worker: int = 0) -> None:
        with httpx.Client(timeout=self.timeout_s) as client:
            for n in itertools.count():
                if self._stop.is_set() or time.monotonic() >= deadline:
                    return
                request_id = f"{self.tag}-{worker}-{n}" if self.tag else None
                headers = {"x-request-id": request_id} if request_id else None
                sent = time.monotonic()
                try:
                    r = client.post(self.url, json=self.body, headers=headers)
                    done = time.monotonic()
                    detail = None if r.status_code == 200 else r.text[:300]
                    answer = Answer(
                        done, r.status_code, r.headers.get("x-model-version"), done - sent, request_id, detail
                    )
                except httpx.HTTPError as exc:
                    done = time.monotonic()
                    answer = Answer(done, 0, None, done - sent, request_id, repr(exc)[:300])
                with self._lock:
                    self.answers.append(answer)
                if self.pause_s:
                    self._stop.wait(self.pause_s)

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
