"""Transfer programs run for the first time: a serving loop's measure beside compiles while serving.

`HiCache.warmup()` compiles every transfer program ahead of use, but compiling is not running:
on a GPU the first run of a compiled program still loads its kernels onto the device, a
one-off cost that lands in the request whose hit first has that shape (a new block size, a
new mix of pieces). `watch(cache)` sees every program the cache runs (`on_program_call`)
and counts those whose label (program and shape) this process had not run before;
`first_runs()` is that count so far, so a request's TTFT can say how many it ran.

    watch(cache); n0 = first_runs(); serve one request; new = first_runs() - n0
"""
from __future__ import annotations

_labels_run: set[str] = set()
_first = [0]


def _call(label: str, program, *args):
    if label not in _labels_run:
        _labels_run.add(label)
        _first[0] += 1
    return program(*args)


def watch(cache) -> None:
    """Count `cache`'s program runs from now on (its one `on_program_call` hook: a caller
    that sets its own replaces this one)."""
    cache.on_program_call(_call)


def first_runs() -> int:
    """Programs (by label) run for the first time in this process while watched."""
    return _first[0]
