"""Content keys of L3 objects: chained page hashes plus a fingerprint of the byte layout.

A page's hash covers every token before it, so the hashes of a prompt are prefix-closed:
the first k page hashes of two prompts agree exactly when their first k pages do, and "the
first k objects exist" means "a k-page prefix exists". Page i's hash:

    h[0] = sha256(tokens[0:P] as int32 little-endian)
    h[i] = sha256(h[i-1] || tokens[i*P:(i+1)*P] as int32 little-endian)      (P = page_size)

One object holds one page of one pool (all its layers), or, for a rank-sharded (`tp`)
pool, one TP rank's shard of it. Its key names everything that changes those bytes:

    hc1/<fingerprint>/<pool>/<page hash>              replicated pool (one object, any tp)
    hc1/<fingerprint>/<pool>@tp<size>r<rank>/<page hash>   rank-sharded pool

The fingerprint digests the model identity (`model_id`: weights are not in the layout, so
two checkpoints of one architecture must pass different ids), the config fields that shape
the cache, and every pool's name, kind, layers, byte format, page shape and dtype. Writer
and reader build keys with this one module, so a layout change can only turn hits into
misses, never serve bytes of another layout.

Pure Python + numpy: never imports jax.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from typing import NewType

import numpy as np

from hicache_jax.layout import Placement, PoolLayout, PoolSpec
from hicache_jax.tree import as_tokens

PageHash = NewType("PageHash", bytes)   # 32-byte SHA-256 digest of a page and all pages before it
KEY_VERSION = "hc1"
FINGERPRINT_HEX = 16                    # 64 bits of the layout digest: enough to separate layouts
# ModelConfig fields that change the bytes or the meaning of a cached page. `name` and
# `vocab_size` are left out: the former is a label (identity goes in `model_id`), the
# latter changes no cached byte.
_CONFIG_FIELDS = (
    "model_type", "num_hidden_layers", "num_key_value_heads", "head_dim", "hidden_size", "num_attention_heads",
    "page_size", "sliding_window", "qk_rope_head_dim", "compress_ratios", "index_n_heads", "index_head_dim",
    "index_topk", "kv_source_layers", "index_source_layers", "kv_layout", "indexer_dtype", "kv_dtype",
)


def page_hashes(tokens, page_size: int, prior: PageHash | None = None) -> list[PageHash]:
    """Chained hashes of the whole pages of `tokens` (a trailing partial page gets none).

    `prior` is the hash of the page just before `tokens[0]` (None at the start of a
    sequence), so a suffix can be hashed on its own.
    """
    if not isinstance(page_size, int) or page_size <= 0:
        raise ValueError(f"page_size must be a positive int, got {page_size!r}")
    if prior is not None and (not isinstance(prior, bytes) or len(prior) != 32):
        raise ValueError(f"prior must be a 32-byte page hash or None, got {prior!r}")
    arr = as_tokens(tokens)
    whole = len(arr) // page_size
    data = arr[: whole * page_size].astype("<i4", copy=False).tobytes()
    stride = 4 * page_size
    out: list[PageHash] = []
    prev = prior if prior is not None else b""
    for i in range(whole):
        prev = hashlib.sha256(prev + data[i * stride:(i + 1) * stride]).digest()
        out.append(PageHash(prev))
    return out


def layout_fingerprint(layout: PoolLayout, model_id: str = "") -> str:
    """Hex digest of everything in `layout` (and the weights' `model_id`) that shapes cached bytes."""
    if not isinstance(model_id, str):
        raise ValueError(f"model_id must be a str, got {type(model_id).__name__}")
    cfg = layout.model
    doc = {
        "version": KEY_VERSION,
        "model_id": model_id,
        "config": {f: _plain(getattr(cfg, f)) for f in _CONFIG_FIELDS},
        "pools": [_pool_doc(p) for p in layout.pools],
    }
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:FINGERPRINT_HEX]


