"""What each DeepSeek V4 / V4.1 layer reads and writes, derived from the pool layout.

    V4    ratio 4    writes c4 (latent), c4_indexer (keys), c4_state + c4_indexer_state (rings)
                     reads  its own c4 through its own top-k
          ratio 128  writes c128; reads every complete c128 entry (no indexer)
    V4.1  ratio r in (1, 2), kv source     writes c{r} and c{r}_indexer (+ _indexer_scale)
          every ratio-r layer              reads c{r} of `kv_source` through the top-k of
                                           `index_source`, whose query scores the keys
                                           of `index_keys`
    all   ratio 0 and above                writes and reads its SWA page (window)
"""
from __future__ import annotations

import dataclasses

from hicache_jax.layout import PoolLayout, PoolName
from examples.tiny_models.compressor import RingState
from examples.tiny_models.paged import PagedStore

# ratio -> (latent pool, (key pool, key scale pool or None) or None, (kv ring, key ring) or None)
_V4_STORAGE = {
    4: (PoolName.C4, (PoolName.C4_INDEXER, None), (PoolName.C4_STATE, PoolName.C4_INDEXER_STATE)),
    128: (PoolName.C128, None, None),
}
_V41_STORAGE = {
    1: (PoolName.C1, (PoolName.C1_INDEXER, PoolName.C1_INDEXER_SCALE), None),
    2: (PoolName.C2, (PoolName.C2_INDEXER, PoolName.C2_INDEXER_SCALE), None),
}


@dataclasses.dataclass(frozen=True)
class LayerPlan:
    layer: int
    ratio: int                          # 0: window only
    latent: PagedStore | None           # compressed latents this layer attends to (of `latent_layer`)
    latent_layer: int | None
    writes: bool                        # this layer computes and stores latent (+ keys, rings)
    keys: PagedStore | None             # indexer keys: written if `writes`, scored if `queries`
    keys_layer: int | None              # layer whose keys this layer's query scores
    rings: tuple[RingState, RingState] | None  # (latent ring, key ring), ratio 4 only
    queries: bool                       # computes its own index query and top-k
    topk_layer: int | None              # whose top-k selects this layer's entries (None: all entries)


def plan_layers(layout: PoolLayout) -> tuple[LayerPlan, ...]:
    """One plan per model layer (a pool the layer needs but the layout lacks: KeyError)."""
    storage = _V41_STORAGE if layout.model.model_type == "deepseek_v41" else _V4_STORAGE
    plans = []
    for info in layout.layers:
        if info.ratio == 0:
            plans.append(LayerPlan(info.layer, 0, None, None, False, None, None, None, False, None))
            continue
        if info.ratio not in storage:
            raise ValueError(f"layer {info.layer}: ratio {info.ratio} is not a {layout.model.model_type} ratio")
        latent_name, key_names, ring_names = storage[info.ratio]
        writes = info.kv_source == info.layer
        keys = None
        if key_names:
            keys = PagedStore.of(layout, str(key_names[0]), None if key_names[1] is None else str(key_names[1]))
        rings = None
        if writes and ring_names:
            rings = tuple(RingState(PagedStore.of(layout, str(n)), info.ratio, layout.page_size) for n in ring_names)
        plans.append(LayerPlan(
            layer=info.layer, ratio=info.ratio,
            latent=PagedStore.of(layout, str(latent_name)), latent_layer=info.kv_source, writes=writes,
            keys=keys, keys_layer=info.index_keys,
            rings=rings, queries=info.index_source == info.layer,
            topk_layer=info.index_source,
        ))
    return tuple(plans)
