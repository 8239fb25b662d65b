"""The forward_chunk contract: exact rows written, ignored inputs, argument checks, seeding."""
import numpy as np
import pytest

import hicache_jax as hc
import model_harness as H
from examples.tiny_models import make_model
from hicache_jax import codecs


def rows_changed(spec, before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """bool[rows]: which rows (data or scale bytes) of one page of one layer changed."""
    if spec.byte_format is None:  # GQA page [2, kv_heads, page_size, head_dim]: rows on axis 2
        return (before.view(np.uint8).reshape(2, before.shape[1], before.shape[2], -1)
                != after.view(np.uint8).reshape(2, after.shape[1], after.shape[2], -1)).any(axis=(0, 1, 3))
    (db, sb), (da, sa) = (codecs.unpack_page(spec.byte_format, p, spec.rows_per_page) for p in (before, after))
    return (db != da).any(axis=-1) | (sb != sa).any(axis=-1)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny_v4", "tiny_v41", "tiny_gqa"])
def test_writes_exactly_the_rows_of_valid_positions(name):
    """Page 3 with 5 valid tokens: swa rows 0-4, ring rows 0-4, complete compressed entries only."""
    m, rec = H.model(name), H.recorded(name)
    valid, page = 5, 3
    before = rec.pools_after[2]
    pools, _ = m.forward_chunk(H.device(before), rec.anchor, rec.swa, H.page_tokens(rec.stream, page, valid),
                               page * H.PAGE, valid)
    after = H.host(pools)
    for spec in m.layout.byte_pools:
        dev_page = rec.anchor[page] if spec.allocator == "kv" else rec.swa[page]
        want = np.arange(spec.rows_per_page) < valid // spec.ratio  # ring rows: ratio 1, one row a position
        for slot in range(spec.num_layers):
            got = rows_changed(spec, before[spec.name][slot, dev_page], after[spec.name][slot, dev_page])
            assert np.array_equal(got, want), (spec.name, slot, np.nonzero(got)[0])


def test_gqa_ignores_swa_pages():
    m, rec = H.model("tiny_gqa"), H.recorded("tiny_gqa")
    page, valid = H.CALLS[3]
    _, logits = m.forward_chunk(H.device(rec.pools_after[2]), rec.anchor, np.zeros(H.MAX_PAGES, np.int32),
                                H.page_tokens(rec.stream, page, valid, pad_seed=3), page * H.PAGE, valid)
    assert np.array_equal(np.asarray(logits).view(np.uint32), rec.logits[3][valid - 1].view(np.uint32))


def test_model_attributes_and_seeding():
    layout = hc.build_layout(hc.load_model_config(H.CONFIGS / "tiny_v4.json"))
    a, b, c = (make_model(layout, seed=s, max_pages=4) for s in (0, 0, 1))
    assert (a.page_size, a.max_pages, a.vocab_size) == (256, 4, 512)
    assert np.array_equal(a.params["embed"], b.params["embed"])
    assert not np.array_equal(a.params["embed"], c.params["embed"])
    shapes = a.pool_shapes(12, 10)
    assert shapes["deepseek_v4_c4"] == ((2, 12, 12480), "uint8")
    assert shapes["deepseek_v4_c4_state"] == ((2, 10, 16384), "uint8")
    assert "kv" not in shapes


def test_caller_mistakes_raise_value_error():
    m, rec = H.model("tiny_v4"), H.recorded("tiny_v4")
    pools = rec.pools_after[-1]
    toks = np.zeros(H.PAGE, np.int32)
    args = (rec.anchor, rec.swa, toks)
    with pytest.raises(ValueError, match="multiple of chunk_size 256, got 100"):
        m.forward_chunk(pools, *args, 100, 1)
    with pytest.raises(ValueError, match=r"valid must be in 1\.\.256, got 0"):
        m.forward_chunk(pools, *args, 0, 0)
    with pytest.raises(ValueError, match="beyond max_pages 8"):
        m.forward_chunk(pools, *args, 8 * 256, 1)
    with pytest.raises(ValueError, match="anchor_pages must be int"):
        m.forward_chunk(pools, rec.anchor[:3], rec.swa, toks, 0, 1)
    with pytest.raises(ValueError, match="tokens must be int"):
        m.forward_chunk(pools, rec.anchor, rec.swa, toks[:10], 0, 1)
    missing = {k: v for k, v in pools.items() if k != "deepseek_v4_c128"}
    with pytest.raises(ValueError, match="exactly the layout's byte pools"):
        m.forward_chunk(missing, *args, 0, 1)
    bad = dict(pools, deepseek_v4_c128=pools["deepseek_v4_c128"][:, :, :100])
    with pytest.raises(ValueError, match="pool 'deepseek_v4_c128' must be uint8"):
        m.forward_chunk(bad, *args, 0, 1)
    short = dict(pools, deepseek_v4_c4=pools["deepseek_v4_c4"][:, :5])
    with pytest.raises(ValueError, match="indexed by 'kv' have 5"):
        m.forward_chunk(short, *args, 0, 1)
    with pytest.raises(ValueError, match="takes a PoolLayout"):
        make_model(hc.load_model_config(H.CONFIGS / "tiny_v4.json"))
    with pytest.raises(ValueError, match="max_pages must be a positive int"):
        make_model(m.layout, max_pages=0)
