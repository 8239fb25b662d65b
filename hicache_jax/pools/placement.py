"""Where pool arrays live: one device, or a mesh with a `"tp"` axis.

Replicated pools are whole on every rank; `tp` pools split `page_shape[shard_axis]`
across the ranks of the `"tp"` axis. On the host tier a replicated allocator keeps ONE
copy, in the pinned memory of the first device; a `tp` allocator keeps every rank's shard.
"""
from __future__ import annotations

import dataclasses

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from hicache_jax.layout import Placement, PoolSpec

TP_AXIS = "tp"
HOST_MEMORY = "pinned_host"


def single_device(device: jax.Device, memory_kind: str | None = None) -> jax.sharding.Sharding:
    """An array placed whole on `device` (jax's `make_single_device_sharding`: its class
    is deprecated from jax 0.12.1, and later versions may make this a `NamedSharding`)."""
    return jax.sharding.make_single_device_sharding(device, memory_kind=memory_kind)


def is_single_device(sharding: jax.sharding.Sharding) -> bool:
    """Whether `sharding` is of jax's one-device sharding class (`is_single_device_sharding`;
    on jax before 0.12.1, which lacks it, the class test it stands for). A `NamedSharding`
    is not, even on one device: a caller must handle both."""
    check = getattr(jax.sharding, "is_single_device_sharding", None)
    return check(sharding) if check is not None else isinstance(sharding, jax.sharding.SingleDeviceSharding)


@dataclasses.dataclass(frozen=True, eq=False)
class Devices:
    """The device set of an engine: `mesh` (axes exactly `("tp",)`) or one `device`."""

    mesh: Mesh | None
    device: jax.Device  # the single device, or the mesh's first device (home of replicated host data)

    @classmethod
    def create(cls, mesh: Mesh | None) -> "Devices":
        if mesh is None:
            return cls(None, jax.devices()[0])
        if not isinstance(mesh, Mesh):
            raise ValueError(f"mesh must be a jax.sharding.Mesh or None, got {type(mesh).__name__}")
        if tuple(mesh.axis_names) != (TP_AXIS,):
            raise ValueError(f"mesh axes must be exactly ({TP_AXIS!r},), got {tuple(mesh.axis_names)}")
        return cls(mesh, mesh.devices.flat[0])

    @property
    def tp(self) -> int:
        return 1 if self.mesh is None else int(self.mesh.shape[TP_AXIS])

    def sharded(self, spec: PoolSpec) -> bool:
        """Whether `spec`'s pages are split over ranks here (a tp pool on a mesh with tp > 1)."""
        return self.mesh is not None and spec.sharding is Placement.TP and spec.shard_axis is not None

    def pool_sharding(self, spec: PoolSpec) -> jax.sharding.Sharding:
        """Sharding of `spec`'s device array `[num_layers, num_pages, *page_shape]`."""
        if self.mesh is None:
            return single_device(self.device)
        if self.sharded(spec):
            return NamedSharding(self.mesh, PartitionSpec(*([None] * (2 + spec.shard_axis)), TP_AXIS))
        return NamedSharding(self.mesh, PartitionSpec())

    def pool_spec(self, spec: PoolSpec) -> PartitionSpec:
        """shard_map in/out spec of `spec`'s device array."""
        if self.sharded(spec):
            return PartitionSpec(*([None] * (2 + spec.shard_axis)), TP_AXIS)
        return PartitionSpec()

    def row_sharding(self, sharded: bool, memory_kind: str | None = None) -> jax.sharding.Sharding:
        """Sharding of a `[rows, row_elems]` staging (device) or host buffer.

        Sharded rows split their columns over ranks (each rank's slice is its own packed
        row); unsharded rows live on `device` alone.
        """
        if sharded:
            return NamedSharding(self.mesh, PartitionSpec(None, TP_AXIS), memory_kind=memory_kind)
        return single_device(self.device, memory_kind)

    def replicated(self, memory_kind: str | None = None) -> jax.sharding.Sharding:
        """Replicated over the mesh (the single device without one)."""
        if self.mesh is None:
            return single_device(self.device, memory_kind)
        return NamedSharding(self.mesh, PartitionSpec(), memory_kind=memory_kind)


def shard_on(array: jax.Array, device: jax.Device) -> jax.Array:
    """The single-device view of `array`'s shard on `device` (no copy)."""
    for shard in array.addressable_shards:
        if shard.device == device:
            return shard.data
    raise RuntimeError(f"bug: array of sharding {array.sharding} has no shard on {device}")
