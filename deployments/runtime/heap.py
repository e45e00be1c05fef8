"""Keep a model's load-time objects out of Python's full garbage collections. No Ray.

Ray Serve collects and freezes the heap (``gc.freeze``) when a replica's constructor returns, so the objects
made at start-up are never scanned again: a full collection then scans only what requests left behind. The
pipeline replica loads its copy of the model later, in the background (``pipeline/local_model.py``), with the
imports, modules and traced graph that brings. Left unfrozen, that heap is scanned by every full collection
from then on: the last one while the copy loaded took 234 ms in the live replica (a ``gc.callbacks`` probe,
4 December), a stall for every request in the replica at that moment. Frozen once loaded, like the
constructor's heap, a full collection takes a few ms. ``RAY_SERVE_FREEZE_GC_ON_STARTUP=0``, Ray's switch for
its own freeze, turns this one off too.
"""

from __future__ import annotations

import gc
import logging
import os

log = logging.getLogger("textserve.runtime")

RAY_SWITCH = "RAY_SERVE_FREEZE_GC_ON_STARTUP"  # Ray's own: "1" (its default) freezes, anything else does not


def freeze_loaded_heap() -> int:
    """Collect, then freeze every object tracked so far (once a model has loaded); how many are frozen in
    all (0 when Ray's switch is off)."""
    if os.environ.get(RAY_SWITCH, "1") != "1":
        return 0
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("heap frozen after loading: %d objects left out of full collections", frozen)
    return frozen
