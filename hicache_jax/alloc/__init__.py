"""Page allocators per pool and tier (control plane: pure Python + numpy)."""
from hicache_jax.alloc.pages import PageAllocator
from hicache_jax.alloc.resolve import Resolved, TierAllocators
from hicache_jax.alloc.slots import AnchorAllocator, NoAllocator, pages_of, slots_of

__all__ = ["AnchorAllocator", "NoAllocator", "PageAllocator", "Resolved", "TierAllocators", "pages_of", "slots_of"]
