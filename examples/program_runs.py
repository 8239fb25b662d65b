"""Transfer programs run for the first time: a serving loop's measure beside compiles while serving.

Compiling a program is not running it: on a GPU a compiled program's first run still loads
its kernels onto the device, a one-off cost that lands in the request whose hit first has
that shape (a new block size, a new mix of pieces). `HiCache.warmup()` runs every program
it compiles once; what can still run first while serving is a shape it did not compile (a
load of pieces, compiled in the background once the shape comes again). `watch(cache)`
sees every program the cache runs (`on_program_call`), warm-up's included when watched
before it, and counts those whose label (program and shape) this process had not run;
`first_runs()` is that count so far, so a request's TTFT can say how many it ran.

    watch(cache); n0 = first_runs(); serve one request; new = first_runs() - n0
"""
from __future__ import annotations

_labels_run: set[str] = set()      # every label run while watched: its size is the count


def _call(label: str, program, *args):
    _labels_run.add(label)
    return program(*args)


def watch(cache) -> None:
    """Count `cache`'s program runs from now on (its one `on_program_call` hook: a caller
    that sets its own replaces this one)."""
    cache.on_program_call(_call)


def first_runs() -> int:
    """Programs (by label) run for the first time in this process while watched."""
    return len(_labels_run)
