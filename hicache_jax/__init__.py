"""hicache-jax: a hierarchical KV cache (device HBM <-> pinned host memory) for JAX serving.

Importing this package, the config loader and the layouts does not import jax; the cache
and its data plane are loaded on first use of `HiCache` and friends.
"""
from __future__ import annotations

import importlib

from hicache_jax.config import ModelConfig, load_model_config
from hicache_jax.layout import PoolLayout, PoolSpec, build_layout

# name -> module that defines it; imported on first access (these import jax).
_LAZY: dict[str, str] = {}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hicache_jax' has no attribute {name!r}")


__all__ = ["ModelConfig", "PoolLayout", "PoolSpec", "build_layout", "load_model_config", *_LAZY]
