"""``torch.profiler`` over the next N inference batches, behind a config flag (``runtime.torch_profiler``).

Enabled, it profiles N consecutive batches, writes a Chrome trace and an operator table into
``out_dir`` and switches itself off; disabled, ``batch()`` hands back one shared no-op context.
torch is imported only when a profile actually starts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.profiler import profile

log = logging.getLogger("textserve.profiling")

# nullcontext keeps no state, so one instance serves every disabled batch: no allocation per call.
_NOOP: contextlib.AbstractContextManager[None] = contextlib.nullcontext()


class BatchProfiler:
    """Profiles the next ``batches`` batches once, then turns itself off.

    Use it on the thread that runs the model (the inference executor's single thread): the profiler
    starts at the first profiled batch and stops at the last, and both must happen on one thread,
    which is also the thread whose CPU ops it records. Not for concurrent use from several threads.
    """

    def __init__(self, enabled: bool, out_dir: str, batches: int = 20) -> None:
        if batches < 1:
            raise ValueError("batches must be at least 1")
        self._enabled = enabled
        self._out_dir = Path(out_dir)
        self._batches = batches
        self._done = 0
        self._profile: profile | None = None
        self._uses_cuda = False
        self.written: tuple[Path, ...] = ()

    @property
    def enabled(self) -> bool:
        """True until the profile has been written (or failed)."""
        return self._enabled

    def batch(self) -> contextlib.AbstractContextManager[None]:
        """Wrap one batch: ``with profiler.batch(): run(batch)``."""
        if not self._enabled:
            return _NOOP
        return self._profiled_batch()

    @contextlib.contextmanager
    def _profiled_batch(self) -> Iterator[None]:
        if self._profile is None and not self._start():
            yield
            return
        import torch.profiler

        try:
            with torch.profiler.record_function(f"batch {self._done}"):
                yield
        finally:
            # A failing batch still counts: it is part of what was profiled.
            self._done += 1
            if self._done >= self._batches:
                self._finish()

    def _start(self) -> bool:
        try:
            import torch
            import torch.profiler

            activities = [torch.profiler.ProfilerActivity.CPU]
            self._uses_cuda = torch.cuda.is_available()
            if self._uses_cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            prof = torch.profiler.profile(activities=activities, record_shapes=True)
            prof.__enter__()
        except Exception:
            # e.g. another profiler already running: a diagnostic must never break inference.
            log.warning("torch profiler could not start; profiling is off", exc_info=True)
            self._enabled = False
            return False
        self._profile = prof
        log.info("torch profiler on for the next %d batches", self._batches)
        return True

    def _finish(self) -> None:
        prof, self._profile = self._profile, None
        self._enabled = False
        if prof is None:
            return
        try:
            prof.__exit__(None, None, None)
            self._out_dir.mkdir(parents=True, exist_ok=True)
            # pid in the name: several replicas may share one out_dir.
            stem = f"textserve-{os.getpid()}-{time.strftime('%Y%m%d-%H%M%S')}"
            trace_path = self._out_dir / f"{stem}.trace.json"
            table_path = self._out_dir / f"{stem}.ops.txt"
            # Exporting takes a moment on the model thread; it happens once per enabled profile.
            prof.export_chrome_trace(str(trace_path))
            sort_by = "self_device_time_total" if self._uses_cuda else "self_cpu_time_total"
            table = prof.key_averages(group_by_input_shape=True).table(sort_by=sort_by, row_limit=50)
            table_path.write_text(table, encoding="utf-8")
        except Exception:
            log.warning("torch profile could not be written to %s", self._out_dir, exc_info=True)
            return
        self.written = (trace_path, table_path)
        log.info("torch profile of %d batches written: %s, %s", self._batches, trace_path, table_path)
