"""Chunks and host-copy pieces: every plan entry lands exactly once, nothing outside a run."""
import numpy as np
import pytest

from hicache_jax.plan import coalesce
from hicache_jax.transfer.chunks import next_pow2, split
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
def test_cut_index_names_the_first_piece_of_each_size(seed):
    """`cut_index` (what `pack_cut` reads): the chunk's device pages, then for each piece
    size 2**k below S the staging row of its first piece of that size. A chunk that is not one
    whole run has no piece of S rows; a chunk of one run from row 0 is cut at the binary
    digits of its length, largest piece first."""
    rng = np.random.default_rng(seed)
    chunk_pages = 16
    n = int(rng.integers(1, 40))
    gaps = rng.integers(0, 2, n) * (rng.random() < 0.5)         # half the batches: one run
    host = 5 + np.arange(n) + np.cumsum(gaps)
    for c, chunk in enumerate(split(np.arange(n, dtype=np.int32), runs_of(host), chunk_pages)):
        S, m = chunk.padded_pages, chunk.num_pages
        if chunk.whole_run_host_start is not None:
            continue
        index = chunk.cut_index()
        assert index.dtype == np.int32 and index.shape == (S + S.bit_length() - 1,)
        assert np.array_equal(index[:S], chunk.device_pages)
        for g in chunk.groups:
            assert g.log2_rows < S.bit_length() - 1
            assert index[S + g.log2_rows] == g.staging_rows[0] == min(g.staging_rows[: g.num_real])
        if (np.diff(host[c * chunk_pages:c * chunk_pages + m]) == 1).all():   # one run
            assert [(g.log2_rows, int(g.staging_rows[0]), g.num_real) for g in chunk.groups] == \
                [(k, (m >> (k + 1)) << (k + 1), 1) for k in range(S.bit_length() - 1, -1, -1) if m >> k & 1]



def test_whole_blocks_of_one_size_reach_staging_in_groups():
    """`staging_calls`: whole-block pieces of one size go up to H2D_GROUP per `h2d_many`
    call, a lone one by `h2d`, and early device copies alike by the programs whose key ends
    in 1 (from the device), never grouped with host blocks; a piece that is part of its
    block has a call of its own. Every piece is in exactly one call."""
    from hicache_jax.transfer.moves import H2D_GROUP, Piece, staging_calls
    from hicache_jax.transfer.programs import Program

    block = lambda rows: (np.zeros((rows, 4), np.uint8),)
    whole1 = [Piece(block(1), 0, 0, 10 + i) for i in range(H2D_GROUP + 1)]
    whole4 = [Piece(block(4), 0, 2, 20), Piece(block(4), 0, 2, 24)]
    part = [Piece(block(8), 4, 2, 30), Piece(block(2), 0, 0, 34)]       # 4 rows of 8, 1 row of 2
    copied = [Piece(block(1), 0, 0, 40, copied=True), Piece(block(4), 0, 2, 44, copied=True),
              Piece(block(4), 0, 2, 48, copied=True)]
    pieces = whole1[:2] + part + whole4 + copied + whole1[2:]
    calls = staging_calls(pieces)
    assert sorted(id(p) for _, group in calls for p in group) == sorted(map(id, pieces))
    keys = sorted((tuple(key), len(group)) for key, group in calls)
    assert keys == sorted([((Program.H2D_MANY, 0, H2D_GROUP), H2D_GROUP), ((Program.H2D, 1, 0), 1),
                           ((Program.H2D_MANY, 2, 2), 2), ((Program.H2D, 8, 2), 1), ((Program.H2D, 2, 0), 1),
                           ((Program.H2D, 1, 0, 1), 1), ((Program.H2D_MANY, 2, 2, 1), 2)])   # copies: on the device
    for key, group in calls:
        if key[0] is Program.H2D_MANY:
            assert all(p.rows == 1 << key[1] == p.block[0].shape[0] and p.copied == (key[3:] == (1,))
                       for p in group)
