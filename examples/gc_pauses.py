"""Python's garbage collector in a serving loop: settle the heap after warm-up, and time its pauses.

A process that has imported jax, built a model and compiled its programs holds hundreds of
thousands of Python objects. The collector's full pass (generation 2) walks all of them with
every thread stopped (65–140 ms on this project's 2-core CPU machine), landing in
whichever request is running. Serving systems freeze the heap once warm-up is over
(`gc.freeze()`: every object alive now moves to a permanent generation the collector no
longer walks), so a full pass while serving looks only at the objects made since.
`settle()` does that; `spent()` and `full_passes()` read the pauses the collector took
(from `gc.callbacks`, registered on import), so a request's TTFT can say how much of it
was the collector's (decode.py's JSON: `gc_ms_in_ttft_cache`).

    warm_up(...); settle()                # after the last compile, before the first request
    g0 = spent(); serve one request; gc_s = spent() - g0
    unsettle()                            # serving is over: what warm-up made may be collected again
"""
from __future__ import annotations

import gc
import time

_pause = {"total_s": 0.0, "full": 0, "started": None}


def _on_collect(phase: str, info: dict) -> None:
    if phase == "start":
        _pause["started"] = time.perf_counter()
    elif _pause["started"] is not None:
        _pause["total_s"] += time.perf_counter() - _pause["started"]
        _pause["full"] += info.get("generation") == 2
        _pause["started"] = None


gc.callbacks.append(_on_collect)


def settle() -> int:
    """Collect everything collectable now, then freeze what is left (module docstring); the
    objects frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def unsettle() -> None:
    """Undo `settle` (`gc.unfreeze()`): objects frozen and dropped since can be collected
    again (a process that serves several runs, a test session, does not keep them)."""
    gc.unfreeze()


def spent() -> float:
    """Seconds the collector has paused this process since this module was imported."""
    return _pause["total_s"]


def full_passes() -> int:
    """Full (generation 2) collections since this module was imported."""
    return _pause["full"]
