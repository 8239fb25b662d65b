"""The transfer programs compiled in this process, shared by every engine that needs one.

A program is named by what it is (its allocator programs' identity: formats, shapes,
devices, kernels; and its shape key): an engine equal to one built before (a restarted
cache, a test's next case) reuses the executables instead of compiling them again. Every
program is traced once here and checked: it never computes on host memory.

Most programs are compiled where they are first needed, or ahead by `warmup`. A program
whose shapes are too many to compile ahead (a load that fuses pieces of several blocks,
`PlanPrograms.ready_load`) is compiled on a background thread instead (`ready_program`):
the load that asks for it moves by programs compiled already, and the loads of its shape
after the compilation has finished run it.

Tracing and lowering a program is Python that holds the GIL for up to a second (a Mosaic
GPU kernel call takes about 0.25 s to lower). A serving thread gives the GIL up at every
wait (a dispatch, a device sync) and gets it back only when the holder reaches the
interpreter's switch interval, 5 ms by default: each of its waits then costs up to that
much (the convoy effect). While a background compile runs, the switch interval is at most
`BACKGROUND_SWITCH_INTERVAL_S` (then restored, unless someone changed it meanwhile): on a
2-core CPU, a loop step of four waits took 28-31 ms instead of 0.8-1.0 ms beside a
background lowering at 5 ms, and 2.1-2.2 ms at 0.2 ms (`benchmarks/bench_gil_convoy.py`;
BENCHMARKS.md, "A background compile and the serving loop").
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import sys
import threading
from collections.abc import Callable

import jax

from hicache_jax.compiles import BACKGROUND_THREAD   # `CompileCounter` tells its compilations apart
from hicache_jax.transfer.host_check import host_compute_violations

# Programs compiled in this process, by what they are (the programs' identity and shape
# key): an engine equal to one built before (same formats, shapes, devices and kernels:
# a restarted cache, a test's next case) reuses its executables instead of compiling again.
_COMPILED: dict[tuple, tuple[jax.stages.Compiled, object]] = {}
_lock = threading.Lock()
_background = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=BACKGROUND_THREAD)
_pending: dict[tuple, concurrent.futures.Future] = {}   # background compiles, by identity (failed ones stay)
log = logging.getLogger("hicache_jax.transfer")
BACKGROUND_SWITCH_INTERVAL_S = 0.0002   # the GIL switch interval while a background compile runs


def shared_program(identity: tuple, label: str, jaxprs: dict, build: Callable[[], tuple]) -> jax.stages.Compiled:
    """The program `identity` names, compiled from `build()` the first time in this process;
    its jaxpr recorded in `jaxprs` under `label` either way."""
    found = _COMPILED.get(identity)
    if found is None:
        found = _compile(identity, label, build)
    jaxprs[label] = found[1]
    return found[0]


def ready_program(identity: tuple, label: str, jaxprs: dict, build: Callable[[], tuple],
                  start: bool = True) -> jax.stages.Compiled | None:
    """The program `identity` names if it is compiled; else None, and with `start` its
    compilation starts on the background thread (once: a program that failed to compile is
    not tried again)."""
    found = _COMPILED.get(identity)
    if found is not None:
        jaxprs[label] = found[1]
        return found[0]
    if not start:
        return None
    with _lock:
        if identity not in _pending:
            _pending[identity] = _background.submit(_compile_logged, identity, label, build)
    return None


def wait_background() -> None:
    """Block until every background compilation started so far has ended (tests, warm-up)."""
    with _lock:
        pending = list(_pending.values())
    concurrent.futures.wait(pending)


def _compile_logged(identity: tuple, label: str, build: Callable[[], tuple]) -> None:
    try:
        with _short_switch_interval():
            _compile(identity, label, build)
    except Exception:
        log.exception("background compilation of %s failed; its loads keep moving without it", label)


@contextlib.contextmanager
def _short_switch_interval():
    """The GIL switch interval at most BACKGROUND_SWITCH_INTERVAL_S inside (module docstring)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, BACKGROUND_SWITCH_INTERVAL_S))
    short = sys.getswitchinterval()              # as the interpreter keeps it (whole microseconds)
    try:
        yield
    finally:
        if sys.getswitchinterval() == short:     # left as set: give the caller's value back
            sys.setswitchinterval(before)


def _compile(identity: tuple, label: str, build: Callable[[], tuple]) -> tuple[jax.stages.Compiled, object]:
    fn, args, donate, outs = build()
    scratch: dict[str, object] = {}
    program = compile_program(fn, args, donate, outs, label, scratch)
    found = _COMPILED[identity] = (program, scratch[label])
    return found


def compile_program(fn, args, donate, outs, label: str, jaxprs: dict) -> jax.stages.Compiled:
    """`fn` jitted for `args` (example values carrying their shardings), its jaxpr kept in
    `jaxprs` under `label`; RuntimeError (a bug) if it would compute on host memory. The
    concrete example arrays (pinned blocks made to trace with) are deleted afterwards."""
    ins = tuple(jax.tree.map(lambda a: a.sharding, args))
    traced = jax.jit(fn, in_shardings=ins, out_shardings=outs, donate_argnums=donate).trace(*args)
    bad = host_compute_violations(traced.jaxpr)
    if bad:
        raise RuntimeError(f"bug: transfer program {label} computes on host memory: {bad}")
    jaxprs[label] = traced.jaxpr
    compiled = traced.lower().compile()
    for example in jax.tree.leaves(args):  # the pinned blocks made to trace with
        if isinstance(example, jax.Array):
            example.delete()
    return compiled


