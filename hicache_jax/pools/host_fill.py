"""Zero-filled pinned-host arrays for the host tier, built fast at start.

Two ways to build one `[rows, row_elems]` array in a device's pinned host memory:

    COMPILED  one jitted program: a zero row made on the device is moved to host memory
              once per row, as the rows of a `lax.scan` whose stacked output lives in
              pinned host memory. This is the pattern XLA's host offloader turns into an
              uninitialised host allocation plus one device->host copy per row, so no
              host array is read and the device holds one row. The call returns once
              dispatched; programs that use the array are ordered after the fill.
    NUMPY     `jax.device_put(np.zeros(...))`: reads a host array of the full size (every
              page of it faults in) and copies it into pinned memory, in the caller.

COMPILED falls back to NUMPY (logged) when XLA cannot compile the program or would need
more than `MAX_FILL_DEVICE_TEMP_BYTES` of device memory for it (a compiler that turned the
scan into a full-size device buffer copied out). Both give an all-zero array.
"""
from __future__ import annotations

import enum
import functools
import logging

import jax
import numpy as np
from jax.sharding import SingleDeviceSharding

from hicache_jax.pools.placement import HOST_MEMORY

log = logging.getLogger("hicache_jax.pools")

MAX_FILL_DEVICE_TEMP_BYTES = 256 << 20


class HostFill(enum.StrEnum):
    """How the host tier zero-fills its pinned buffers at start."""

    COMPILED = "compiled"   # device zero rows moved to host by one program per shard (default)
    NUMPY = "numpy"         # device_put of a numpy zero array


def zeros_on_host(shape: tuple[int, int], dtype, device: jax.Device, fill: HostFill) -> tuple[jax.Array, HostFill]:
    """An all-zero `dtype[rows, row_elems]` array in `device`'s pinned host memory, and
    the fill that built it (NUMPY when COMPILED fell back)."""
    fill = HostFill(fill)
    if fill is HostFill.COMPILED:
        program = fill_program(shape[0], shape[1], np.dtype(dtype).name, device)
        if program is not None:
            return program(jax.device_put(np.zeros(shape[1], dtype), device)), HostFill.COMPILED
    return jax.device_put(np.zeros(shape, dtype), SingleDeviceSharding(device, memory_kind=HOST_MEMORY)), HostFill.NUMPY


def traced_fill(rows: int, row_elems: int, dtype: str, device: jax.Device) -> jax.stages.Traced:
    """The COMPILED fill, traced: `(row: dtype[row_elems] on device) -> dtype[rows, row_elems]` in pinned host."""
    def fill(row):
        # One row per step and no unroll: an unrolled scan stacks and reshapes its host
        # outputs, which is compute on host memory.
        _, out = jax.lax.scan(lambda carry, _: (carry, jax.device_put(row, jax.memory.Space.Host)), None,
                              length=rows)
        return out

    row = jax.ShapeDtypeStruct((row_elems,), np.dtype(dtype), sharding=SingleDeviceSharding(device))
    out = SingleDeviceSharding(device, memory_kind=HOST_MEMORY)
    return jax.jit(fill, out_shardings=out).trace(row)


@functools.lru_cache(maxsize=64)
def fill_program(rows: int, row_elems: int, dtype: str, device: jax.Device) -> jax.stages.Compiled | None:
    """The compiled COMPILED fill, or None where it cannot be used here (logged)."""
    label = f"{dtype}[{rows}, {row_elems}] on {device}"
    try:
        compiled = traced_fill(rows, row_elems, dtype, device).lower().compile()
    except jax.errors.JaxRuntimeError as e:
        log.warning("host tier: the compiled zero fill of %s does not compile (%s); using numpy", label, e)
        return None
    stats = compiled.memory_analysis()
    temp = getattr(stats, "temp_size_in_bytes", None)
    if temp is None or temp > MAX_FILL_DEVICE_TEMP_BYTES:
        log.warning("host tier: the compiled zero fill of %s needs %s B of device memory (cap %d); using numpy",
                    label, temp, MAX_FILL_DEVICE_TEMP_BYTES)
        return None
    return compiled
