"""Pool layout of Gemma 3 (hybrid attention): global K/V on the anchor, local K/V in an SWA pool.

Gemma 3 interleaves sliding-window layers (`"sliding_attention"`, five of every six) with
full-attention layers (`"full_attention"`). A full-attention layer reads every earlier
token, so its K/V follow the anchor's pages (a ratio-1 kv sidecar, like GQA). A sliding
layer reads only the last `sliding_window` tokens, so its K/V live in an independent pool
whose pages are kept only where a prefix may end: with a 512-token window and 256-token
pages, a boundary needs the two pages before it (`window_pages() == 2`).

Each page of one layer is `[2 (K, V), num_key_value_heads, page_size, head_dim]`. With one
KV head (Gemma 3 270M / 1B) the pools are identical on every TP rank (replicated); with
more, TP ranks split the head axis.
"""
from __future__ import annotations

from hicache_jax.config import ModelConfig
from hicache_jax.layout.names import HitPolicy, Placement, PoolKind, PoolName
from hicache_jax.layout.pool import LayerInfo, PoolLayout, PoolSpec

SLIDING, FULL = "sliding_attention", "full_attention"
KV_HEAD_AXIS = 1  # axis of the page shape split across TP ranks


def build_gemma_layout(cfg: ModelConfig) -> PoolLayout:
    sliding, full = _layer_kinds(cfg)
    if sliding and cfg.sliding_window is None:
        raise ValueError(f"config field 'sliding_window' is missing: layers {list(sliding)} are sliding_attention")
    if not sliding and cfg.sliding_window is not None:
        raise ValueError(f"config field 'sliding_window' = {cfg.sliding_window} but no layer is sliding_attention")
    page_shape = (2, cfg.num_key_value_heads, cfg.page_size, cfg.head_dim)
    placement, axis = (Placement.REPLICATED, None) if cfg.num_key_value_heads == 1 else (Placement.TP, KV_HEAD_AXIS)
    anchor = PoolSpec(
        name=str(PoolName.KV), kind=PoolKind.ANCHOR, index_source=None, hit_policy=HitPolicy.ALL_PAGES,
        layers=(), rows_per_page=cfg.page_size, byte_format=None, page_shape=(), dtype="uint8",
        sharding=Placement.REPLICATED,
    )
    pools = [anchor]
    if full:
        pools.append(PoolSpec(
            name=str(PoolName.GEMMA3_GLOBAL_KV), kind=PoolKind.KV_SIDECAR, index_source=anchor.name,
            hit_policy=HitPolicy.ALL_PAGES, layers=full, rows_per_page=cfg.page_size, byte_format=None,
            page_shape=page_shape, dtype=cfg.kv_dtype, sharding=placement, shard_axis=axis, ratio=1,
        ))
    if sliding:
        pools.append(PoolSpec(
            name=str(PoolName.GEMMA3_SWA_KV), kind=PoolKind.INDEPENDENT, index_source=None,
            hit_policy=HitPolicy.TRAILING_PAGES, layers=sliding, rows_per_page=cfg.page_size, byte_format=None,
            page_shape=page_shape, dtype=cfg.kv_dtype, sharding=placement, shard_axis=axis,
        ))
    # ratio 1: reads every earlier token through the anchor; ratio 0: the window only
    infos = tuple(LayerInfo(i, 1, i, None, None) if i in full else LayerInfo(i, 0, None, None, None)
                  for i in range(cfg.num_hidden_layers))
    return PoolLayout(model=cfg, pools=tuple(pools), layers=infos)


def _layer_kinds(cfg: ModelConfig) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(sliding layers, full-attention layers), ascending."""
    kinds = cfg.layer_types
    if kinds is None:
        raise ValueError("config field 'layer_types' is missing: model_type 'gemma3_text' needs one entry per layer")
    if len(kinds) != cfg.num_hidden_layers:
        raise ValueError(f"config field 'layer_types' has {len(kinds)} entries for num_hidden_layers="
                         f"{cfg.num_hidden_layers}")
    for i, kind in enumerate(kinds):
        if kind not in (SLIDING, FULL):
            raise ValueError(f"layer_types[{i}] = {kind!r} is not one of {SLIDING}, {FULL}")
    return (tuple(i for i, k in enumerate(kinds) if k == SLIDING), tuple(i for i, k in enumerate(kinds) if k == FULL))
