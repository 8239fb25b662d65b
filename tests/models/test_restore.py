"""Bit-identity of the tiny models when a prefix comes from another copy of the pools.

A prefix of k pages is "restored" by copying exactly what a cache keeps (k anchor pages of
the kv-indexed pools, SWA page k-1 with its ring state) to other page ids in pools full of
garbage; continuing the request must give the recorded logits bit for bit. Corrupting any
one pool's restored bytes must change them: every pool is really read.
"""
import numpy as np
import pytest

import model_harness as H

BASE = ["tiny_v4", "tiny_v41", "tiny_gqa"]
ALL = BASE + ["tiny_v41_sm100", "tiny_v4_fp4_indexer"]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("k,fill", [(1, "random"), (2, "nan"), (3, "random")])
def test_restored_prefix_gives_identical_logits(name, k, fill):
    rec = H.recorded(name)
    pools, anchor, swa = H.restore(name, k, seed=40 + k, fill=fill)
    got = H.continue_from(name, pools, anchor, swa, k)
    assert [i for i, _ in got] == [i for i, (p, _) in enumerate(H.CALLS) if p >= k]
    for i, logits in got:
        valid = H.CALLS[i][1]
        assert np.all(np.isfinite(logits[:valid]))
        assert same_bits(logits[:valid], rec.logits[i][:valid]), (name, k, i)


@pytest.mark.parametrize("name", ALL)
def test_every_pool_is_read(name):
    """Corrupting one pool's restored bytes (state pools: the boundary ring) changes page 2's logits."""
    m = H.model(name)
    clean = H.recorded(name).logits[2]
    for spec in m.layout.byte_pools:
        pools, anchor, swa = H.restore(name, 2, seed=50, corrupt=spec.name)
        [(_, logits)] = H.continue_from(name, pools, anchor, swa, 2, calls={2})
        assert np.all(np.isfinite(logits))
        assert not same_bits(logits, clean), f"{name}: corrupting pool {spec.name!r} changed nothing"


@pytest.mark.parametrize("name", BASE)
def test_decode_by_growing_valid_equals_prefill(name):
    """Page 3 prefilled at once (other padding, via forward_chunk) == decoded token by token."""
    m, rec = H.model(name), H.recorded(name)
    page, valid = H.CALLS[-1]
    pools, logits = m.forward_chunk(H.device(rec.pools_after[2]), rec.anchor, rec.swa,
                                    H.page_tokens(rec.stream, page, valid, pad_seed=999), page * H.PAGE, valid)
    assert logits.shape == (m.vocab_size,)
    assert same_bits(np.asarray(logits), rec.logits[-1][valid - 1])
    final = rec.pools_after[-1]
    for k, v in H.host(pools).items():
        assert np.array_equal(v.view(np.uint8), final[k].view(np.uint8)), k
