"""The Mosaic GPU and Pallas TPU kernels, interpreted on the CPU, equal the jnp references
on random page sets (with PAD entries), in place and inside jit; the Mosaic GPU kernels
run under the interpreter's race detector. Pools over 2^31 elements: `test_big_pools`."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp

import pallas_kernels as pk

PAGES = 16
IMPLS = ["mosaic_gpu_interpret", "tpu_interpret"]


def aligned_uint8(rng):
    """Three pools with unlike pages (16-byte multiples, as every real layout has; one of
    several blocks at a 2 KiB cap, one with a multi-dim page)."""
    return [jnp.asarray(rng.integers(0, 256, (2, PAGES, 2448), dtype=np.uint8)),
            jnp.asarray(rng.integers(0, 256, (1, PAGES, 4, 2, 64), dtype=np.uint8)),
            jnp.asarray(rng.integers(0, 256, (2, PAGES, 112), dtype=np.uint8))]


def bf16(rng):
    return [jnp.asarray(rng.standard_normal((2, PAGES, 2, 8, 24)).astype(jnp.bfloat16))]


def random_rows(rng, rows, width, dtype):
    if dtype == jnp.uint8:
        return jnp.asarray(rng.integers(0, 256, (rows, width), dtype=np.uint8))
    return jnp.asarray(rng.standard_normal((rows, width)).astype(dtype))


def random_pages(rng, n):
    """n distinct random pages, one of them PAD."""
    idx = rng.permutation(PAGES)[:n].astype(np.int32)
    idx[rng.integers(n)] = pk.PAD
    return idx


def same(a, b):
    return all(bool(jnp.array_equal(x, y)) for x, y in zip(a, b))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("make, seed", [(aligned_uint8, 0), (aligned_uint8, 1), (bf16, 2)])
def test_pack_unpack_equal_reference(impl, make, seed):
    rng = np.random.default_rng(seed)
    sources = make(rng)
    idx = random_pages(rng, 5)
    kw = dict(impl=impl, block_bytes=2048, align_bytes=512)
    want = pk.gather_pages_reference(sources, idx, align_bytes=512)
    into = random_rows(rng, 7, want.shape[1], want.dtype)     # rows past n keep their bytes
    pack = jax.jit(lambda s, i, x: pk.gather_pages(s, i, into=x, **kw), donate_argnums=2)
    got = pack(sources, idx, into + 0)
    assert bool(jnp.array_equal(got, pk.gather_pages_reference(sources, idx, into=into, align_bytes=512)))
    staging = random_rows(rng, 6, want.shape[1], want.dtype)  # garbage in the padding too
    unpack = jax.jit(lambda s, x, i: pk.scatter_pages(s, x, i, **kw), donate_argnums=0)
    out = unpack([s + 0 for s in sources], staging, idx)
    assert same(out, pk.scatter_pages_reference(sources, staging, idx))
    if seed == 0:  # a fresh output, default block size
        assert bool(jnp.array_equal(pk.gather_pages(sources, idx, impl=impl, align_bytes=512), want))


@pytest.mark.parametrize("impl", IMPLS)
def test_empty_and_bad_indices(impl):
    rng = np.random.default_rng(3)
    sources = aligned_uint8(rng)
    width = pk.gather_pages_reference(sources, np.array([0], np.int32)).shape[1]
    staging = jnp.zeros((2, width), jnp.uint8)
    assert pk.gather_pages(sources, np.zeros((0,), np.int32), impl=impl).shape == (0, width)
    assert same(pk.scatter_pages(sources, staging, np.zeros((0,), np.int32), impl=impl), sources)
    with pytest.raises(ValueError, match="outside"):
        pk.gather_pages(sources, np.array([PAGES], np.int32), impl=impl)
    with pytest.raises(ValueError, match="repeat"):
        pk.scatter_pages(sources, staging, np.array([2, 2], np.int32), impl=impl)


@pytest.mark.slow
@pytest.mark.big
@pytest.mark.parametrize("impl", IMPLS)
def test_big_pools(impl):
    """A uint8 pool of 2^31 + 2 pages' worth of elements: pages past 2^31 move exactly
    (offsets are 64-bit). About a minute and 13 GB of memory per impl on the CPU."""
    elems = 1 << 16
    pages = (1 << 31) // elems + 2
    tail = jnp.arange(2 * elems, dtype=jnp.int32).reshape(2, elems).astype(jnp.uint8) + 7
    pool = jnp.zeros((1, pages, elems), jnp.uint8).at[0, pages - 2:].set(tail)
    idx = np.array([pages - 1, 3, pages - 2], np.int32)
    assert bool(jnp.array_equal(pk.gather_pages([pool], idx, impl=impl), pk.gather_pages_reference([pool], idx)))
    rows = jnp.asarray(np.random.default_rng(0).integers(0, 256, (3, elems), dtype=np.uint8))
    (new,) = pk.scatter_pages([pool], rows, idx, impl=impl)
    del pool
    assert all(bool(jnp.array_equal(new[0, p], rows[r])) for r, p in enumerate(idx.tolist()))
