"""Async structured logging: JSON lines, request ids, bounded queue, non-blocking callers, flush."""

from __future__ import annotations

import logging
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

import orjson
import pytest

from deployments.observability import logs
from deployments.observability.logs import (
    LogPipeline,
    configure_logging,
    dropped_records,
    get_request_id,
    new_request_id,
    reset_request_id,
    set_request_id,
)

WAIT_S = 30.0  # generous bound for a thread to finish: only reached when the code under test is broken


class Sink:
    """A text stream for the StreamHandler: optionally gated (blocks until released) or slow."""

    def __init__(self, *, gated: bool = False, delay_s: float = 0.0) -> None:
        self.lines: list[str] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        if not gated:
            self.release.set()
        self._delay_s = delay_s

    def write(self, text: str) -> int:
        self.entered.set()
        self.release.wait(WAIT_S)
        if self._delay_s:
            time.sleep(self._delay_s)
        self.lines.extend(text.splitlines())
        return len(text)

    def flush(self) -> None:
        pass

    def records(self) -> list[dict]:
        return [orjson.loads(line) for line in self.lines]


@pytest.fixture
def pipeline() -> Iterator[Callable[..., tuple[LogPipeline, Sink]]]:
    """Builds pipelines over Sinks; releases every gate and stops every pipeline at teardown."""
    made: list[tuple[LogPipeline, Sink]] = []

    def make(sink: Sink | None = None, **kwargs) -> tuple[LogPipeline, Sink]:
        sink = sink or Sink()
        made.append((configure_logging(stream=sink, **kwargs), sink))
        return made[-1]

    yield make
    for p, sink in made:
        sink.release.set()
        p.stop()


def _blocked_on_primer(make: Callable[..., tuple[LogPipeline, Sink]], **kwargs) -> tuple[LogPipeline, Sink]:
    """A pipeline whose listener is stuck writing one primer record: the queue is empty and stays put."""
    p, sink = make(Sink(gated=True), **kwargs)
    p.logger.info("primer")
    assert sink.entered.wait(WAIT_S)
    return p, sink


def _in_thread(fn: Callable[[], None]) -> bool:
    """Run fn in a thread; True when it returned within WAIT_S (a blocked caller would not)."""
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(WAIT_S)
    return not t.is_alive()


def test_json_lines_carry_request_id_and_extras(pipeline, monkeypatch):
    monkeypatch.delitem(sys.modules, "ray.serve", raising=False)  # not a replica: no Serve fields
    p, sink = pipeline(level="debug")
    rid = new_request_id()
    token = set_request_id(rid)
    try:
        p.logger.info("hello %s", "world", extra={"batch": 3, "shape": (2, 4)})
        p.logger.debug("detail")
    finally:
        reset_request_id(token)
    assert get_request_id() is None
    assert _in_thread(lambda: p.logger.warning("from another thread"))
    p.stop()

    first, second, third = sink.records()
    assert first["msg"] == "hello world" and first["level"] == "INFO" and first["logger"] == "textserve"
    assert first["request_id"] == rid and len(rid) == 32 and int(rid, 16) >= 0
    assert first["batch"] == 3 and first["shape"] == [2, 4]
    assert "deployment" not in first and "exc" not in first
    ts = datetime.fromisoformat(first["ts"])
    assert ts.utcoffset() == timedelta(0)
    assert second["level"] == "DEBUG" and second["request_id"] == rid
    # A thread has its own context: the id set above must not leak into it.
    assert third["level"] == "WARNING" and third["request_id"] is None
    assert new_request_id() != new_request_id()


def test_explicit_request_id_extra_wins_and_odd_values_still_make_a_line(pipeline):
    p, sink = pipeline()
    set_request_id("ambient")
    try:
        p.logger.info("x", extra={"request_id": "explicit", "big": 1 << 70, "obj": object()})
    finally:
        set_request_id(None)
    p.stop()
    (line,) = sink.records()
    assert line["request_id"] == "explicit" and line["msg"] == "x"
    assert line["big"] == str(1 << 70) and line["obj"].startswith("<object")


def test_args_are_merged_on_the_caller_thread(pipeline):
    p, sink = _blocked_on_primer(pipeline)
    items = [1]
    p.logger.info("items %s", items)
    items.append(2)  # mutated before the listener gets to the record
    sink.release.set()
    p.stop()
    assert [r["msg"] for r in sink.records()] == ["primer", "items [1]"]


def test_full_queue_drops_info_counts_it_and_keeps_warning(pipeline):
    p, sink = _blocked_on_primer(pipeline, queue_size=10)
    for i in range(15):
        p.logger.info("info %d", i)
    p.logger.debug("debug is below the level: neither queued nor counted")
    p.logger.warning("still here")
    assert p.dropped == 5 and dropped_records() == 5
    sink.release.set()
    p.stop()
    msgs = [r["msg"] for r in sink.records()]
    assert msgs == ["primer", *(f"info {i}" for i in range(10)), "still here"]


def test_warning_burst_on_a_full_queue_neither_blocks_nor_drops(pipeline):
    p, sink = _blocked_on_primer(pipeline, queue_size=5)
    for i in range(5):
        p.logger.info("info %d", i)
    assert _in_thread(lambda: [p.logger.warning("warn %d", i) for i in range(1000)])
    p.logger.info("one too many")
    assert p.dropped == 1
    sink.release.set()
    p.stop()
    warnings = [r for r in sink.records() if r["level"] == "WARNING"]
    assert [r["msg"] for r in warnings] == [f"warn {i}" for i in range(1000)]


