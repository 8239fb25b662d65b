"""Rows of layer ranges (`layers=`): every impl that runs on the CPU packs and unpacks
exactly the named layers of the named pages (against a numpy model), a source may be in
several segments or none, bad ranges fail before device work, and `layers=None` keeps
the layout of whole sources."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp

import pallas_kernels as pk

PAGES = 6
IMPLS = ["reference", "triton_interpret", "mosaic_gpu_interpret", "tpu_interpret"]
KW = dict(block_bytes=32)   # several blocks per page (the TPU kernels ignore it)
SPLIT = [(2, 1, 2), (0, 0, 3), (2, 0, 1)]   # source 2 in two segments, source 1 in none
DISJOINT = [(2, 1, 2), (0, 2, 1), (2, 3, 1)]  # source 2 in two segments, layers 0 of both sources kept


def sources(rng):
    """Pages of 16-byte multiples (the Mosaic GPU granule), one multi-dim, one of 3 blocks."""
    return [jnp.asarray(rng.integers(0, 256, (3, PAGES, 48), dtype=np.uint8)),
            jnp.asarray(rng.integers(0, 256, (2, PAGES, 2, 16), dtype=np.uint8)),
            jnp.asarray(rng.integers(0, 256, (4, PAGES, 32), dtype=np.uint8))]


def model_gather(srcs, idx, layers):
    srcs = [np.asarray(s) for s in srcs]
    return np.stack([np.concatenate([srcs[k][f:f + n, max(p, 0)].reshape(-1) for k, f, n in layers])
                     for p in idx.tolist()])


def model_scatter(srcs, rows, idx, layers):
    out = [np.array(s) for s in srcs]
    for row, p in zip(np.asarray(rows), idx.tolist()):
        if p == pk.PAD:
            continue
        offset = 0
        for k, f, n in layers:
            page = out[k].shape[2:]
            width = n * int(np.prod(page))
            out[k][f:f + n, p] = row[offset:offset + width].reshape(n, *page)
            offset += width
    return out


def random_rows(rng, rows, width):
    return jnp.asarray(rng.integers(0, 256, (rows, width), dtype=np.uint8))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("layers", [SPLIT, [(1, 1, 1)]], ids=["split", "one-layer"])
def test_gather_packs_the_ranges_in_order(impl, layers):
    """Fresh rows padded to 64 B, and into a dirty buffer whose later rows keep their bytes;
    a PAD row holds page 0."""
    rng = np.random.default_rng(len(layers))
    srcs = sources(rng)
    idx = np.array([4, pk.PAD, 0, 5], np.int32)
    want = model_gather(srcs, idx, layers)
    data = want.shape[1]
    width = pk.padded_elems(data, 1, 64)
    got = pk.gather_pages(srcs, idx, impl=impl, layers=layers, align_bytes=64, **KW)
    assert got.shape == (4, width) and width > data
    assert np.array_equal(np.asarray(got[:, :data]), want) and not np.asarray(got[:, data:]).any()
    into = random_rows(rng, 6, data)
    got = pk.gather_pages(srcs, idx, into=into, impl=impl, layers=layers, **KW)
    assert np.array_equal(np.asarray(got[:4]), want) and np.array_equal(np.asarray(got[4:]), np.asarray(into[4:]))


@pytest.mark.parametrize("impl", IMPLS)
def test_scatter_writes_only_the_ranges_and_round_trips(impl):
    """Inside a jit that donates the sources: the named layers of the named pages take the
    rows, every other byte (other layers, pages, the unreferenced source) is kept; the rows
    gathered back are the rows scattered, and a gather -> scatter moves pages bit-exactly."""
    rng = np.random.default_rng(7)
    srcs = sources(rng)
    idx = np.array([3, pk.PAD, 1], np.int32)
    data = model_gather(srcs, idx, DISJOINT).shape[1]
    staging = random_rows(rng, 5, data)   # rows past n are ignored
    unpack = jax.jit(lambda s, x, i: pk.scatter_pages(s, x, i, impl=impl, layers=DISJOINT, **KW), donate_argnums=0)
    out = unpack([s + 0 for s in srcs], staging, idx)
    want = model_scatter(srcs, staging[:3], idx, DISJOINT)
    assert all(np.array_equal(np.asarray(o), w) for o, w in zip(out, want))
    assert np.array_equal(np.asarray(out[1]), np.asarray(srcs[1]))
    back = pk.gather_pages(out, idx, impl=impl, layers=DISJOINT, **KW)
    assert np.array_equal(np.asarray(back), model_gather(out, idx, DISJOINT))
    assert np.array_equal(np.asarray(back[np.array([0, 2])]), np.asarray(staging[np.array([0, 2])]))
    # the rows packed from these pools, unpacked into others: the named layers now match
    other = sources(np.random.default_rng(8))
    moved = pk.scatter_pages(other, back, idx, impl=impl, layers=DISJOINT, **KW)
    want = model_scatter(other, model_gather(out, idx, DISJOINT), idx, DISJOINT)
    assert all(np.array_equal(np.asarray(o), w) for o, w in zip(moved, want))
    assert all(np.array_equal(np.asarray(moved[k][f:f + n, p]), np.asarray(out[k][f:f + n, p]))
               for k, f, n in DISJOINT for p in (3, 1))


BAD = [
    ([(3, 0, 1)], "source 3 outside 0..2"),
    ([(-1, 0, 1)], "source -1 outside"),
    ([(0, 0, 0)], "number of layers 0 < 1"),
    ([(0, 1, -2)], "number of layers -2 < 1"),
    ([(0, -1, 2)], r"layers -1..0 outside 0..2 of source 0"),
    ([(2, 3, 2)], r"layers 3..4 outside 0..3 of source 2"),
    ([(1, 0, 3)], r"layers 0..2 outside 0..1 of source 1"),
    ([(0, 0)], "is not \\(source, first layer, number of layers\\)"),
    ([(0, 0, 1.5)], "is not \\(source, first layer, number of layers\\)"),
    ([], "names no segment"),
]


@pytest.mark.parametrize("impl", IMPLS)
def test_bad_ranges_raise_before_any_device_work(impl):
    srcs = sources(np.random.default_rng(9))
    idx = np.array([0, 2], np.int32)
    staging = jnp.zeros((2, 512), jnp.uint8)
    for layers, message in BAD:
        for call in (lambda: pk.gather_pages(srcs, idx, impl=impl, layers=layers),
                     lambda: pk.scatter_pages(srcs, staging, idx, impl=impl, layers=layers)):
            with pytest.raises(ValueError, match=message):
                call()
    for overlap, twice in ([(0, 0, 2), (2, 0, 1), (0, 1, 2)], "1"), ([(2, 1, 1), (2, 1, 1)], "1"):
        with pytest.raises(ValueError, match=rf"layers \[{twice}\] of source {overlap[-1][0]} are in an earlier"):
            pk.scatter_pages(srcs, staging, idx, impl=impl, layers=overlap)
        pk.gather_pages(srcs, idx, impl="reference", layers=overlap)   # a gather may read a layer twice


def test_references_check_ranges_too():
    srcs = sources(np.random.default_rng(10))
    idx = np.array([1], np.int32)
    with pytest.raises(ValueError, match="outside 0..2 of source 0"):
        pk.gather_pages_reference(srcs, idx, layers=[(0, 2, 2)])
    with pytest.raises(ValueError, match="earlier segment"):
        pk.scatter_pages_reference(srcs, jnp.zeros((1, 512), jnp.uint8), idx, layers=[(1, 0, 2), (1, 1, 1)])


def test_granule_and_dtype_checks_still_apply():
    srcs = sources(np.random.default_rng(11))
    odd = jnp.zeros((1, PAGES, 20), jnp.uint8)
    with pytest.raises(ValueError, match="pages of 20 B"):   # every source, named in a segment or not
        pk.gather_pages([*srcs, odd], np.array([0], np.int32), impl="mosaic_gpu_interpret", layers=[(0, 0, 1)])
    with pytest.raises(ValueError, match="dtype"):
        pk.gather_pages([srcs[0], srcs[1].astype(jnp.int8)], np.array([0], np.int32), layers=[(0, 0, 1)])


@pytest.mark.parametrize("granule", [None, 16])
def test_whole_ranges_give_the_default_layout(granule):
    dims = [(3, 1728), (2, 5008), (1, 32)]
    for align in (1, 512):
        default = pk.pack_layout(dims, 1, 1024, align, granule)
        assert default == pk.pack_layout(dims, 1, 1024, align, granule, layers=[(0, 0, 3), (1, 0, 2), (2, 0, 1)])
        assert [(s.source, s.first_layer) for s in default.segments] == [(0, 0), (1, 0), (2, 0)]
    # a range's segment is cut as its whole source's, at its own offset in the row
    ranged = pk.pack_layout(dims, 1, 1024, 1, granule, layers=[(1, 1, 1), (0, 1, 2), (1, 0, 1)])
    assert [(s.source, s.first_layer, s.num_layers, s.row_offset, s.first_block) for s in ranged.segments] == [
        (1, 1, 1, 0, 0), (0, 1, 2, 5008, ranged.segments[0].num_blocks),
        (1, 0, 1, 5008 + 2 * 1728, ranged.segments[0].num_blocks + ranged.segments[1].num_blocks)]
    cut = lambda s: (s.page_elems, s.block_elems, s.blocks_per_page, s.last_elems)
    assert [cut(s) for s in ranged.segments] == [cut(default.segments[k]) for k in (1, 0, 1)]
    assert ranged.row_elems == ranged.data_elems == 2 * 5008 + 2 * 1728
    assert ranged.num_blocks == sum(s.num_blocks for s in ranged.segments)
    srcs = sources(np.random.default_rng(12))
    idx = np.array([2, pk.PAD], np.int32)
    whole = [(0, 0, 3), (1, 0, 2), (2, 0, 4)]
    assert np.array_equal(np.asarray(pk.gather_pages(srcs, idx, impl="reference")),
                          np.asarray(pk.gather_pages(srcs, idx, impl="reference", layers=whole)))
