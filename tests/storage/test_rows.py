"""The objects' places in a host row are the pools' runs of the packed row format, byte for byte."""
import jax
import numpy as np
import pytest

from hicache_jax.layout.rows import RowFormat
from hicache_jax.storage import KeySpace, PageObjects
from hicache_jax.storage import rows as storage_rows
from storage_helpers import load_layout


@pytest.mark.parametrize("name, tp", [("tiny_v4", 1), ("tiny_v41", 1), ("tiny_gqa", 1), ("tiny_gqa", 2),
                                      ("tiny_v4", 2)])
def test_segments_are_the_pools_of_a_host_row(name, tp):
    layout = load_layout(name)
    keys = KeySpace(layout, tp=tp)
    for allocator in storage_rows.byte_allocators(layout):
        fmt = RowFormat.create(layout, allocator, tp)
        mine = PageObjects.create(keys, allocator)
        assert mine.row_bytes == fmt.row_bytes
        rng = np.random.default_rng(0)
        pages = {p.name: rng.integers(0, 256, (p.num_layers, *p.page_shape)).astype(p.dtype) if p.dtype != "bfloat16"
                 else rng.standard_normal((p.num_layers, *p.page_shape)).astype(jax.numpy.bfloat16)
                 for p in fmt.pools}
        row = fmt.encode(pages).view(np.uint8)
        for seg in mine.spans:          # each span is that pool's page (that rank's shard) as it lies
            spec = layout.pool(seg.pool)
            page = pages[seg.pool]
            if seg.rank is not None and fmt.sharded:
                width = spec.shard_page_shape(tp)[spec.shard_axis]
                page = np.take(page, np.arange(seg.rank * width, (seg.rank + 1) * width), axis=1 + spec.shard_axis)
            assert row[seg.offset:seg.offset + seg.nbytes].tobytes() == np.ascontiguousarray(page).tobytes()
        assert [k.pool for k in keys.page_keys(mine.pools, [b"\0" * 32])] == [s.pool for s in mine.spans]


def test_allocator_without_bytes_is_refused():
    with pytest.raises(ValueError, match="carries no byte-holding pool"):
        PageObjects.create(KeySpace(load_layout("tiny_gqa")), "swa")
