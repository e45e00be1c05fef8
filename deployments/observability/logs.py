"""Asynchronous structured logging: one JSON object per line, written off the caller's thread.

The caller only merges the message and puts the record on an in-memory queue; a background
``QueueListener`` thread does the JSON encoding and the write (stderr by default, which Ray captures
into the replica's log files). No Ray import here: the Serve context is looked up lazily, once.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import logging
import logging.handlers
import queue
import sys
import threading
import uuid
from datetime import datetime, timezone
from typing import Any, Protocol

import orjson

_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("textserve_request_id", default=None)

# Attributes every LogRecord has; anything else on a record came from the caller's ``extra``.
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
    "request_id",
}
_JSON_OPTS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


class TextStream(Protocol):
    """What the sink writes to: sys.stderr, a StringIO, any text stream."""

    def write(self, text: str, /) -> object: ...

    def flush(self) -> object: ...


def set_request_id(request_id: str | None) -> contextvars.Token[str | None]:
    """Bind ``request_id`` to the current context (task or thread); returns a token for ``reset``."""
    return _request_id.set(request_id)


def get_request_id() -> str | None:
    return _request_id.get()


def reset_request_id(token: contextvars.Token[str | None]) -> None:
    _request_id.reset(token)


def new_request_id() -> str:
    return uuid.uuid4().hex


def _serve_context() -> dict[str, str]:
    """Deployment and replica names when running inside a Ray Serve replica, else nothing."""
    # A process that never imported Ray Serve is not a replica: don't pay a multi-second import to learn it.
    serve = sys.modules.get("ray.serve")
    if serve is None:
        return {}
    try:
        ctx = serve.get_replica_context()
        return {"app": str(ctx.app_name), "deployment": str(ctx.deployment), "replica": str(ctx.replica_tag)}
    except Exception:  # not in a replica (driver, tests) or an API change: logging must not fail over it
        return {}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, msg, request_id, Serve context, exc, extras."""

    def __init__(self) -> None:
        super().__init__()
        self._serve: dict[str, str] | None = None

    def format(self, record: logging.LogRecord) -> str:
        if self._serve is None:
            # Computed once per formatter: the replica context is set before the deployment's
            # constructor runs, which is where configure_logging is called.
            self._serve = _serve_context()
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(timespec="microseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or _request_id.get(),
            **self._serve,
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exc"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRS and key not in doc:
                doc[key] = value
        try:
            return orjson.dumps(doc, default=str, option=_JSON_OPTS).decode()
        except TypeError:  # orjson.JSONEncodeError is a TypeError
            # e.g. an int over 64 bits, which orjson refuses without calling ``default``: keep the line.
            return orjson.dumps(
                {k: _encodable(v) for k, v in doc.items()}, default=str, option=_JSON_OPTS
            ).decode()


def _encodable(value: Any) -> Any:
    try:
        orjson.dumps(value, default=str, option=_JSON_OPTS)
    except TypeError:
        return str(value)
    return value


class _DroppingQueueHandler(logging.handlers.QueueHandler):
    """Enqueues without ever blocking; below WARNING, drops (and counts) once ``capacity`` is queued.

    The queue itself is unbounded and only DEBUG/INFO are admitted against ``capacity``. WARNING and
    above always go in, so the headroom above ``capacity`` is reserved for them: a warning burst can
    neither block the caller (a bounded ``put`` would stall the replica's event loop) nor be lost
    (those are the lines an incident needs). The price is that a stuck sink plus a warning storm grows
    memory; warnings come from error paths, whose rate the service bounds far more tightly than INFO.
    """

    def __init__(self, q: queue.Queue[logging.LogRecord | None], capacity: int) -> None:
        super().__init__(q)
        self._q = q
        self._capacity = capacity
        self._dropped = 0
        self._drop_lock = threading.Lock()

    @property
    def dropped(self) -> int:
        with self._drop_lock:
            return self._dropped

    def emit(self, record: logging.LogRecord) -> None:
        # qsize() races with other producers by a few records at most: a soft bound is all we need.
        if record.levelno < logging.WARNING and self._q.qsize() >= self._capacity:
            with self._drop_lock:
                self._dropped += 1
            return
        try:
            self._q.put_nowait(self.prepare(record))
        except Exception:
            self.handleError(record)

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        # ``msg % args`` now, on the caller's thread: args may be mutable (a dict, a list, an array)
        # or not thread-safe to str(); formatting later would log their state at drain time.
        # Setting msg to the merged text and args to None leaves getMessage() unchanged for any other
        # handler, so the record is updated in place rather than copied.
        record.msg = record.message = record.getMessage()
        record.args = None
        # The request id lives in a contextvar of the caller's task; the listener thread can't see it.
        if getattr(record, "request_id", None) is None:
            record.request_id = _request_id.get()
        # exc_info stays: the traceback keeps its frames alive until written, and formatting it
        # (source lines read through linecache) is the costly part, so the listener does it.
        return record


class LogPipeline:
    """A configured logger: its queue handler, the listener thread and the sink."""

    def __init__(
        self, logger: logging.Logger, level: str, queue_size: int, stream: TextStream | None
    ) -> None:
        self.logger = logger
        self.settings = (logger.name, level, queue_size, stream)
        self._queue: queue.Queue[logging.LogRecord | None] = queue.Queue()
        self._handler = _DroppingQueueHandler(self._queue, queue_size)
        self._sink = logging.StreamHandler(stream if stream is not None else sys.stderr)
        self._sink.setFormatter(JsonFormatter())
        self._listener = logging.handlers.QueueListener(self._queue, self._sink)
        self._previous_propagate = logger.propagate
        self._stopped = False
        self._lock = threading.Lock()
        logger.setLevel(level)
        # Ray Serve attaches its own handlers upstream: propagating would write every line twice.
        logger.propagate = False
        self._listener.start()
        logger.addHandler(self._handler)
        atexit.register(self.stop)

    @property
    def dropped(self) -> int:
        return self._handler.dropped

    @property
    def stopped(self) -> bool:
        return self._stopped

    def stop(self) -> None:
        """Detach from the logger, write everything already accepted, flush the sink. Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        # Detach first: a record enqueued after the sentinel would be lost silently.
        self.logger.removeHandler(self._handler)
        self.logger.propagate = self._previous_propagate
        self._listener.stop()
        atexit.unregister(self.stop)
        # At exit the stream may already be closed (e.g. a test runner's captured stderr): nothing to flush.
        with contextlib.suppress(ValueError, OSError):
            self._sink.flush()


_current: LogPipeline | None = None
_configure_lock = threading.Lock()


def configure_logging(
    logger_name: str = "textserve",
    level: str = "INFO",
    queue_size: int = 10000,
    stream: TextStream | None = None,
) -> LogPipeline:
    """Set up the process's pipeline (a Ray Serve replica is a process); call it from the constructor.

    Calling again with the same arguments returns the running pipeline; different arguments stop the
    old one (flushing it) and start a new one, so a logger never has two queue handlers.
    """
    global _current
    if queue_size < 1:
        raise ValueError("queue_size must be at least 1")
    level = level.upper()
    with _configure_lock:
        if _current is not None and not _current.stopped:
            if _current.settings == (logger_name, level, queue_size, stream):
                return _current
            _current.stop()
        _current = LogPipeline(logging.getLogger(logger_name), level, queue_size, stream)
        return _current


def dropped_records() -> int:
    """DEBUG/INFO records the current pipeline dropped on a full queue (0 when none is configured)."""
    pipeline = _current
    return pipeline.dropped if pipeline is not None else 0
