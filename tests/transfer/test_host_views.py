"""`hicache_jax.pools.host_views.rows_view`: rows of a host array as their own array, sharing its memory."""
import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hicache_jax as hc
from hicache_jax.pools import host_views
from hicache_jax.pools.host_views import live_views, rows_view
from hicache_jax.pools import host_tier
from hicache_jax.transfer import host_compute_violations

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


@pytest.mark.parametrize("name, tp, groups", [("tiny_v4", None, 1), ("tiny_v41", None, 2), ("tiny_gqa", None, 1),
                                              ("tiny_gqa", 2, 1)])
@pytest.mark.parametrize("views", [True, False])
@pytest.mark.parametrize("early", [False, True])
def test_parts_of_host_blocks_load_as_views_of_their_rows_exactly(name, tp, groups, views, early, monkeypatch):
    """Backed-up runs become blocks of several rows; loads of parts of them (a run inside
    one block, scattered pages of several) restore the bytes with views on or off, and
    only a one-device engine with views on makes views. With early copies (of every size
    here), a load's rows are viewed once: by the early copy, which the load then uses."""
    from tests.transfer.test_round_trip import Harness
    made, used = [], []                             # (block, row, rows) of each view made, and used
    real_make, real_view = host_tier.block_view, host_tier.BlockTable.view

    def block_view(block, row, rows, min_bytes):
        view = real_make(block, row, rows, min_bytes)
        made.extend([(block, row, rows)] if view is not None else [])
        return view

    def table_view(table, block, row, rows, min_bytes):
        view = real_view(table, block, row, rows, min_bytes)
        used.extend([(table.arrays[block], row, rows)] if view is not None else [])
        return view
    monkeypatch.setattr(host_tier, "block_view", block_view)
    monkeypatch.setattr(host_tier.BlockTable, "view", table_view)      # a load's views and an early copy's
    t = Harness(name, tp, "reference", groups, fuse_after=0, view_bytes=0 if views else None)
    t.engine._early.early_bytes = 0 if early else 1 << 62
    t.run("backup", {a: (np.arange(8), np.arange(16, 24)) for a in t.allocators})
    for dev, host in (([9, 3], [18, 19]),                 # a run inside one block
                      ([11, 0, 5], [17, 20, 22]),         # pieces of blocks
                      ([1, 2, 4], [23, 3, 16])):          # and a one-row block
        for again in (False, True):         # the same rows loaded twice: the views are made once
            made_before, used_before = len(made), len(used)
            t.run("load", {a: (np.array(dev), np.array(host)) for a in t.allocators})
            viewed = [(id(block[0]), row, rows) for block, row, rows in used[used_before:]]
            assert len(set(viewed)) == len(viewed), "rows moved twice for one load"
            assert not again or len(made) == made_before, "a view made again"
    assert bool(made) == bool(used) == (views and tp is None)
    assert all(row > 0 or rows < block[0].shape[0] for block, row, rows in made)   # never a whole block
    jaxprs = t.engine.program_jaxprs()
    assert jaxprs and all(not host_compute_violations(j) for j in jaxprs.values())


def test_a_blocks_views_are_kept_with_it_and_dropped_with_it():
    from tests.transfer.test_round_trip import Harness
    t = Harness("tiny_v4", None, "reference", fuse_after=0, view_bytes=0)
    backup = {a: (np.arange(8), np.arange(16, 24)) for a in t.allocators}
    t.run("backup", backup)
    t.run("load", {a: (np.array([9, 3]), np.array([18, 19])) for a in t.allocators})
    tables = [t.engine.host.tables[a] for a in t.allocators]
    kept = {id(table): set(table.views) for table in tables}
    assert any(kept.values())
    gc.collect()
    before = live_views()
    t.run("backup", backup)                  # the same host pages written again: their old blocks go
    gc.collect()
    for table in tables:
        table.check_invariants()
        assert not kept[id(table)] & set(table.views)
    if DEV.platform != "cpu":                # (the CPU copies a view at once: none stays alive)
        assert live_views() < before


def test_rows_under_view_bytes_are_not_viewed():
    block = tuple(jax.device_put(np.arange(8 * n, dtype=np.uint8).reshape(8, n), HOST) for n in (64, 192))
    assert host_views.block_view(block, 2, 4, min_bytes=None) is None
    assert host_views.block_view(block, 2, 4, min_bytes=4 * 256 + 1) is None     # 4 rows of 256 B
    view = host_views.block_view(block, 2, 4, min_bytes=4 * 256)
    assert [np.asarray(v).tolist() for v in view] == [np.asarray(b)[2:6].tolist() for b in block]


def test_the_default_views_runs_of_4_mb_and_more():
    assert hc.TransferConfig().view_bytes == 4 << 20


@pytest.mark.parametrize("bad", [-1, 1.5, "32M", True])
def test_view_bytes_must_be_a_count_or_none(bad):
    with pytest.raises(ValueError, match="view_bytes"):
        hc.TransferConfig(view_bytes=bad)


def test_rows_that_get_no_view_leave_nothing_in_the_table():
    """Views off, or rows under the floor: a load of parts of blocks keeps no entry per piece."""
    from tests.transfer.test_round_trip import Harness
    for view_bytes in (None, 1 << 40):
        t = Harness("tiny_v4", None, "reference", fuse_after=0, view_bytes=view_bytes)
        t.run("backup", {a: (np.arange(8), np.arange(16, 24)) for a in t.allocators})
        t.run("load", {a: (np.array([9, 3]), np.array([18, 19])) for a in t.allocators})
        assert all(not t.engine.host.tables[a].views for a in t.allocators)
