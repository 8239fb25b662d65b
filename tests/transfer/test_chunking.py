"""Chunks and host-copy pieces: every plan entry lands exactly once, nothing outside a run."""
import numpy as np
import pytest

from hicache_jax.plan import coalesce
from hicache_jax.transfer.chunks import next_pow2, split, split_start
from pallas_kernels import PAD


def runs_of(host):
    return [(r.offset, r.host_start, r.length) for r in coalesce(np.asarray(host))]


def written(chunks, chunk_pages):
    """(staging row in the batch, host page) pairs the pieces copy, with repeats removed."""
    pairs = set()
    for c, chunk in enumerate(chunks):
        for g in chunk.groups:
            for row, host in zip(g.staging_rows, g.host_rows):
                for k in range(1 << g.log2_rows):
                    pairs.add((c * chunk_pages + int(row) + k, int(host) + k))
    return pairs


@pytest.mark.parametrize("seed", range(20))
def test_pieces_tile_every_run_exactly(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 70))
    host = np.sort(rng.choice(200, n, replace=False))
    dev = rng.permutation(100)[:n].astype(np.int32)
    chunk_pages = int(2 ** rng.integers(0, 6))
    chunks = split(dev, runs_of(host), chunk_pages)
    assert sum(c.num_pages for c in chunks) == n
    assert written(chunks, chunk_pages) == {(i, int(h)) for i, h in enumerate(host)}
    for c, chunk in enumerate(chunks):
        assert chunk.padded_pages == next_pow2(chunk.num_pages) <= chunk_pages
        assert np.array_equal(chunk.device_pages[:chunk.num_pages], dev[c * chunk_pages:c * chunk_pages + chunk.num_pages])
        assert (chunk.device_pages[chunk.num_pages:] == PAD).all()
        for g in chunk.groups:
            count = len(g.staging_rows)
            assert count == next_pow2(g.num_real) and (g.staging_rows[g.num_real:] == g.staging_rows[g.num_real - 1]).all()
        # the pieces joined again are the plan's runs, clipped to the chunk (loads cut them at host blocks)
        lo, hi = c * chunk_pages, c * chunk_pages + chunk.num_pages
        clipped = [(max(o, lo) - lo, h + max(o, lo) - o, min(o + n, hi) - max(o, lo))
                   for o, h, n in runs_of(host) if max(o, lo) < min(o + n, hi)]
        assert chunk.host_runs() == clipped


def test_a_whole_power_of_two_run_is_one_piece():
    chunks = split(np.arange(8, dtype=np.int32), [(0, 40, 8)], 8)
    assert len(chunks) == 1 and chunks[0].whole_run_host_start == 40
    chunks = split(np.arange(20, dtype=np.int32), [(0, 100, 20)], 8)   # 8 + 8 + 4 pages
    assert [c.whole_run_host_start for c in chunks] == [100, 108, 116]
    chunks = split(np.arange(6, dtype=np.int32), [(0, 3, 6)], 8)       # 6 = 4 + 2: two pieces
    assert chunks[0].whole_run_host_start is None
    assert [(g.log2_rows, g.host_rows.tolist()) for g in chunks[0].groups] == [(2, [3]), (1, [7])]
    chunks = split(np.arange(2, dtype=np.int32), [(0, 3, 1), (1, 9, 1)], 8)  # two runs of one
    assert chunks[0].whole_run_host_start is None and chunks[0].groups[0].host_rows.tolist() == [3, 9]


@pytest.mark.parametrize("seed", range(20))
def test_one_run_chunks_are_cut_where_split_cuts_them(seed):
    """`one_run_host_start` names exactly the chunks that are one host run from staging row
    0, and their pieces start where `split_start` says (the binary digits of their length
    above each piece's size)."""
    rng = np.random.default_rng(seed)
    chunk_pages = 16
    n = int(rng.integers(1, 40))
    gaps = rng.integers(0, 2, n) * (rng.random() < 0.5)         # half the batches: one run
    host = 5 + np.arange(n) + np.cumsum(gaps)
    for c, chunk in enumerate(split(np.arange(n, dtype=np.int32), runs_of(host), chunk_pages)):
        mine = host[c * chunk_pages:c * chunk_pages + chunk.num_pages]
        one_run = bool((np.diff(mine) == 1).all())
        start = chunk.one_run_host_start
        assert (start is not None) == one_run, (mine, start)
        if one_run:
            assert start == mine[0]
            for g in chunk.groups:
                assert int(g.staging_rows[0]) == split_start(chunk.num_pages, g.log2_rows)
                assert int(g.host_rows[0]) == start + split_start(chunk.num_pages, g.log2_rows)
