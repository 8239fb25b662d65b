"""Which pools each model registers, with what sources, policies, layers and page bytes."""
import pytest

import hicache_jax as hc
from hicache_jax.layout import UNREGISTERED, PoolName

V4_POOLS = {
    # name: (kind, index_source, hit_policy)
    "kv": ("anchor", None, "all_pages"),
    "swa": ("independent", None, "trailing_pages"),
    "deepseek_v4_c4": ("kv_sidecar", "kv", "all_pages"),
    "deepseek_v4_c4_indexer": ("kv_sidecar", "kv", "all_pages"),
    "deepseek_v4_c128": ("kv_sidecar", "kv", "all_pages"),
    "deepseek_v4_c4_state": ("swa_state", "swa", "trailing_pages"),
    "deepseek_v4_c4_indexer_state": ("swa_state", "swa", "trailing_pages"),
}
V41_POOLS = {
    "kv": ("anchor", None, "all_pages"),
    "swa": ("independent", None, "trailing_pages"),
    **{f"deepseek_v4_c{r}{suffix}": ("kv_sidecar", "kv", "all_pages")
       for r in (1, 2) for suffix in ("", "_indexer", "_indexer_scale")},
}


def layout_of(config_path, name):
    return hc.build_layout(hc.load_model_config(config_path(name)))


@pytest.mark.parametrize("name", ["deepseek_v4_flash", "deepseek_v4_pro", "tiny_v4"])
def test_v4_registers_exactly_seven_pools(config_path, name):
    layout = layout_of(config_path, name)
    got = {p.name: (p.kind, p.index_source, p.hit_policy) for p in layout.pools}
    assert got == V4_POOLS
    assert layout.pools[0].name == "kv"
    assert "deepseek_v4_c128_state" not in got
    assert all(p.sharding == "replicated" for p in layout.pools)


@pytest.mark.parametrize("name", ["deepseek_v41_flash", "tiny_v41"])
def test_v41_registers_exactly_eight_pools(config_path, name):
    layout = layout_of(config_path, name)
    got = {p.name: (p.kind, p.index_source, p.hit_policy) for p in layout.pools}
    assert got == V41_POOLS
    assert [p.name for p in layout.pools][:2] == ["kv", "swa"]
    assert not any("state" in p.name for p in layout.pools)


def test_gqa_single_kv_pool_is_tp_sharded(config_path):
    layout = layout_of(config_path, "tiny_gqa")
    assert [(p.name, p.kind) for p in layout.pools] == [("kv", "anchor"), ("gqa_kv", "kv_sidecar")]
    kv = layout.pool("gqa_kv")
    assert kv.sharding == "tp" and kv.index_source == "kv"
    assert kv.page_shape == (2, 8, 256, 64) and kv.dtype == "bfloat16"
    assert kv.page_shape[kv.shard_axis] == 8  # split by kv head
    assert kv.shard_page_shape(4) == (2, 2, 256, 64)
    assert kv.page_bytes == 2 * 8 * 256 * 64 * 2
    with pytest.raises(ValueError, match="tp=3"):
        kv.shard_page_shape(3)


def test_unregistered_names_exist():
    for name in ("deepseek_v4_c4_rope", "deepseek_v4_c128_rope", "deepseek_v4_c128_state",
                 "draft", "draft_indexer", "draft_swa"):
        assert PoolName(name) in UNREGISTERED


# LAYOUTS.md's per-pool table at page size 256, V4 format (padding included).
V4_FLASH_PAGE_BYTES = {
    "kv": 0,
    "swa": 149_760,
    "deepseek_v4_c4": 37_440,
    "deepseek_v4_c4_indexer": 8_448,
    "deepseek_v4_c128": 1_728,
    "deepseek_v4_c4_state": 65_536,
    "deepseek_v4_c4_indexer_state": 16_384,
}


@pytest.mark.parametrize("name", ["deepseek_v4_flash", "deepseek_v4_pro"])
def test_real_v4_page_bytes_match_layouts_table(config_path, name):
    layout = layout_of(config_path, name)
    assert {p.name: p.page_bytes for p in layout.pools} == V4_FLASH_PAGE_BYTES


def test_real_v4_fp4_indexer_page_bytes(config_path):
    cfg = hc.load_model_config(config_path("deepseek_v4_flash"))
    import dataclasses
    layout = hc.build_layout(dataclasses.replace(cfg, indexer_dtype="fp4"))
    assert layout.pool("deepseek_v4_c4_indexer").page_bytes == 64 * 68 == 4_352


def test_real_v4_layer_counts(config_path):
    flash = layout_of(config_path, "deepseek_v4_flash")
    assert {p.name: p.num_layers for p in flash.pools} == {
        "kv": 0, "swa": 43, "deepseek_v4_c4": 21, "deepseek_v4_c4_indexer": 21, "deepseek_v4_c128": 20,
        "deepseek_v4_c4_state": 21, "deepseek_v4_c4_indexer_state": 21}
    pro = layout_of(config_path, "deepseek_v4_pro")
    assert pro.pool("deepseek_v4_c128").num_layers == 31 and pro.pool("deepseek_v4_c4").num_layers == 30
    # the kv-derived pages of one anchor page over all layers (PERF.md's prototype row)
    assert flash.page_bytes_of("kv") == 998_208


