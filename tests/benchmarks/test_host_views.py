"""`benchmarks/host_views.rows_view`: rows of a host array as their own array, sharing its memory."""
import gc
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.benchmarks.test_smoke import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from host_views import live_views, rows_view  # noqa: E402

DEV = jax.devices()[0]
HOST = jax.sharding.make_single_device_sharding(DEV, memory_kind="pinned_host")
DEVICE = jax.sharding.make_single_device_sharding(DEV, memory_kind="device")


@pytest.mark.parametrize("dtype", [np.uint8, np.uint32, np.float32, jnp.bfloat16])
def test_a_view_holds_the_rows_and_shares_the_blocks_memory(dtype):
    values = np.random.default_rng(0).integers(0, 200, (8, 4, 16)).astype(dtype)    # rows of 64 B or more
    block = jax.device_put(values, HOST)
    view = rows_view(block, 2, 7)
    assert view.shape == (5, 4, 16) and view.dtype == block.dtype
    row_bytes = block.nbytes // 8
    assert view.unsafe_buffer_pointer() == block.unsafe_buffer_pointer() + 2 * row_bytes
    assert np.array_equal(np.asarray(view), values[2:7])
    moved = jax.device_put(view, DEVICE)
    assert moved.sharding.memory_kind == "device" and np.array_equal(np.asarray(moved), values[2:7])


def test_a_view_keeps_its_block_alive_and_is_freed_with_its_array():
    gc.collect()
    before = live_views()
    values = np.arange(6 * 64, dtype=np.uint32).reshape(6, 64)
    block = jax.device_put(values, HOST)
    view = rows_view(block, 4, 6)
    del block                     # the view alone still reads the block's rows
    gc.collect()
    assert live_views() == before + 1 and np.array_equal(np.asarray(view), values[4:6])
    del view
    gc.collect()
    assert live_views() == before


@pytest.mark.parametrize("start, stop", [(-1, 2), (3, 3), (5, 2), (0, 9)])
def test_rows_outside_the_block_are_refused(start, stop):
    block = jax.device_put(np.zeros((8, 4), np.uint32), HOST)
    with pytest.raises(ValueError, match=rf"\[{start}, {stop}\).*8 rows"):
        rows_view(block, start, stop)


def test_rows_off_the_alignment_are_refused():
    block = jax.device_put(np.zeros((8, 40), np.uint8), HOST)      # rows of 40 B: row 1 starts off 64 B
    assert rows_view(block, 0, 2).shape == (2, 40)
    with pytest.raises(ValueError, match="row 1 of a block of 40 B rows"):
        rows_view(block, 1, 2)
