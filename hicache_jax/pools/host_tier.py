"""The host tier: one preallocated pinned-host buffer per allocator, `[host_pages, row_elems]`.

Buffers are allocated once, at start, and afterwards only replaced by the in-place results
of donated jits. This class owns the current buffer objects; the transfer engine swaps them
as its jits return new ones. Pinning is the cost of a start: about 0.45-0.58 s per GiB on
the H200 machine whatever fills the buffer, and a build in a background thread held device
work up as long (BENCHMARKS.md, "Host tier start-up").
"""
from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import SingleDeviceSharding

from hicache_jax.layout import PoolLayout
from hicache_jax.pools.device_pools import checked_page_counts
from hicache_jax.pools.host_rows import HostRowFormat
from hicache_jax.pools.placement import HOST_MEMORY, Devices


class HostTier:
    """Pinned host buffers of every allocator that carries bytes.

    Replicated allocators keep one copy, on the first device's pinned memory; `tp`
    allocators keep each rank's shard (`P(None, "tp")`). Raises ValueError at
    construction, before allocating, when the buffers would exceed `memory_limit_bytes`.
    """

    def __init__(self, layout: PoolLayout, host_pages: Mapping[str, int], devices: Devices, memory_limit_bytes: int):
        self.devices = devices
        self.pages = checked_page_counts(layout, host_pages, "host_pages")
        self.formats = {a: HostRowFormat.create(layout, a, devices) for a in self.pages}
        sizes = {a: self.pages[a] * f.row_bytes for a, f in self.formats.items()}
        total = sum(sizes.values())
        if total > memory_limit_bytes:
            detail = ", ".join(f"{a}: {self.pages[a]} pages x {self.formats[a].row_bytes:,} B = {b / 2**30:.2f} GiB"
                               for a, b in sizes.items())
            raise ValueError(
                f"host pools need {total / 2**30:.2f} GiB of pinned memory ({detail}), more than "
                f"host_memory_limit_bytes = {memory_limit_bytes / 2**30:.2f} GiB (XLA's pinned pool is capped "
                f"by XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB, 64 GiB by default); ask for fewer host pages")
        self.nbytes = total
        self.buffers: dict[str, jax.Array] = {a: self._zeros(a) for a in self.formats}

    def sharding(self, allocator: str) -> jax.sharding.Sharding:
        return self.devices.row_sharding(self.formats[allocator].sharded, HOST_MEMORY)

    def shape(self, allocator: str) -> tuple[int, int]:
        return (self.pages[allocator], self.formats[allocator].row_elems)

    def _zeros(self, allocator: str) -> jax.Array:
        fmt = self.formats[allocator]
        shape = self.shape(allocator)
        dtype = jnp.dtype(fmt.dtype)
        # Built from numpy shard by shard: no device memory is used, and np.zeros pages
        # are only touched as they are copied into pinned memory. (make_array_from_callback
        # would lose the host memory space from the array's type.)
        sharding = self.sharding(allocator)
        shards = [jax.device_put(np.zeros(_shard_shape(shape, index), dtype),
                                 SingleDeviceSharding(device, memory_kind=HOST_MEMORY))
                  for device, index in sharding.addressable_devices_indices_map(shape).items()]
        if isinstance(sharding, SingleDeviceSharding):
            return shards[0]
        return jax.make_array_from_single_device_arrays(shape, sharding, shards)


def _shard_shape(shape: tuple[int, ...], index: tuple[slice, ...]) -> tuple[int, ...]:
    return tuple(len(range(*s.indices(n))) for s, n in zip(index, shape))