def test_real_v41_page_bytes_and_owners(config_path):
    layout = layout_of(config_path, "deepseek_v41_flash")
    # V4 format on H200: c2 = 128 slots x 584 B -> 74,880 (multiple of 576); c1 = 256 slots -> 149,760
    expect = {
        "kv": (0, ()), "swa": (149_760, tuple(range(40))),
        "deepseek_v4_c1": (149_760, (20,)), "deepseek_v4_c1_indexer": (256 * 64, (20,)),
        "deepseek_v4_c1_indexer_scale": (256 * 4, (20,)),
        "deepseek_v4_c2": (74_880, (2, 8, 14)), "deepseek_v4_c2_indexer": (128 * 64, (2, 8, 14)),
        "deepseek_v4_c2_indexer_scale": (128 * 4, (2, 8, 14)),
    }
    assert {p.name: (p.page_bytes, p.layers) for p in layout.pools} == expect


def test_v41_fp4_layout_global_kv_is_890_bytes_per_token(config_path):
    """V4.1-Flash on SM100 (v41 main + v41_fp4 compressed): 890 B/token of global KV."""
    import dataclasses
    cfg = hc.load_model_config(config_path("deepseek_v41_flash"))
    layout = hc.build_layout(dataclasses.replace(cfg, kv_layout="v41"))
    # c2: 3 layers x 128 slots x 288 B; c1: 1 x 256 x 288; indexers 68 B/slot (64 + 4)
    by_hand = (3 * 128 * 288 + 1 * 256 * 288 + 3 * 128 * 68 + 1 * 256 * 68) / 256
    assert by_hand == 890
    assert layout.bytes_per_token() == 890
    assert layout.pool("swa").page_bytes == 256 * 528  # V41 main: 512 fp8 + 16 scales, already 512-aligned


def test_v41_layer_sharing(config_path):
    layout = layout_of(config_path, "deepseek_v41_flash")
    src = {i.layer: i.kv_source for i in layout.layers}
    assert all(src[l] == 2 for l in range(2, 8))
    assert all(src[l] == 8 for l in range(8, 14))
    assert all(src[l] == 14 for l in range(14, 20))
    assert all(src[l] == 20 for l in range(20, 40))
    assert src[0] is None and src[1] is None
    by_layer = {i.layer: i for i in layout.layers}
    # 24 is an index source but not a kv source: its query re-scores layer 20's keys
    assert (by_layer[24].index_source, by_layer[24].index_keys) == (24, 20)
    assert (by_layer[27].index_source, by_layer[27].index_keys) == (24, 20)
    assert layout.pool("deepseek_v4_c1").layer_slot(20) == 0
    with pytest.raises(ValueError, match="layer 24 owns no storage"):
        layout.pool("deepseek_v4_c1").layer_slot(24)


def test_tiny_v4_bytes_per_token_by_hand(config_path):
    layout = layout_of(config_path, "tiny_v4")
    # V4 slot: 64 fp8 nope + 64 bf16 rope (128 B) + 64/64 scale + 1 pad = 194 B; pages pad to 192 B
    slot, align = 64 + 128 + 2, 64 + 128
    pad = lambda raw: -(-raw // align) * align
    c4 = pad(64 * slot)        # 12,416 -> 12,480
    c128 = pad(2 * slot)       # 388 -> 576
    idx = 64 * (128 + 4)       # fp8 key + fp32 scale
    assert (c4, c128, idx) == (12_480, 576, 8_448)
    # layers: C4 = {2, 4}, C128 = {3}
    assert layout.bytes_per_token() == (2 * c4 + 2 * idx + 1 * c128) / 256
    swa = pad(256 * slot)      # 49,664 -> 49,728, on all 5 layers
    c4_state = 8 * 2 * 2 * 128 * 4          # 8 ring rows x (kv, score) x (1 + overlap) x 128 fp32
    c4_idx_state = 8 * 2 * 2 * 128 * 4      # index_head_dim is 128 too
    assert layout.window_bytes_per_token() == (5 * swa + 2 * c4_state + 2 * c4_idx_state) / 256
    assert layout.pool("swa").page_bytes == swa == 49_728


def test_tiny_v41_bytes_per_token_by_hand(config_path):
    layout = layout_of(config_path, "tiny_v41")
    slot, align = 194, 192
    pad = lambda raw: -(-raw // align) * align
    # kv sources: layer 1, 3 (ratio 2) and 4 (ratio 1); fp4 indexer: 64 B payload + 4 B scale per slot
    c2, c1 = pad(128 * slot), pad(256 * slot)
    assert (c2, c1) == (24_960, 49_728)
    c2_idx, c2_scale = 128 * 64, 128 * 4
    c1_idx, c1_scale = 256 * 64, 256 * 4
    expect = (2 * (c2 + c2_idx + c2_scale) + 1 * (c1 + c1_idx + c1_scale)) / 256
    assert layout.bytes_per_token() == expect
    assert layout.window_bytes_per_token() == 6 * pad(256 * slot) / 256
    assert layout.pool("deepseek_v4_c2").layers == (1, 3)
    assert layout.pool("deepseek_v4_c1").layers == (4,)


def test_pool_lookup_and_groups(config_path):
    layout = layout_of(config_path, "tiny_v4")
    with pytest.raises(KeyError, match="nope"):
        layout.pool("nope")
    assert [p.name for p in layout.allocator_pools] == ["kv", "swa"]
    assert [p.name for p in layout.moving_with("kv")] == [
        "deepseek_v4_c4", "deepseek_v4_c4_indexer", "deepseek_v4_c128"]
    assert [p.name for p in layout.moving_with("swa")] == [
        "swa", "deepseek_v4_c4_state", "deepseek_v4_c4_indexer_state"]
    assert layout.pool("deepseek_v4_c4").rows_per_page == 64
    assert layout.pool("deepseek_v4_c128").rows_per_page == 2
    assert layout.pool("deepseek_v4_c4_state").rows_per_page == 8
    assert layout.window_pages() == 1