def test_caller_never_waits_for_a_stuck_sink(pipeline):
    p, sink = _blocked_on_primer(pipeline)
    assert _in_thread(lambda: [p.logger.info("line %d", i) for i in range(1000)])
    assert sink.lines == []  # every call returned while the sink had not finished one write
    sink.release.set()
    p.stop()
    assert len(sink.records()) == 1001 and p.dropped == 0


def test_caller_time_is_a_small_fraction_of_a_slow_sinks_time(pipeline):
    n, delay_s = 1000, 0.002
    p, sink = pipeline(Sink(delay_s=delay_s))
    start = time.perf_counter()
    for i in range(n):
        p.logger.info("line %d", i)
    caller_s = time.perf_counter() - start
    p.stop()
    sink_s = time.perf_counter() - start  # at least n * delay_s: the sink sleeps that long in total
    assert len(sink.lines) == n and sink_s >= n * delay_s
    # Relative, so a loaded machine slows both sides: a caller waiting on each write would take >= sink_s.
    assert caller_s < sink_s / 4


def test_stop_flushes_everything_accepted_and_detaches(pipeline):
    logger = logging.getLogger("textserve")
    logger.propagate = True
    p, sink = pipeline(Sink(delay_s=0.0005))
    assert logger.propagate is False
    for i in range(300):
        p.logger.info("n %d", i)
    p.stop()
    assert [r["msg"] for r in sink.records()] == [f"n {i}" for i in range(300)]
    assert p.stopped and not any(isinstance(h, logs._DroppingQueueHandler) for h in logger.handlers)
    assert logger.propagate is True
    p.stop()  # idempotent


def test_stop_survives_a_sink_closed_before_it(pipeline):
    # At interpreter exit (atexit) the stream may already be closed, e.g. pytest's captured stderr.
    class ClosedSink(Sink):
        def flush(self) -> None:
            raise ValueError("I/O operation on closed file.")

    p, sink = pipeline(ClosedSink())
    p.logger.info("last words")
    p.stop()
    assert p.stopped
    assert [r["msg"] for r in sink.records()] == ["last words"]


def test_exceptions_are_formatted(pipeline):
    p, sink = pipeline()
    try:
        raise ValueError("bad input")
    except ValueError:
        p.logger.exception("request failed")
    p.stop()
    (line,) = sink.records()
    assert line["level"] == "ERROR" and line["msg"] == "request failed"
    assert line["exc"].startswith("Traceback") and "ValueError: bad input" in line["exc"]
    assert "test_exceptions_are_formatted" in line["exc"]


def test_configure_is_idempotent_and_replaces_cleanly(pipeline):
    first, sink1 = pipeline()
    again = configure_logging(stream=sink1)
    assert again is first
    second, sink2 = pipeline()  # a different stream: the first pipeline is stopped and replaced
    assert first.stopped and not second.stopped
    queue_handlers = [h for h in second.logger.handlers if isinstance(h, logs._DroppingQueueHandler)]
    assert len(queue_handlers) == 1
    second.logger.info("to the second sink")
    second.stop()
    assert sink1.lines == [] and [r["msg"] for r in sink2.records()] == ["to the second sink"]
    with pytest.raises(ValueError):
        configure_logging(queue_size=0)


def test_serve_replica_context_is_added(pipeline, monkeypatch):
    replica = types.SimpleNamespace(app_name="textserve", deployment="Inference", replica_tag="abc123")
    fake_serve = types.SimpleNamespace(get_replica_context=lambda: replica)
    monkeypatch.setitem(sys.modules, "ray.serve", fake_serve)
    p, sink = pipeline()
    p.logger.info("in a replica")
    p.stop()
    (line,) = sink.records()
    assert (line["app"], line["deployment"], line["replica"]) == ("textserve", "Inference", "abc123")


def test_formatter_survives_a_failing_serve_lookup(monkeypatch):
    def no_replica():
        raise RuntimeError("not in a replica")

    monkeypatch.setitem(sys.modules, "ray.serve", types.SimpleNamespace(get_replica_context=no_replica))
    record = logging.LogRecord("textserve", logging.INFO, __file__, 1, "plain %d", (7,), None)
    line = orjson.loads(logs.JsonFormatter().format(record))
    assert line["msg"] == "plain 7" and "deployment" not in line


def test_dropped_records_without_a_pipeline_is_zero(monkeypatch):
    monkeypatch.setattr(logs, "_current", None)
    assert dropped_records() == 0


def test_every_module_logs_into_the_replica_pipeline() -> None:
    """The pipeline serves the "textserve" logger: a module logging under its own name (``deployments.x``)
    would lose its INFO lines (the batch cap rising again, warm-up, profiles written) in the replicas."""
    import importlib
    import pkgutil

    import deployments

    names = {}
    for info in pkgutil.walk_packages(deployments.__path__, "deployments."):
        module = importlib.import_module(info.name)
        log = getattr(module, "log", None)
        if isinstance(log, logging.Logger):
            names[info.name.rsplit(".", 1)[-1]] = log.name
    assert {"batching", "runner_base", "torch_runner", "inference"} <= set(names)
    stray = {m: n for m, n in names.items() if not n.startswith(("textserve.", "ray.serve"))}
    assert not stray, stray
