"""Pool layouts of DeepSeek V4 (7 pools) and V4.1 (8 pools).

V4 (ratios 4 and 128): every compressed layer owns its compressed KV; C4 layers also own
indexer keys and two compressor rolling-state rings that follow the SWA pool.
V4.1 (ratios 1 and 2): only kv-source layers own storage (latent and indexer keys); the
other layers of that ratio read the nearest preceding source. The low-ratio indexers are
always fp4, registered as a payload pool and a scale pool.
"""
from __future__ import annotations

from hicache_jax.config import ModelConfig
from hicache_jax.layout import formats
from hicache_jax.layout.names import HitPolicy, Placement, PoolKind, PoolName
from hicache_jax.layout.pool import LayerInfo, PoolLayout, PoolSpec

VALID_RATIOS = (0, 1, 2, 4, 128)
V41_ONLY_RATIOS = (1, 2)
C4_OVERLAP = 1  # the ratio-4 compressor overlaps one chunk into the next


def build_deepseek_layout(cfg: ModelConfig) -> PoolLayout:
    v41 = cfg.model_type == "deepseek_v41"
    ratios = cfg.ratios
    _check_ratios(cfg, v41)
    if cfg.kv_layout == "unified":
        if v41:
            raise ValueError("DeepSeek-V4.1 does not support the unified KV layout yet")
        raise ValueError(
            "kv_layout 'unified' is the ROCm layout (separate c4_rope/c128_rope pools) and is "
            "not supported here; use 'v4' (H100/H200) or 'v41' (SM100)"
        )
    main_fmt, comp_fmt = _formats(cfg)
    page = cfg.page_size
    layer_infos = _layer_infos(cfg, v41)

    pools: list[PoolSpec] = [
        _pool(PoolName.KV, PoolKind.ANCHOR, None, (), page, None, page_shape=()),
        _pool(PoolName.SWA, PoolKind.INDEPENDENT, None, tuple(range(cfg.num_hidden_layers)),
              page, main_fmt, hit=HitPolicy.TRAILING_PAGES),
    ]
    c4 = tuple(i for i, r in enumerate(ratios) if r == 4)
    c128 = tuple(i for i, r in enumerate(ratios) if r == 128)
    if c4:
        idx_fmt = formats.indexer_fp8(cfg.index_head_dim) if cfg.indexer_dtype == "fp8" \
            else formats.indexer_fp4(cfg.index_head_dim)
        pools += [
            _sidecar(PoolName.C4, c4, 4, page, comp_fmt),
            _sidecar(PoolName.C4_INDEXER, c4, 4, page, idx_fmt),
        ]
    if c128:
        pools.append(_sidecar(PoolName.C128, c128, 128, page, comp_fmt))
    if c4:
        ring = (1 + C4_OVERLAP) * 4  # rows per SWA page: the current and the overlapped chunk
        state_width = 2 * (1 + C4_OVERLAP)  # kv and score, each (1 + overlap) wide
        pools += [
            _pool(PoolName.C4_STATE, PoolKind.SWA_STATE, PoolName.SWA, c4, ring,
                  formats.state_fp32(state_width * cfg.head_dim), hit=HitPolicy.TRAILING_PAGES),
            _pool(PoolName.C4_INDEXER_STATE, PoolKind.SWA_STATE, PoolName.SWA, c4, ring,
                  formats.state_fp32(state_width * cfg.index_head_dim), hit=HitPolicy.TRAILING_PAGES),
        ]
    if v41:
        sources = {info.layer for info in layer_infos if info.kv_source == info.layer}
        for ratio, names in ((1, (PoolName.C1, PoolName.C1_INDEXER, PoolName.C1_INDEXER_SCALE)),
                             (2, (PoolName.C2, PoolName.C2_INDEXER, PoolName.C2_INDEXER_SCALE))):
            owners = tuple(sorted(i for i in sources if ratios[i] == ratio))
            if not owners:
                continue
            pools += [
                _sidecar(names[0], owners, ratio, page, comp_fmt),
                _sidecar(names[1], owners, ratio, page, formats.indexer_fp4_payload(cfg.index_head_dim)),
                _sidecar(names[2], owners, ratio, page, formats.indexer_fp4_scale(cfg.index_head_dim)),
            ]
    return PoolLayout(model=cfg, pools=tuple(pools), layers=layer_infos)


def _formats(cfg: ModelConfig) -> tuple[formats.ByteFormat, formats.ByteFormat]:
    """(main format for SWA, format of compressed KV) for the configured kv_layout."""
    if cfg.kv_layout == "v4":
        fmt = formats.v4(cfg.head_dim - cfg.qk_rope_head_dim, cfg.qk_rope_head_dim)
        return fmt, fmt
    return formats.v41(cfg.head_dim), formats.v41_fp4(cfg.head_dim)


