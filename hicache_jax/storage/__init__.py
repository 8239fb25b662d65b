"""L3: a storage tier below pinned host memory (content-addressed pages in an object store).

Keys, the object format, the backend protocol and the tier never import jax. Engines load
on first use: tensorstore for `file://`, `gs://`, `s3://`; Mooncake Store (the `mooncake`
extra) for `mooncake://host:port`. `save_snapshot` / `load_snapshot` (orbax) import jax.
"""
from __future__ import annotations

import importlib

from hicache_jax.storage.backend import MAX_BATCH_PAGES, StorageBackend
from hicache_jax.storage.urls import open_backend
from hicache_jax.storage.faults import FaultyBackend, InjectedFault
from hicache_jax.storage.guard import StorageOp
from hicache_jax.storage.keys import KeySpace, ObjectKey, PageHash, layout_fingerprint, page_hashes
from hicache_jax.storage.memory_backend import MemoryBackend
from hicache_jax.storage.objects import CORRUPT, HEADER_BYTES, MissReason
from hicache_jax.storage.rows import ObjectSpan, PageObjects
from hicache_jax.storage.stats import PoolStorageStats, StorageStats, metric_families
from hicache_jax.config import StorageConfig
from hicache_jax.storage.tier import GetResult, PutResult, StorageTier

# name -> module that defines it; imported on first access (engines, orbax + jax).
_LAZY: dict[str, str] = {
    "TensorstoreBackend": "hicache_jax.storage.tensorstore_backend",
    "MooncakeBackend": "hicache_jax.storage.mooncake_backend",
    "MooncakeServer": "hicache_jax.storage.mooncake_server",
    "Snapshot": "hicache_jax.storage.snapshot",
    "save_snapshot": "hicache_jax.storage.snapshot",
    "load_snapshot": "hicache_jax.storage.snapshot",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hicache_jax.storage' has no attribute {name!r}")


__all__ = [
    "CORRUPT", "FaultyBackend", "GetResult", "HEADER_BYTES", "InjectedFault", "KeySpace", "MAX_BATCH_PAGES",
    "MemoryBackend", "MissReason", "ObjectKey", "PageHash", "PoolStorageStats", "PutResult", "ObjectSpan", "PageObjects",
    "StorageBackend", "StorageConfig", "StorageOp", "StorageStats", "StorageTier", "layout_fingerprint",
    "metric_families", "open_backend", "page_hashes", *_LAZY,
]
