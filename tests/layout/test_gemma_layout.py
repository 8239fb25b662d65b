"""Gemma 3 hybrid attention: global layers' K/V on the anchor, sliding layers' K/V in a 2-page-window pool."""
import json
import subprocess
import sys

import pytest

import hicache_jax as hc
from conftest import CONFIGS, ROOT
from hicache_jax.config import model_config_from_dict

GLOBAL, SWA = "gemma3_global_kv", "gemma3_swa_kv"


def raw(name="gemma3_270m", **changes):
    d = json.loads((CONFIGS / f"{name}.json").read_text())
    d.update(changes)
    return d


def build(d):
    return hc.build_layout(model_config_from_dict(d))


def test_gemma3_270m_pool_table():
    layout = build(raw())
    got = [(p.name, p.kind, p.index_source, p.hit_policy, p.layers, p.sharding) for p in layout.pools]
    assert got == [
        ("kv", "anchor", None, "all_pages", (), "replicated"),
        (GLOBAL, "kv_sidecar", "kv", "all_pages", (5, 11, 17), "replicated"),
        (SWA, "independent", None, "trailing_pages", (0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16), "replicated"),
    ]
    for name in (GLOBAL, SWA):
        p = layout.pool(name)
        assert p.page_shape == (2, 1, 256, 256) and p.dtype == "bfloat16"
        assert p.page_bytes == 2 * 256 * 256 * 2 == 262_144
    assert layout.swa_pool.name == SWA and layout.anchor.name == "kv"
    assert [p.name for p in layout.allocator_pools] == ["gemma3_swa_kv", "kv"]
    assert layout.window_pages() == 2                       # a 512-token window spans two pages
    assert layout.bytes_per_token() == 3 * 2 * 256 * 2      # 3 global layers, K and V of one head
    assert layout.window_bytes_per_token() == 15 * 2 * 256 * 2
    assert [i.ratio for i in layout.layers] == [0 if (i + 1) % 6 else 1 for i in range(18)]


def test_tiny_gemma3_has_both_kinds_and_the_same_window():
    layout = build(raw("tiny_gemma3"))
    assert layout.pool(GLOBAL).layers == (2,) and layout.pool(SWA).layers == (0, 1, 3)
    assert layout.pool(SWA).layer_slot(3) == 2
    assert layout.window_pages() == 2


def test_more_kv_heads_are_tp_sharded():
    layout = build(raw(num_key_value_heads=4, num_attention_heads=8))
    for name in (GLOBAL, SWA):
        p = layout.pool(name)
        assert p.sharding == "tp" and p.shard_page_shape(2) == (2, 2, 256, 256)


def test_only_one_kind_of_layer():
    full = build(raw(layer_types=["full_attention"] * 18, sliding_window=None))
    assert [p.name for p in full.pools] == ["kv", GLOBAL] and full.swa_pool is None
    local = build(raw(layer_types=["sliding_attention"] * 18))
    assert [p.name for p in local.pools] == ["kv", SWA]


@pytest.mark.parametrize("changes,message", [
    ({"layer_types": None}, "config field 'layer_types' is missing"),
    ({"layer_types": ["sliding_attention"] * 17}, "'layer_types' has 17 entries for num_hidden_layers=18"),
    ({"layer_types": ["sliding_attention"] * 17 + ["local"]}, r"layer_types\[17\] = 'local' is not one of"),
    ({"layer_types": "sliding_attention"}, "'layer_types' must be a list of strings"),
    ({"sliding_window": None}, "config field 'sliding_window' is missing: layers"),
    ({"layer_types": ["full_attention"] * 18}, "'sliding_window' = 512 but no layer is sliding_attention"),
    ({"rope_theta": "big"}, "config field 'rope_theta' must be a number"),
    ({"kv_dtype": "int8"}, "config field 'kv_dtype' must be one of"),
])
def test_bad_gemma_configs_name_the_field(changes, message):
    with pytest.raises(ValueError, match=message):
        build(raw(**changes))


def test_cli_prints_the_hybrid_pools():
    r = subprocess.run([sys.executable, "-m", "hicache_jax.layout", str(CONFIGS / "gemma3_270m.json"),
                        "--tokens", "100000"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "18 layers (15 sliding-window, 3 global), page 256 tokens, window 512, bfloat16 K/V" in out
    assert f"\n{GLOBAL} " in out and f"\n{SWA} " in out and "262,144" in out
    # 100,000 tokens -> 391 pages x 3 layers x 262,144 B = 293.25 MiB; a window is 2 pages x 15 layers
    assert "391 pages" in out and "293.25 MiB" in out
    assert "(gemma3_swa_kv; 2 pages): 7.50 MiB" in out
