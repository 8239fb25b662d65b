"""hicache-jax: a hierarchical KV cache (device HBM <-> pinned host memory) for JAX serving.

Importing this package, the config loader and the layouts does not import jax; the cache
and its data plane are loaded on first use of `HiCache` and friends.
"""
from __future__ import annotations

import importlib

from hicache_jax.config import (HiCacheConfig, ModelConfig, PrefetchPolicy, StorageConfig, StorageWritePolicy,
                                TransferConfig, WritePolicyName, load_model_config)
from hicache_jax.layout import PoolLayout, PoolSpec, build_layout
from hicache_jax.outcomes import LoadBack, Prefix, StepReport
from hicache_jax.plan import Direction
from hicache_jax.tree import EvictResult, InsertResult, LockId, MatchResult, Refusal, TransferId
from hicache_jax.window_policy import DEFAULT_WINDOW_POLICY, WindowPolicy

__version__ = "0.1.0"

# name -> module that defines it; imported on first access (these import jax).
_LAZY: dict[str, str] = {
    "HiCache": "hicache_jax.cache",
    "CacheStats": "hicache_jax.metrics",
    "TransferEngine": "hicache_jax.transfer",
    "Landing": "hicache_jax.transfer",
    "step_compiler_options": "hicache_jax.transfer",
    "CompileCounter": "hicache_jax.compiles",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hicache_jax' has no attribute {name!r}")


__all__ = ["DEFAULT_WINDOW_POLICY", "Direction", "EvictResult", "HiCacheConfig", "InsertResult", "LoadBack", "LockId",
           "MatchResult", "ModelConfig", "PoolLayout", "PoolSpec", "Prefix", "PrefetchPolicy", "Refusal", "StepReport",
           "StorageConfig", "StorageWritePolicy", "TransferConfig", "TransferId", "WindowPolicy",
           "WritePolicyName", "__version__", "build_layout", "load_model_config", *_LAZY]
