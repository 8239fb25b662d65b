"""The transfer programs compiled in this process, shared by every engine that needs one.

A program is named by what it is (its allocator programs' identity: formats, shapes,
devices, kernels; and its shape key): an engine equal to one built before (a restarted
cache, a test's next case) reuses the executables instead of compiling them again. Every
program is traced once here and checked: it never computes on host memory.
"""
from __future__ import annotations

from collections.abc import Callable

import jax

from hicache_jax.transfer.host_check import host_compute_violations

# Programs compiled in this process, by what they are (the programs' identity and shape
# key): an engine equal to one built before (same formats, shapes, devices and kernels:
# a restarted cache, a test's next case) reuses its executables instead of compiling again.
_COMPILED: dict[tuple, tuple[jax.stages.Compiled, object]] = {}


def shared_program(identity: tuple, label: str, jaxprs: dict, build: Callable[[], tuple]) -> jax.stages.Compiled:
    """The program `identity` names, compiled from `build()` the first time in this process;
    its jaxpr recorded in `jaxprs` under `label` either way."""
    found = _COMPILED.get(identity)
    if found is None:
        fn, args, donate, outs = build()
        scratch: dict[str, object] = {}
        program = compile_program(fn, args, donate, outs, label, scratch)
        found = _COMPILED[identity] = (program, scratch[label])
    jaxprs[label] = found[1]
    return found[0]


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


