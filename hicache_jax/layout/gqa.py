"""Pool layout of a plain GQA/MHA model: an anchor plus one K/V pool sharded by kv head.

The K/V bytes ride on the anchor's slots (a ratio-1 kv sidecar), so the tree and the
allocators are the same code for every model family. Each page of one layer is
`[2 (K, V), num_key_value_heads, page_size, head_dim]`; TP ranks split the head axis.
"""
from __future__ import annotations

from hicache_jax.config import ModelConfig
from hicache_jax.layout.names import HitPolicy, Placement, PoolKind, PoolName
from hicache_jax.layout.pool import LayerInfo, PoolLayout, PoolSpec

KV_HEAD_AXIS = 1  # axis of the page shape split across TP ranks


def build_gqa_layout(cfg: ModelConfig) -> PoolLayout:
    if cfg.sliding_window is not None:
        raise ValueError(f"config field 'sliding_window' = {cfg.sliding_window}: sliding windows are not supported for model_type 'gqa'")
    layers = tuple(range(cfg.num_hidden_layers))
    anchor = PoolSpec(
        name=str(PoolName.KV), kind=PoolKind.ANCHOR, index_source=None, hit_policy=HitPolicy.ALL_PAGES,
        layers=(), rows_per_page=cfg.page_size, byte_format=None, page_shape=(), dtype="uint8",
        sharding=Placement.REPLICATED,
    )
    kv = PoolSpec(
        name=str(PoolName.GQA_KV), kind=PoolKind.KV_SIDECAR, index_source=str(PoolName.KV),
        hit_policy=HitPolicy.ALL_PAGES, layers=layers, rows_per_page=cfg.page_size, byte_format=None,
        page_shape=(2, cfg.num_key_value_heads, cfg.page_size, cfg.head_dim), dtype=cfg.kv_dtype,
        sharding=Placement.TP, shard_axis=KV_HEAD_AXIS, ratio=1,
    )
    infos = tuple(LayerInfo(i, 1, i, None, None) for i in layers)
    return PoolLayout(model=cfg, pools=(anchor, kv), layers=infos)
