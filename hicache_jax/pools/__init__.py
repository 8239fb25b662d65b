"""Data plane: the device pools and the pinned host tier (imports jax)."""
from hicache_jax.pools.device_pools import DevicePools, checked_page_counts
from hicache_jax.layout.rows import ROW_ALIGN_BYTES, RowFormat
from hicache_jax.pools.host_tier import HostTier
from hicache_jax.pools.placement import HOST_MEMORY, TP_AXIS, Devices, shard_on

__all__ = ["Devices", "DevicePools", "HOST_MEMORY", "HostTier", "ROW_ALIGN_BYTES", "RowFormat", "TP_AXIS", "checked_page_counts", "shard_on"]
