"""The device tier: one array per byte-holding pool, `[num_layers, num_pages, *page_shape]`.

A pool's page count is its allocator's device page count (`kv` for kv sidecars, `swa`
for the SWA pool and its state pools). The anchor holds no bytes and has no array.
"""
from __future__ import annotations

import functools
import weakref
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from hicache_jax.layout import PoolLayout, PoolSpec
from hicache_jax.pools.placement import Devices


class DevicePools:
    """Shapes, dtypes and shardings of a layout's device pools (holds no arrays)."""

    def __init__(self, layout: PoolLayout, device_pages: Mapping[str, int], devices: Devices):
        self.layout = layout
        self.devices = devices
        self.pages = checked_page_counts(layout, device_pages, "device_pages")
        self.specs: tuple[PoolSpec, ...] = layout.byte_pools
        for spec in self.specs:
            spec.shard_page_shape(devices.tp if devices.sharded(spec) else 1)  # ValueError if it does not split
        self._expected = [(s, self.shape(s), self.sharding(s)) for s in self.specs]
        self._made: dict[str, weakref.ref] = {}   # the arrays `made` last recorded, by pool
        self._zeros: dict[str, object] = {}        # the jitted zero-fill of each pool

    def made(self, pools: Mapping[str, jax.Array]) -> None:
        """Record `pools` as placed by construction (a program's outputs with these shapes
        and shardings): `check` of exactly these arrays only asks whether they still live."""
        self._made = {name: weakref.ref(a) for name, a in pools.items()}

    def shape(self, spec: PoolSpec) -> tuple[int, ...]:
        return (spec.num_layers, self.pages[spec.allocator], *spec.page_shape)

    def sharding(self, spec: PoolSpec) -> jax.sharding.Sharding:
        return self.devices.pool_sharding(spec)

    def zeros(self) -> dict[str, jax.Array]:
        """Fresh zero-filled pools, placed and sharded as `check` expects."""
        if not self._zeros:   # built in place by a jit: no host copy, each shard made on its own device
            for spec in self.specs:
                make = functools.partial(jnp.zeros, self.shape(spec), jnp.dtype(spec.dtype))
                self._zeros[spec.name] = jax.jit(make, out_shardings=self.sharding(spec))
        return {name: make() for name, make in self._zeros.items()}   # compiled once, not per call

    def check(self, pools: Mapping[str, jax.Array]) -> None:
        """Raise ValueError naming the pool and the problem unless `pools` is exactly right.

        Checks the set of names (no missing or extra pool), and each array's type, shape,
        dtype, sharding and liveness (a donated array is deleted). Arrays that passed (or
        that `made` recorded) are checked again only for liveness.
        """
        if isinstance(pools, Mapping) and len(pools) == len(self._made) == len(self.specs) and all(
                (a := pools.get(name)) is not None and ref() is a and not a.is_deleted()
                for name, ref in self._made.items()):
            return
        if not isinstance(pools, Mapping):
            raise ValueError(f"device pools must be a mapping {{pool name: jax.Array}}, got {type(pools).__name__}")
        expected = [s.name for s in self.specs]
        missing = [n for n in expected if n not in pools]
        extra = sorted(n for n in pools if n not in expected)
        if missing:
            raise ValueError(f"device pools lack {missing} (expected exactly {expected})")
        if extra:
            raise ValueError(f"device pools have unexpected {extra} (expected exactly {expected})")
        for spec, shape, sharding in self._expected:
            _check_array(spec, pools[spec.name], shape, sharding)
        self.made(pools)     # checked whole: a step's pools are checked once, not at every call


def checked_page_counts(layout: PoolLayout, pages: Mapping[str, int], what: str, minimum: int = 1) -> dict[str, int]:
    """`{allocator: pages}` (each at least `minimum`) for every allocator that carries bytes;
    ValueError otherwise.

    Allocators that carry no byte-holding pool may be given (they move nothing) or left out.
    """
    if not isinstance(pages, Mapping):
        raise ValueError(f"{what} must be a mapping {{allocator: pages}}, got {type(pages).__name__}")
    allocators = [p.name for p in layout.allocator_pools]
    unknown = sorted(a for a in pages if a not in allocators)
    if unknown:
        raise ValueError(f"{what} names {unknown}, not allocators of this layout ({allocators})")
    out = {}
    for name in allocators:
        if not layout.moving_with(name):
            continue
        if name not in pages:
            raise ValueError(f"{what} has no entry for allocator {name!r}")
        value = pages[name]
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
            raise ValueError(f"{what}[{name!r}] must be an integer >= {minimum}, got {value!r}")
        out[name] = int(value)
    return out


def _check_array(spec: PoolSpec, array, shape: tuple[int, ...], sharding: jax.sharding.Sharding) -> None:
    name = spec.name
    if not isinstance(array, jax.Array):
        raise ValueError(f"pool {name!r} is a {type(array).__name__}, not a jax.Array")
    if array.sharding == sharding and array.shape == shape and array.dtype == spec.dtype and not array.is_deleted():
        return  # the common case, cheaply
    if array.is_deleted():
        raise ValueError(f"pool {name!r} was deleted (donated to an earlier call?); pass the arrays it returned")
    if tuple(array.shape) != shape:
        raise ValueError(f"pool {name!r} has shape {tuple(array.shape)}, expected {shape} "
                         f"([num_layers, device pages of {spec.allocator!r}, *page_shape])")
    if array.dtype != jnp.dtype(spec.dtype):
        raise ValueError(f"pool {name!r} has dtype {array.dtype}, expected {spec.dtype}")
    if not array.sharding.is_equivalent_to(sharding, array.ndim):
        raise ValueError(f"pool {name!r} has sharding {array.sharding}, expected {sharding}")
