"""Where a transfer program's page index puts each allocator's pages, and each piece's.

A program that unpacks several runs of rows (a plan's allocators, a chunk's pieces) takes
their page indices joined in one int32 argument, one copy to the device for all of them,
and hands each kernel call its slice. XLA turns a slice of 256 bytes or more into a
dynamic-slice fusion that passes the kernel a pointer into the argument, and a Mosaic GPU
kernel refuses an input that is not 256-byte aligned. So every slice starts at a multiple
of `INDEX_ALIGN` int32s; the gaps hold PAD.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from pallas_kernels import PAD

INDEX_ALIGN = 64     # int32s: 256 bytes


def aligned_offsets(sizes: list[int]) -> list[int]:
    """Where each of `sizes` indices starts when they are joined one after another, each at
    a multiple of `INDEX_ALIGN`."""
    return list(itertools.accumulate((n + -n % INDEX_ALIGN for n in sizes[:-1]), initial=0))


def aligned_size(sizes: list[int]) -> int:
    """The length of `sizes` indices joined by `aligned_join`."""
    return aligned_offsets(sizes)[-1] + sizes[-1]


def aligned_join(indices: list[np.ndarray]) -> np.ndarray:
    """`indices` joined, each from its `aligned_offsets` place."""
    gaps = [np.full(-i.size % INDEX_ALIGN, PAD, np.int32) for i in indices[:-1]]
    return np.concatenate([part for i, gap in zip(indices, gaps) for part in (i, gap)] + [indices[-1]])


def plan_index(indices: list[np.ndarray], one_page: Callable) -> tuple:
    """A plan program's index argument from each allocator's page index (plan order): every
    one-page allocator's own `one_page(index)` (a kept device array: `ResidentIndices`), then
    the other allocators' indices joined (`aligned_join`)."""
    rest = [i for i in indices if i.shape != (1,)]
    ones = tuple(one_page(i) for i in indices if i.shape == (1,))
    return ones + (aligned_join(rest),) if rest else ones


def split_plan_index(sizes: list[int], idx: tuple) -> list:
    """Each allocator's page index (`sizes[k]` pages) from a `plan_index` argument."""
    ones = iter(idx)                 # the one-page allocators' own arrays come first, in order
    rest = [n for n in sizes if n != 1]
    starts = iter(aligned_offsets(rest) if rest else ())
    return [next(ones) if n == 1 else idx[-1][(lo := next(starts)):lo + n] for n in sizes]
