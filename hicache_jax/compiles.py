"""`CompileCounter`: the XLA compilations a process ran, counted with jax's monitoring hooks.

A serving loop compiles at warm-up and never per request: a program compiled while
requests are served stalls one of them for as long as the compile takes (seconds on a
GPU). Start a counter after warm-up and read it at the end:

    cache.warmup(); <run the step on every shape it will see>
    counter = CompileCounter()
    serve(...)
    counter.count, counter.names      # compilations since the counter started, by function

jax reports every backend compilation as the event `BACKEND_COMPILE_EVENT` with the
jitted function's name; a program served from the persistent compilation cache is
reported too (it still stalls the caller to load it), so the count is an upper bound
of the compiles a cold cache would run.

Compilations on the transfer engine's background thread (the fused program of a load
shape seen for the first time, `transfer/compile_cache.py`) stall no request: the load
that met the new shape moved by programs compiled already. They are counted apart
(`background`), not in `count`.
"""
from __future__ import annotations

import threading

import jax

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

# every compilation seen since the listener was registered:
# (function name, on the background thread, seconds)
_seen: list[tuple[str, bool, float]] = []
BACKGROUND_THREAD = "hicache-compile"   # the prefix of that thread's name (compile_cache.py)
_lock = threading.Lock()
_listening = False


def _listen(event: str, duration: float, **kwargs) -> None:
    if event == BACKEND_COMPILE_EVENT:
        _seen.append((str(kwargs.get("fun_name", "?")),
                      threading.current_thread().name.startswith(BACKGROUND_THREAD), float(duration)))


def _register() -> None:
    global _listening
    with _lock:
        if not _listening:
            jax.monitoring.register_event_duration_secs_listener(_listen)
            _listening = True


class CompileCounter:
    """Counts the compilations since it was made (or last `reset`)."""

    def __init__(self):
        _register()
        self._start = len(_seen)

    def reset(self) -> None:
        """Count from now on."""
        self._start = len(_seen)

    @property
    def count(self) -> int:
        """Compilations since the start that a caller waited for (not the background ones)."""
        return len(self.names)

    @property
    def background(self) -> int:
        """Compilations since the start on the background compile thread."""
        return sum(bg for _, bg, _ in _seen[self._start:])

    @property
    def background_s(self) -> float:
        """Seconds those background compilations took in XLA (tracing and lowering, which
        hold the GIL the serving thread needs, come on top)."""
        return sum(s for _, bg, s in _seen[self._start:] if bg)

    @property
    def names(self) -> list[str]:
        """The compiled functions' names since the start, in order (e.g. `jit(_forward)`)."""
        return [name for name, bg, _ in _seen[self._start:] if not bg]