def _check_ratios(cfg: ModelConfig, v41: bool) -> None:
    for layer, r in enumerate(cfg.ratios):
        if r not in VALID_RATIOS:
            raise ValueError(f"compress_ratios[{layer}] = {r} is not one of {', '.join(map(str, VALID_RATIOS))}")
        if r in V41_ONLY_RATIOS and not v41:
            raise ValueError(
                f"compress_ratios[{layer}] = {r}: ratios 1 and 2 are DeepSeek-V4.1 only "
                f"(model_type is {cfg.model_type!r})"
            )
        if r and cfg.page_size % r:
            raise ValueError(
                f"page_size {cfg.page_size} is not a multiple of compress ratio {r} (layer {layer}); "
                f"compressed rows must not straddle pages"
            )
    if 128 in cfg.ratios and cfg.page_size % 128:
        raise ValueError(f"page_size {cfg.page_size} must be a multiple of 128 when C128 layers exist")
    if 4 in cfg.ratios and cfg.page_size < 8:
        raise ValueError(f"page_size {cfg.page_size} is smaller than the 8-row C4 state ring")


def _layer_infos(cfg: ModelConfig, v41: bool) -> tuple[LayerInfo, ...]:
    ratios = cfg.ratios
    low = [i for i, r in enumerate(ratios) if r in V41_ONLY_RATIOS]
    if not v41:
        for field in ("kv_source_layers", "index_source_layers"):
            if getattr(cfg, field) is not None:
                raise ValueError(f"config field '{field}' is DeepSeek-V4.1 only: in V4 every compressed layer owns its storage")
    kv_sources = _source_list(cfg, "kv_source_layers", cfg.kv_source_layers, low)
    index_sources = _source_list(cfg, "index_source_layers", cfg.index_source_layers, kv_sources)
    infos = []
    for layer, r in enumerate(ratios):
        if r == 0:
            infos.append(LayerInfo(layer, 0, None, None, None))
        elif r == 4:
            infos.append(LayerInfo(layer, 4, layer, layer, layer))
        elif r == 128:
            infos.append(LayerInfo(layer, 128, layer, None, None))
        else:
            kv = _nearest_preceding(kv_sources, layer)
            if kv is None:
                raise ValueError(f"layer {layer} (ratio {r}) has no preceding kv source (kv_source_layers={list(kv_sources)})")
            if ratios[kv] != r:
                raise ValueError(f"layer {layer} (ratio {r}) would read kv source layer {kv} of ratio {ratios[kv]}")
            idx = _nearest_preceding(index_sources, layer)
            if idx is None:
                raise ValueError(
                    f"layer {layer} (ratio {r}) has no preceding index source (index_source_layers={list(index_sources)})"
                )
            keys = _nearest_preceding(kv_sources, idx)
            infos.append(LayerInfo(layer, r, kv, idx, keys))
    return tuple(infos)


def _source_list(cfg: ModelConfig, field: str, given: tuple[int, ...] | None, default) -> tuple[int, ...]:
    if given is None:
        return tuple(default)
    if list(given) != sorted(set(given)):
        raise ValueError(f"config field '{field}' must be strictly ascending, got {list(given)}")
    for layer in given:
        if not 0 <= layer < cfg.num_hidden_layers:
            raise ValueError(f"config field '{field}' names layer {layer}, outside 0..{cfg.num_hidden_layers - 1}")
        if cfg.ratios[layer] not in V41_ONLY_RATIOS:
            raise ValueError(
                f"config field '{field}' names layer {layer} of compress ratio {cfg.ratios[layer]}; sources must be ratio 1 or 2"
            )
    return tuple(given)


def _nearest_preceding(sources: tuple[int, ...], layer: int) -> int | None:
    before = [s for s in sources if s <= layer]
    return before[-1] if before else None


def _sidecar(name: PoolName, layers: tuple[int, ...], ratio: int, page: int, fmt: formats.ByteFormat) -> PoolSpec:
    return _pool(name, PoolKind.KV_SIDECAR, PoolName.KV, layers, page // ratio, fmt, ratio=ratio)


def _pool(name, kind, source, layers, rows, fmt, *, hit=HitPolicy.ALL_PAGES, ratio=1, page_shape=None) -> PoolSpec:
    if page_shape is None:
        page_shape = (fmt.page_bytes(rows),)
    return PoolSpec(
        name=str(name), kind=kind, index_source=None if source is None else str(source), hit_policy=hit,
        layers=layers, rows_per_page=rows, byte_format=fmt, page_shape=page_shape, dtype="uint8",
        sharding=Placement.REPLICATED, ratio=ratio,
    )
