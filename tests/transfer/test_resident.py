"""Device-resident one-element indices, and how a plan program's index is laid out."""
import jax
import numpy as np
import pytest

from pallas_kernels import PAD

from hicache_jax.transfer.index_layout import INDEX_ALIGN, plan_index, split_plan_index
from hicache_jax.transfer.resident import ResidentIndices


def test_small_values_are_kept_on_the_device_once_used():
    ints = ResidentIndices(jax.devices()[0], limit=8)
    three = ints.one(3)
    assert isinstance(three, jax.Array) and three.dtype == np.int32 and np.asarray(three).tolist() == [3]
    assert three.sharding.memory_kind == "device" and three.devices() == {jax.devices()[0]}
    assert ints.one(np.int64(3)) is three and ints.index(np.array([3], np.int32)) is three
    assert len(ints) == 1
    for outside in (-1, 8, 2 ** 31 - 1):        # e.g. a PAD entry: a numpy index, nothing kept
        got = ints.one(outside)
        assert isinstance(got, np.ndarray) and got.dtype == np.int32 and got.tolist() == [outside]
    pages = np.array([1, 2], np.int32)
    assert ints.index(pages) is pages and len(ints) == 1


def test_without_a_device_every_index_stays_numpy():
    ints = ResidentIndices(None, limit=8)
    assert isinstance(ints.one(3), np.ndarray) and isinstance(ints.index(np.array([3], np.int32)), np.ndarray)
    assert len(ints) == 0


def test_a_plan_index_passes_one_page_allocators_alone_and_the_rest_together():
    pages = [np.array([5], np.int32), np.array([1, 2, 3, 4], np.int32), np.array([7], np.int32),
             np.array([8, 9], np.int32)]
    idx = plan_index(pages, lambda i: ("kept", int(i[0])))
    assert idx[:2] == (("kept", 5), ("kept", 7)) and len(idx) == 3
    assert idx[2].tolist() == [1, 2, 3, 4] + [PAD] * (INDEX_ALIGN - 4) + [8, 9]
    parts = split_plan_index([1, 4, 1, 2], plan_index(pages, lambda i: i))
    assert [p.tolist() for p in parts] == [p.tolist() for p in pages]
    assert [p.tolist() for p in split_plan_index([1, 1], plan_index(pages[::2], lambda i: i))] == [[5], [7]]
    assert split_plan_index([3], plan_index([np.arange(3)], lambda i: i))[0].tolist() == [0, 1, 2]


@pytest.mark.parametrize("sizes", [[2, 2], [1, 32, 3], [64, 5, 1, 70], [130, 2, 64, 1, 3]])
def test_each_allocators_pages_start_256_bytes_into_the_joined_index(sizes):
    # a Mosaic GPU kernel refuses an input buffer that is not 256-byte aligned, and XLA may
    # pass a kernel its slice of the joined index as a pointer into it
    rng = np.random.default_rng(len(sizes))
    pages = [rng.integers(0, 1000, n).astype(np.int32) for n in sizes]
    idx = plan_index(pages, lambda i: i)
    joined, parts = idx[-1], split_plan_index(sizes, idx)
    assert [p.tolist() for p in parts] == [p.tolist() for p in pages]
    for part in parts:
        if part.size > 1:
            assert np.shares_memory(part, joined)
            offset = part.__array_interface__["data"][0] - joined.__array_interface__["data"][0]
            assert offset % 256 == 0, (sizes, offset)


def test_fill_keeps_every_value_and_the_arrays_already_kept():
    ints = ResidentIndices(jax.devices()[0], limit=11)
    five = ints.one(5)
    assert ints.fill(batch=4) == 11 and len(ints) == 11   # three batches, one value already kept
    assert ints.one(5) is five
    kept = [ints.one(v) for v in range(11)]
    assert all(isinstance(a, jax.Array) for a in kept) and [int(a[0]) for a in kept] == list(range(11))
    assert ints.fill() == 11 and all(ints.one(v) is a for v, a in enumerate(kept))
    assert ResidentIndices(None, limit=11).fill() == 0