@dataclasses.dataclass(frozen=True)
class ObjectKey:
    """The key of one L3 object: one page of one pool (one rank's shard for a `tp` pool)."""

    fingerprint: str
    pool: str
    page: PageHash
    rank: int | None = None    # None: replicated pool, one object for every TP size
    tp: int | None = None

    def __post_init__(self):
        if (self.rank is None) != (self.tp is None):
            raise ValueError(f"rank and tp must be given together, got rank={self.rank} tp={self.tp}")
        if self.tp is not None and not 0 <= self.rank < self.tp:
            raise ValueError(f"rank {self.rank} is outside tp={self.tp}")
        if len(self.page) != 32:
            raise ValueError(f"page must be a 32-byte page hash, got {len(self.page)} bytes")

    @property
    def text(self) -> str:
        """The string backends store the object under."""
        shard = "" if self.tp is None else f"@tp{self.tp}r{self.rank}"
        return f"{KEY_VERSION}/{self.fingerprint}/{self.pool}{shard}/{self.page.hex()}"

    def __str__(self) -> str:
        return self.text


@dataclasses.dataclass(frozen=True)
class KeySpace:
    """Builds the object keys of one layout and TP size; writer and reader share it."""

    layout: PoolLayout
    model_id: str = ""
    tp: int = 1                # ranks a `tp` pool is split over (1 without a mesh)
    fingerprint: str = dataclasses.field(init=False)

    def __post_init__(self):
        if not isinstance(self.tp, int) or self.tp < 1:
            raise ValueError(f"tp must be a positive int, got {self.tp!r}")
        for p in self.layout.byte_pools:
            if self.sharded(p):
                p.shard_page_shape(self.tp)   # raises ValueError when the pool cannot be split
        object.__setattr__(self, "fingerprint", layout_fingerprint(self.layout, self.model_id))

    def sharded(self, spec: PoolSpec) -> bool:
        """Whether `spec` is stored as one object per TP rank (its bytes differ per rank)."""
        return spec.sharding is Placement.TP and spec.shard_axis is not None

    def ranks(self, spec: PoolSpec) -> tuple[int | None, ...]:
        return tuple(range(self.tp)) if self.sharded(spec) else (None,)

    def key(self, pool: str, page: PageHash, rank: int | None = None) -> ObjectKey:
        spec = self.layout.pool(pool)
        if not spec.holds_bytes:
            raise ValueError(f"pool {pool!r} holds no bytes and has no objects")
        sharded = self.sharded(spec)
        if (rank is not None) != sharded or (sharded and not 0 <= rank < self.tp):
            want = f"a rank in 0..{self.tp - 1}" if sharded else "rank=None (a replicated pool)"
            raise ValueError(f"pool {pool!r} takes {want}, got rank={rank!r}")
        return ObjectKey(self.fingerprint, pool, page, rank, self.tp if rank is not None else None)

    def page_keys(self, pools: Sequence[PoolSpec], pages: Sequence[PageHash]) -> list[ObjectKey]:
        """Keys of every object of `pages`, page-major: page 0's pools (and ranks), then page 1's...

        Page-major order makes a backend's "leading present keys" count whole pages first.
        """
        return [self.key(p.name, page, r) for page in pages for p in pools for r in self.ranks(p)]


def _pool_doc(p: PoolSpec) -> dict:
    fmt = dataclasses.asdict(p.byte_format) if p.byte_format is not None else None
    return {"name": p.name, "kind": str(p.kind), "index_source": p.index_source, "hit_policy": str(p.hit_policy),
            "layers": list(p.layers), "rows_per_page": p.rows_per_page, "byte_format": fmt,
            "page_shape": list(p.page_shape), "dtype": p.dtype, "sharding": str(p.sharding),
            "shard_axis": p.shard_axis, "ratio": p.ratio}


def _plain(value):
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, np.generic):
        return value.item()
    return value
