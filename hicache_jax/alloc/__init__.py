"""Page allocators per pool and tier (control plane: pure Python + numpy)."""
from hicache_jax.alloc.pages import PageAllocator
from hicache_jax.alloc.resolve import Resolved, TierAllocators

__all__ = ["PageAllocator", "Resolved", "TierAllocators"]
