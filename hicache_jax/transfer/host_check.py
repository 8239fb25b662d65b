"""Check that no transfer program computes on host-memory values.

A jit that feeds a host array into anything but a copy runs that op as host compute
(a scatter from a host input ran at 0.93 GB/s on the H200, 50x below the link). Host
values may only be sliced, dynamically sliced, dynamically updated (with a host update)
or moved to the device. `host_compute_violations` walks a jaxpr, nested jaxprs included,
and lists every other use; `hlo_host_ops` lists the opcodes that produce host values in a
compiled HLO module (memory space S(5)), for a second look on the GPU.
"""
from __future__ import annotations

import re

import jax
from jax.extend import core as jex_core

# Primitives allowed to take a host-memory operand.
_COPIES = {"device_put", "dynamic_slice", "dynamic_update_slice", "slice", "copy", "copy_p"}
# Opcodes that may produce a host value in compiled HLO: moves, slices, in-place updates
# and plumbing.
HLO_HOST_OK = {
    "parameter", "copy-start", "copy-done", "copy", "dynamic-update-slice", "dynamic-slice", "slice",
    "bitcast", "get-tuple-element", "tuple", "while", "custom-call", "async-start", "async-done",
    "async-update", "opt-barrier", "async dynamic-update-slice", "async dynamic-slice",
}


def _is_host(aval) -> bool:
    return getattr(aval, "memory_space", None) == jax.memory.Space.Host


def _sub_jaxprs(params):
    for value in params.values():
        items = value if isinstance(value, (tuple, list)) else (value,)
        for item in items:
            if isinstance(item, jex_core.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jex_core.Jaxpr):
                yield item


def host_compute_violations(jaxpr, where: str = "") -> list[str]:
    """Descriptions of every equation (recursively) that computes on a host-memory value.

    Equations with nested jaxprs (jit, while, shard_map, ...) only pass values through;
    their bodies are checked instead.
    """
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    found = []
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        subs = list(_sub_jaxprs(eqn.params))
        if subs:
            for sub in subs:
                found += host_compute_violations(sub, f"{where}{name}/")
            continue
        host_in = [_is_host(v.aval) for v in eqn.invars if hasattr(v, "aval")]
        if not any(host_in):
            continue
        if name not in _COPIES:
            found.append(f"{where}{name} takes a host-memory operand: {eqn}")
        elif name == "dynamic_update_slice" and host_in[0] != host_in[1]:
            found.append(f"{where}{name} mixes host and device operand/update: {eqn}")
    return found


_RESULT = re.compile(r"%(\S+)\s*=\s*(.+?)\s+([a-z][a-z0-9\-]*)\((.*)")
_CALLS = re.compile(r"calls=%wrapped_([a-z\-]+?)_computation")


def hlo_host_ops(hlo_text: str) -> set[str]:
    """Opcodes whose result lives in host memory space S(5) in a compiled HLO module.

    An async fusion (`fusion-start` / `fusion-done`) is named after the op it wraps, e.g.
    `async dynamic-update-slice` (XLA's in-place device->host copy).
    """
    ops, wrapped = set(), {}
    for line in hlo_text.splitlines():
        m = _RESULT.search(line)
        if not m:
            continue
        name, shape, op, rest = m.groups()
        if op == "fusion-start":
            c = _CALLS.search(rest)
            wrapped[name] = f"async {c.group(1)}" if c else op
        if "S(5)" not in shape:
            continue
        if op == "fusion-done":
            operand = rest.split(")")[0].strip().lstrip("%")
            op = wrapped.get(operand, op)
        elif op == "fusion-start":
            op = wrapped[name]
        ops.add(op)
    return ops
