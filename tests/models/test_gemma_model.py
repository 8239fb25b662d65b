"""The Gemma 3 architecture (tiny random weights, no GGUF) over paged pools and through HiCache.

A 512-token window over 256-token pages: the first chunk of page q reads logical pages
q-2 and q-1 of the SWA pool. A prefix restored from the host brings both window pages,
and continuing from it gives logits bit-identical to a full recompute.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hicache_jax as hc
from conftest import CONFIGS
from examples.decode import identical, warm_up
from examples.gemma.model import GemmaModel
from examples.serving_loop import run_cached, run_uncached

P, C, MAX_PAGES = 256, 64, 6
SWA, GLOBAL = "gemma3_swa_kv", "gemma3_global_kv"


@pytest.fixture(scope="module")
def model():
    layout = hc.build_layout(hc.load_model_config(CONFIGS / "tiny_gemma3.json"))
    return GemmaModel.random(layout, seed=0, max_pages=MAX_PAGES, chunk_size=C)


def zeros(model, pages=8):
    return {k: jnp.zeros(s, d) for k, (s, d) in model.pool_shapes(pages, pages).items()}


def chunked(model, pools, seq, start, end, anchor, swa, valid_steps=False):
    """Run positions start..end-1 chunk by chunk (or, with `valid_steps`, one `valid` at a time);
    returns (pools, {position: logits})."""
    out = {}
    for q in range(start // C, -(-end // C)):
        hi = min(end, (q + 1) * C)
        for e in (range(max(start, q * C) + 1, hi + 1) if valid_steps else [hi]):
            toks = np.zeros(C, np.int32)
            toks[:e - q * C] = seq[q * C:e]
            pools, lg = model.forward_chunk(pools, anchor, swa, toks, q * C, e - q * C)
            out[e - 1] = np.asarray(lg)
    return pools, out


def bits(x):
    return x.view(np.uint32)


def test_decode_by_growing_valid_equals_prefill(model):
    seq = np.random.default_rng(1).integers(0, 512, 2 * P + 40).astype(np.int32)
    table = np.arange(MAX_PAGES, dtype=np.int32)
    a, la = chunked(model, zeros(model), seq, 0, len(seq), table, table)
    b, lb = chunked(model, zeros(model), seq, 0, 2 * P, table, table)
    b, lb2 = chunked(model, b, seq, 2 * P, len(seq), table, table, valid_steps=True)
    assert np.array_equal(bits(la[len(seq) - 1]), bits(lb2[len(seq) - 1]))
    for k in a:   # every K/V byte the same, written by full chunks or row by row
        assert np.array_equal(np.asarray(a[k]).view(np.uint16), np.asarray(b[k]).view(np.uint16)), k


def test_skipping_the_head_changes_no_pool_byte(model):
    """Prefill chunks before the last run without the head (logits=False): same program, same K/V."""
    seq = np.random.default_rng(4).integers(0, 512, P + 20).astype(np.int32)
    table = np.arange(MAX_PAGES, dtype=np.int32)
    a, la = chunked(model, zeros(model), seq, 0, len(seq), table, table)
    b = zeros(model)
    for q in range(-(-len(seq) // C)):
        end = min(len(seq), (q + 1) * C)
        toks = np.zeros(C, np.int32)
        toks[:end - q * C] = seq[q * C:end]
        last = end == len(seq)
        b, lg = model.forward_chunk(b, table, table, toks, q * C, end - q * C, logits=last)
        assert (lg is None) != last
    assert np.array_equal(bits(np.asarray(lg)), bits(la[len(seq) - 1]))
    for k in a:
        assert np.array_equal(np.asarray(a[k]).view(np.uint16), np.asarray(b[k]).view(np.uint16)), k


def test_the_window_is_exactly_two_pages(model):
    """Page 3's first chunk reads SWA pages 1 and 2 (garbage there changes its logits), not page 0."""
    seq = np.random.default_rng(2).integers(0, 512, 3 * P + 10).astype(np.int32)
    table = np.arange(MAX_PAGES, dtype=np.int32)
    pools, _ = chunked(model, zeros(model), seq, 0, 3 * P, table, table)
    host = {k: np.asarray(v) for k, v in pools.items()}
    _, clean = chunked(model, {k: jnp.asarray(v) for k, v in host.items()}, seq, 3 * P, 3 * P + 10, table, table)
    for page, changes in ((0, False), (1, True), (2, True)):
        bad = dict(host)
        bad[SWA] = host[SWA].copy()
        bad[SWA][:, page] = np.random.default_rng(page).standard_normal(bad[SWA][:, page].shape).astype(bad[SWA].dtype)
        _, got = chunked(model, {k: jnp.asarray(v) for k, v in bad.items()}, seq, 3 * P, 3 * P + 10, table, table)
        same = np.array_equal(bits(got[3 * P + 9]), bits(clean[3 * P + 9]))
        assert same != changes, f"SWA page {page}: changed={not same}, expected {changes}"


def test_host_hit_restoring_a_two_page_window_is_bit_identical(model):
    layout = model.layout
    cache = hc.HiCache(layout, hc.HiCacheConfig(device_pages=MAX_PAGES, host_pages=16, check_invariants=True))
    warm_up(model, cache)
    rng = np.random.default_rng(3)
    first = rng.integers(1, 512, 3 * P + 40).astype(np.int32)
    a = run_cached(cache, model, first, 4)
    cache.drain()
    assert cache.evict(MAX_PAGES).device_pages == 3               # every cached page leaves the device
    second = np.concatenate([first, a.tokens, rng.integers(1, 512, 90)]).astype(np.int32)
    b = run_cached(cache, model, second, 4)
    assert (b.device_hit, b.host_hit) == (0, 3 * P)
    s = cache.stats()
    assert s.load_bytes[SWA] == 2 * layout.pool(SWA).num_layers * layout.pool(SWA).page_bytes   # both window pages
    assert s.load_bytes[GLOBAL] == 3 * layout.pool(GLOBAL).num_layers * layout.pool(GLOBAL).page_bytes
    pools = jax.tree.map(jnp.zeros_like, cache.device_pools)
    pools, x = run_uncached(model, pools, first, 4)
    _, y = run_uncached(model, pools, second, 4)
    assert identical([a, b], [x, y])


def test_gemma_model_rejects_other_layouts_and_bad_chunks(model):
    gqa = hc.build_layout(hc.load_model_config(CONFIGS / "tiny_gqa.json"))
    with pytest.raises(ValueError, match="model_type 'gemma3_text'"):
        GemmaModel.random(gqa)
    with pytest.raises(ValueError, match="chunk_size must be a positive divisor of page_size 256, got 48"):
        GemmaModel.random(model.layout, chunk_size=48)
    with pytest.raises(ValueError, match="valid must be in 1..64, got 65"):
        table = np.zeros(MAX_PAGES, np.int32)
        model.forward_chunk(zeros(model), table, table, np.zeros(C, np.int32), 0, 65)
    with pytest.raises(NotImplementedError, match="last valid row only"):
        model.forward_chunk_all()
