"""Page keys: chained, prefix-closed, and naming everything that changes a page's bytes."""
import dataclasses
import hashlib

import numpy as np
import pytest

import hicache_jax as hc
from hicache_jax.storage import KeySpace, ObjectKey, layout_fingerprint, page_hashes
from storage_helpers import load_layout, random_tokens


def test_chain_is_sha256_of_previous_digest_and_little_endian_tokens():
    tokens = np.arange(2 * 4 + 3, dtype=np.int32) * 1000003
    h = page_hashes(tokens, 4)
    assert len(h) == 2                                   # the partial page has no key
    first = hashlib.sha256(np.asarray(tokens[:4], "<i4").tobytes()).digest()
    assert h[0] == first
    assert h[1] == hashlib.sha256(first + np.asarray(tokens[4:8], "<i4").tobytes()).digest()
    assert page_hashes(tokens[4:], 4, prior=h[0]) == h[1:]   # a suffix hashes on its own


def test_prefix_closed_keys_agree_exactly_on_shared_pages():
    a = random_tokens(6, seed=1, page_size=16)
    b = a.copy()
    b[3 * 16 + 5] += 1                                   # differs inside page 3
    ha, hb = page_hashes(a, 16), page_hashes(b, 16)
    assert ha[:3] == hb[:3]
    assert all(x != y for x, y in zip(ha[3:], hb[3:]))   # a change reaches every later page
    c = np.concatenate([a[16:32], a[:16], a[32:]])       # same pages, other order: other keys
    assert page_hashes(c, 16)[2:] != ha[2:]


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match="page_size"):
        page_hashes([1, 2], 0)
    with pytest.raises(ValueError, match="1-D"):
        page_hashes(np.zeros((2, 2), np.int32), 2)
    with pytest.raises(ValueError, match="prior"):
        page_hashes([1, 2], 2, prior=b"short")


def _with(layout, **changes):
    cfg = dataclasses.replace(layout.model, **changes)
    return hc.build_layout(cfg)


@pytest.mark.parametrize("change", [
    {"head_dim": 192, "qk_rope_head_dim": 128}, {"num_hidden_layers": 6, "compress_ratios": (0, 0, 4, 128, 4, 4)},
    {"compress_ratios": (0, 0, 4, 4, 128)}, {"index_head_dim": 64}, {"indexer_dtype": "fp4"},
    {"kv_layout": "v41"}, {"page_size": 512}, {"sliding_window": 256},
])
def test_fingerprint_changes_with_each_byte_relevant_field(change):
    base = load_layout("tiny_v4")
    assert layout_fingerprint(_with(base, **change)) != layout_fingerprint(base)


def test_fingerprint_names_the_weights_and_ignores_labels():
    base = load_layout("tiny_gqa")
    assert layout_fingerprint(base) == layout_fingerprint(_with(base, name="renamed", vocab_size=99))
    assert layout_fingerprint(base, "ckpt-a") != layout_fingerprint(base, "ckpt-b")
    for change in ({"kv_dtype": "float16"}, {"num_key_value_heads": 4}, {"head_dim": 32}):
        assert layout_fingerprint(_with(base, **change)) != layout_fingerprint(base)
    v4, v41 = load_layout("tiny_v4"), load_layout("tiny_v41")
    assert len({layout_fingerprint(x) for x in (base, v4, v41)}) == 3


def test_tp_rank_only_in_keys_of_sharded_pools():
    page = page_hashes(random_tokens(1), 256)[0]
    gqa2 = KeySpace(load_layout("tiny_gqa"), tp=2)
    keys = gqa2.page_keys(gqa2.layout.byte_pools, [page])
    assert [(k.pool, k.rank, k.tp) for k in keys] == [("gqa_kv", 0, 2), ("gqa_kv", 1, 2)]
    assert keys[1].text == f"hc1/{gqa2.fingerprint}/gqa_kv@tp2r1/{page.hex()}"
    gqa1 = KeySpace(load_layout("tiny_gqa"))
    assert gqa1.page_keys(gqa1.layout.byte_pools, [page])[0].text.count("@tp1r0") == 1
    v4_1, v4_4 = KeySpace(load_layout("tiny_v4")), KeySpace(load_layout("tiny_v4"), tp=4)
    texts = [k.text for k in v4_1.page_keys(v4_1.layout.byte_pools, [page])]
    assert texts == [k.text for k in v4_4.page_keys(v4_4.layout.byte_pools, [page])]   # replicated: any tp
    assert all("@" not in t for t in texts) and len(texts) == 6


def test_key_value_errors_name_the_problem():
    ks = KeySpace(load_layout("tiny_gqa"), tp=2)
    page = page_hashes(random_tokens(1), 256)[0]
    with pytest.raises(ValueError, match="rank in 0..1"):
        ks.key("gqa_kv", page, 2)
    with pytest.raises(ValueError, match="no bytes"):
        ks.key("kv", page)
    with pytest.raises(ValueError, match="tp must be"):
        KeySpace(load_layout("tiny_gqa"), tp=0)
    with pytest.raises(ValueError, match="cannot be split"):
        KeySpace(load_layout("tiny_gqa"), tp=3)
    with pytest.raises(ValueError, match="together"):
        ObjectKey("f", "gqa_kv", page, rank=0)
