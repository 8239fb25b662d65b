"""Pack/unpack through the Triton kernels (interpreted) and the shared argument handling:
equal to the jnp references; bad index arrays fail before device work."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp

import pallas_kernels as pk

PAGES = 12


def uint8_sources(rng, pages=PAGES):
    """Three pools of unlike page sizes (one with a multi-dim page), as in a V4 kv page."""
    return [jnp.asarray(rng.integers(0, 256, (3, pages, 1728), dtype=np.uint8)),
            jnp.asarray(rng.integers(0, 256, (2, pages, 5000), dtype=np.uint8)),
            jnp.asarray(rng.integers(0, 256, (1, pages, 4, 7), dtype=np.uint8))]


def bf16_sources(rng, pages=PAGES):
    return [jnp.asarray(rng.standard_normal((2, pages, 2, 4, 16, 8)).astype(jnp.bfloat16))]


def random_staging(rng, rows, like):
    if like.dtype == jnp.uint8:
        return jnp.asarray(rng.integers(0, 256, (rows, like.shape[1]), dtype=np.uint8))
    return jnp.asarray(rng.standard_normal((rows, like.shape[1])).astype(like.dtype))


def same(a, b):
    return all(bool(jnp.array_equal(x, y)) for x, y in zip(a, b))


@pytest.mark.parametrize("make", [uint8_sources, bf16_sources])
@pytest.mark.parametrize("indices", [[5, pk.PAD, 0, 11, 3], list(range(PAGES)), [7]])
def test_gather_and_scatter_equal_reference(make, indices):
    rng = np.random.default_rng(len(indices))
    sources = make(rng)
    idx = np.array(indices, np.int32)
    got = pk.gather_pages(sources, idx, impl="triton_interpret")
    want = pk.gather_pages_reference(sources, idx)
    assert got.shape == (len(indices), sum(s.shape[0] * np.prod(s.shape[2:]) for s in sources))
    assert bool(jnp.array_equal(got, want))
    staging = random_staging(rng, len(indices) + 3, got)   # rows beyond n are ignored
    out = pk.scatter_pages(sources, staging, idx, impl="triton_interpret")
    ref = pk.scatter_pages_reference(sources, staging, idx)
    assert same(out, ref)
    # named pages now hold the staging rows; all other pages kept their bytes
    for s_old, s_new in zip(sources, out):
        untouched = sorted(set(range(PAGES)) - {i for i in indices if i != pk.PAD})
        assert bool(jnp.array_equal(s_old[:, untouched], s_new[:, untouched]))
    real = [i for i, p in enumerate(indices) if p != pk.PAD]
    back = pk.gather_pages(out, idx, impl="triton_interpret")
    assert bool(jnp.array_equal(back[np.array(real)], staging[np.array(real)]))


def odd_bf16_sources(rng, pages=PAGES):
    """A bf16 row of 1,200 bytes: not a multiple of any alignment tested."""
    return [jnp.asarray(rng.standard_normal((2, pages, 3, 100)).astype(jnp.bfloat16))]


@pytest.mark.parametrize("make", [uint8_sources, odd_bf16_sources])
@pytest.mark.parametrize("align", [256, 512])
def test_padded_rows_end_in_zeros_and_padding_is_never_unpacked(make, align):
    """Rows padded to `align` bytes: the data part as unpadded, zeros after it (fresh or
    into a dirty buffer); scatter reads only the data part."""
    rng = np.random.default_rng(align)
    sources = make(rng)
    idx = np.array([3, pk.PAD, 9, 0], np.int32)
    plain = pk.gather_pages_reference(sources, idx)
    width = pk.padded_elems(plain.shape[1], plain.dtype.itemsize, align)
    assert width > plain.shape[1] and (width * plain.dtype.itemsize) % align == 0
    dirty = random_staging(rng, 6, jnp.zeros((1, width), plain.dtype))
    for into in (None, dirty):
        got = pk.gather_pages(sources, idx, impl="triton_interpret", align_bytes=align, into=into)
        want = pk.gather_pages_reference(sources, idx, align_bytes=align, into=into)
        assert got.shape == (4 if into is None else 6, width) and bool(jnp.array_equal(got, want))
        assert bool(jnp.array_equal(got[:4, :plain.shape[1]], plain)) and not bool(jnp.any(got[:4, plain.shape[1]:]))
        if into is not None:
            assert bool(jnp.array_equal(got[4:], dirty[4:]))
    staging = random_staging(rng, 4, dirty)                 # garbage in the padding too
    out = pk.scatter_pages(sources, staging, idx, impl="triton_interpret", align_bytes=align)
    assert same(out, pk.scatter_pages_reference(sources, staging, idx))
    back = pk.gather_pages(out, idx, impl="triton_interpret", align_bytes=align)
    real = np.array([0, 2, 3])
    assert bool(jnp.array_equal(back[real, :plain.shape[1]], staging[real, :plain.shape[1]]))
    with pytest.raises(ValueError, match="align_bytes must be a power of two"):
        pk.gather_pages(sources, idx, impl="triton_interpret", align_bytes=48)


def test_gather_into_writes_only_the_first_rows():
    rng = np.random.default_rng(1)
    sources = uint8_sources(rng)
    idx = np.array([4, 2], np.int32)
    rows = pk.gather_pages_reference(sources, idx)
    into = random_staging(rng, 6, rows)
    for impl in ("triton_interpret", "reference"):
        got = pk.gather_pages(sources, idx, into=into, impl=impl)
        assert bool(jnp.array_equal(got[:2], rows)) and bool(jnp.array_equal(got[2:], into[2:]))


def test_empty_index_arrays_move_nothing():
    rng = np.random.default_rng(2)
    sources = uint8_sources(rng)
    empty = np.zeros((0,), np.int32)
    for impl in ("tpu_interpret", "triton_interpret", "reference"):  # mosaic_gpu: test_kernel_backends.py
        assert pk.gather_pages(sources, empty, impl=impl).shape[0] == 0
        staging = jnp.zeros((1, pk.gather_pages_reference(sources, np.array([0], np.int32)).shape[1]), jnp.uint8)
        assert same(pk.scatter_pages(sources, staging, empty, impl=impl), sources)


def test_kernels_work_inside_jit_with_donation():
    rng = np.random.default_rng(3)
    sources = uint8_sources(rng)
    idx = np.array([1, 9, 4], np.int32)
    staging = random_staging(rng, 3, pk.gather_pages_reference(sources, idx))
    want = pk.scatter_pages_reference(sources, staging, idx)
    scatter = jax.jit(lambda s, x, i: pk.scatter_pages(s, x, i, impl="triton_interpret"), donate_argnums=0)
    got = scatter([s + 0 for s in sources], staging, idx)
    assert same(got, want)


@pytest.mark.parametrize("bad, message", [
    (np.array([1, 2], np.int64), "int32"),
    (np.array([[1, 2]], np.int32), "1-D"),
    (np.array([1, PAGES], np.int32), "outside"),
    (np.array([-2], np.int32), "outside"),
])
def test_bad_indices_raise_before_any_device_work(bad, message):
    sources = uint8_sources(np.random.default_rng(4))
    before = [np.asarray(s) for s in sources]
    staging = jnp.zeros((4, pk.gather_pages_reference(sources, np.array([0], np.int32)).shape[1]), jnp.uint8)
    for impl in ("tpu", "triton", "reference"):  # mosaic_gpu: test_kernel_backends.py
        with pytest.raises(ValueError, match=message):
            pk.gather_pages(sources, bad, impl=impl)
        with pytest.raises(ValueError, match=message):
            pk.scatter_pages(sources, staging, bad, impl=impl)
    assert all(np.array_equal(b, np.asarray(s)) for b, s in zip(before, sources))


def test_scatter_rejects_repeated_pages_and_bad_arguments():
    sources = uint8_sources(np.random.default_rng(5))
    width = pk.gather_pages_reference(sources, np.array([0], np.int32)).shape[1]
    staging = jnp.zeros((4, width), jnp.uint8)
    with pytest.raises(ValueError, match="repeat"):
        pk.scatter_pages(sources, staging, np.array([3, pk.PAD, 3], np.int32), impl="triton_interpret")
    pk.gather_pages(sources, np.array([3, 3], np.int32), impl="reference")  # a gather may repeat
    # (impl="reference": on a GPU, "auto" picks mosaic_gpu, which refuses these 5000 B pages first)
    with pytest.raises(ValueError, match="staging"):
        pk.scatter_pages(sources, jnp.zeros((1, width), jnp.uint8), np.array([1, 2], np.int32), impl="reference")
    with pytest.raises(ValueError, match="dtype"):
        pk.gather_pages([sources[0], sources[1].astype(jnp.int8)], np.array([0], np.int32), impl="reference")
    with pytest.raises(ValueError, match="pages"):
        pk.gather_pages([sources[0], sources[1][:, :5]], np.array([0], np.int32), impl="reference")
    with pytest.raises(ValueError, match="impl"):
        pk.gather_pages(sources, np.array([0], np.int32), impl="cuda")
    with pytest.raises(ValueError, match="pages of 5000 B: the mosaic_gpu kernels move whole multiples of 16 B"):
        pk.gather_pages(sources, np.array([0], np.int32), impl="mosaic_gpu_interpret")


def test_row_layout_blocks_cover_each_page_and_stay_inside_it():
    layout = pk.pack_layout([(3, 1728), (2, 5000), (1, 28)], itemsize=1, block_bytes=1024)
    assert layout.row_elems == 3 * 1728 + 2 * 5000 + 28
    assert layout.num_blocks == sum(s.num_blocks for s in layout.segments)
    for seg in layout.segments:
        assert seg.block_elems & (seg.block_elems - 1) == 0 and seg.block_elems <= min(1024, seg.page_elems)
        for layer in range(seg.num_layers):
            covered = np.zeros(seg.page_elems, bool)
            for b in range(seg.blocks_per_page):
                got_layer, off = seg.locate(layer * seg.blocks_per_page + b, lambda c, x, y: x if c else y)
                assert got_layer == layer and 0 <= off and off + seg.block_elems <= seg.page_elems
                covered[off:off + seg.block_elems] = True
            assert covered.all()
    with pytest.raises(ValueError, match="power of two"):
        pk.pack_layout([(1, 8)], itemsize=2, block_bytes=3000)


def test_granular_blocks_cover_each_page_once():
    """Blocks for bulk DMA engines: multiples of the granule, nearly equal, the last one
    shorter, no byte copied twice (two copies in flight never write the same bytes)."""
    layout = pk.pack_layout([(21, 37440), (2, 5008), (1, 1728), (1, 16)], itemsize=1, block_bytes=16384,
                           granule_bytes=16)
    assert [(s.block_elems, s.blocks_per_page, s.last_elems) for s in layout.segments] == [
        (12480, 3, 12480), (5008, 1, 5008), (1728, 1, 1728), (16, 1, 16)]
    for page, cap in ((5008, 1024), (48, 16), (37440, 32768), (149760, 16384)):
        seg = pk.pack_layout([(2, page)], 1, cap, granule_bytes=16).segments[0]
        starts = [seg.locate(b, lambda c, x, y: x if c else y)[1] for b in range(seg.blocks_per_page)]
        sizes = [seg.block_elems] * (seg.blocks_per_page - 1) + [seg.last_elems]
        assert all(s % 16 == 0 and 0 < s <= cap for s in sizes) and sum(sizes) == page
        assert starts == [sum(sizes[:b]) for b in range(len(sizes))]
    with pytest.raises(ValueError, match="multiples of 16 B"):
        pk.pack_layout([(1, 5000)], 1, 4096, granule_bytes=16)


def test_auto_impl_per_device(caplog):
    class Device:  # the attributes auto_impl reads
        def __init__(self, platform, capability=None):
            self.platform, self.device_kind = platform, f"{platform} test device"
            if capability is not None:
                self.compute_capability = capability
    from pallas_kernels import backends
    backends._log_choice.cache_clear()
    with caplog.at_level("INFO", logger="pallas_kernels"):
        assert pk.auto_impl(Device("gpu", "9.0")) == "mosaic_gpu"
        assert pk.auto_impl(Device("gpu", "9.0")) == "mosaic_gpu"
    assert [r.getMessage() for r in caplog.records] == [
        "page kernels: mosaic_gpu (NVIDIA GPU, compute capability 9.0, gpu test device)"]   # once
    assert pk.auto_impl(Device("gpu", "10.0")) == "mosaic_gpu"
    assert pk.auto_impl(Device("gpu", "8.0")) == "triton"
    assert pk.auto_impl(Device("gpu")) == "reference"       # not CUDA (no compute capability)
    assert pk.auto_impl(Device("tpu")) == "tpu"
    assert pk.auto_impl(Device("cpu")) == "reference"
    assert pk.resolve("auto") == (pk.auto_impl(jax.devices()[0]), False)   # this machine's device
    assert pk.resolve("tpu_interpret") == ("tpu", True)


def test_wide_offsets_cover_exactly_the_misaddressed_sizes():
    from pallas_kernels._triton_offsets import ensure_wide_offsets, needs_wide_offsets
    assert needs_wide_offsets((21, 4096, 37440), "uint8")       # 3.2 GB of bytes: signed i32 overflows
    assert not needs_wide_offsets((21, 2048, 37440), "uint8")   # 1.6 GB: fits
    assert not needs_wide_offsets((21, 8192, 37440), "uint8")   # > 4 GiB: jax already uses 64 bits
    assert not needs_wide_offsets((32, 256, 2, 8, 256, 128), "bfloat16")  # < 2**31 elements
    assert ensure_wide_offsets() and ensure_wide_offsets()  # installs once, idempotent
