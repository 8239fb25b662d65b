"""Split one allocator's page batch into fixed-shape chunks (pure numpy).

A chunk is at most `chunk_pages` plan entries (a power of two, so its staging fits the
device staging cap). Its device pages are padded with PAD up to the next power of two,
S, so the pack/unpack programs come in log2(chunk_pages) + 1 shapes.

Host-side copies must hit exactly the plan's host pages: a DMA that ran past the end of
a run would overwrite pages outside the plan. So each run (clipped to the chunk) is cut
into power-of-two *pieces*, largest first (its binary digits):

    run of 13 pages at staging row 3, host page 40:
        piece 8: staging 3..10  -> host 40..47
        piece 4: staging 11..14 -> host 48..51
        piece 1: staging 15     -> host 52

Pieces of one size form a group; a group's count is padded to a power of two by
repeating its last piece (the same bytes to the same place again: harmless). A host copy
program then has the static shape (piece size, group count), a small set that a steady
workload exhausts quickly.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from pallas_kernels import PAD


@dataclasses.dataclass(frozen=True, eq=False)
class PieceGroup:
    """`len(staging_rows)` copies of `2**log2_rows` contiguous rows each (padded by repeats)."""

    log2_rows: int
    staging_rows: np.ndarray  # i32[T]: first staging row of each piece (relative to the chunk)
    host_rows: np.ndarray     # i32[T]: first host page of each piece
    num_real: int             # pieces before the repeats


@dataclasses.dataclass(frozen=True, eq=False)
class Chunk:
    """One chunk of a page batch: `num_pages` plan entries, padded to `len(device_pages)`."""

    device_pages: np.ndarray  # i32[S]: device page of each staging row, PAD beyond num_pages
    num_pages: int
    groups: tuple[PieceGroup, ...]  # one per piece size present, largest first

    @property
    def padded_pages(self) -> int:
        return int(self.device_pages.shape[0])

    @property
    def whole_run_host_start(self) -> int | None:
        """First host page if the chunk's host side is one run of all its S pages, else None.

        Such chunks move in a single program with one host copy (the common case: host
        pages are handed out in runs, and full chunks of a long run qualify).
        """
        if len(self.groups) == 1 and self.groups[0].num_real == 1 and 1 << self.groups[0].log2_rows == self.padded_pages:
            return int(self.groups[0].host_rows[0])
        return None

    def cut_index(self) -> np.ndarray:
        """`pack_cut`'s index: the device pages, then for each piece size 2**k below S the
        staging row of the chunk's first piece of that size (0 where it has none). The
        other pieces of a size, if any, are sliced from the packed rows one by one."""
        starts = np.zeros(self.padded_pages.bit_length() - 1, np.int32)
        for g in self.groups:
            starts[g.log2_rows] = g.staging_rows[0]
        return np.concatenate([self.device_pages, starts])

    def host_runs(self) -> list[tuple[int, int, int]]:
        """`(staging row, host page, length)` of the chunk's host runs, in staging order:
        its pieces joined again where both sides continue."""
        pieces = sorted((int(g.staging_rows[i]), int(g.host_rows[i]), 1 << g.log2_rows)
                        for g in self.groups for i in range(g.num_real))
        runs: list[tuple[int, int, int]] = []
        for row, host, n in pieces:
            if runs and runs[-1][0] + runs[-1][2] == row and runs[-1][1] + runs[-1][2] == host:
                runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + n)
            else:
                runs.append((row, host, n))
        return runs


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def split(device_pages: np.ndarray, runs: Sequence[tuple[int, int, int]], chunk_pages: int) -> list[Chunk]:
    """Chunks of a batch.

    `device_pages` (i32[n]) lists the batch in plan order; `runs` are its host runs as
    `(offset, host_start, length)`, covering 0..n-1 in order. `chunk_pages` is a power of two.
    """
    if chunk_pages < 1 or chunk_pages & (chunk_pages - 1):
        raise RuntimeError(f"bug: chunk_pages must be a power of two, got {chunk_pages}")
    n = int(device_pages.shape[0])
    if len(runs) == 1 and n <= chunk_pages and n & (n - 1) == 0:  # the common case, without the general walk
        offset, host_start, _ = runs[0]
        group = PieceGroup(n.bit_length() - 1, np.zeros(1, np.int32), np.array([host_start], np.int32), 1)
        return [Chunk(device_pages.astype(np.int32, copy=False), n, (group,))]
    chunks = []
    for start in range(0, n, chunk_pages):
        stop = min(n, start + chunk_pages)
        padded = np.full(next_pow2(stop - start), PAD, np.int32)
        padded[: stop - start] = device_pages[start:stop]
        chunks.append(Chunk(padded, stop - start, _groups(runs, start, stop)))
    return chunks


def _groups(runs: Sequence[tuple[int, int, int]], start: int, stop: int) -> tuple[PieceGroup, ...]:
    pieces: dict[int, list[tuple[int, int]]] = {}
    for offset, host_start, length in runs:
        lo, hi = max(offset, start), min(offset + length, stop)
        if lo >= hi:
            continue
        row, host, left = lo - start, host_start + (lo - offset), hi - lo
        for k in range(left.bit_length() - 1, -1, -1):
            if left >> k & 1:
                pieces.setdefault(k, []).append((row, host))
                row += 1 << k
                host += 1 << k
    groups = []
    for k in sorted(pieces, reverse=True):
        real = pieces[k]
        padded = real + [real[-1]] * (next_pow2(len(real)) - len(real))
        rows = np.array(padded, np.int32).reshape(-1, 2)
        groups.append(PieceGroup(k, rows[:, 0].copy(), rows[:, 1].copy(), len(real)))
    return tuple(groups)
